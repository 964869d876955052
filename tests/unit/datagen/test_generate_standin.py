"""The SGLang stand-in itself: the endpoints and faults the generate tests rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from harness import STANDIN, StandinProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


@pytest.fixture(scope="module")
def server():
    with StandinProcess(["--max-natural-tokens", "40", "--context-length", "200"], model="m") as s:
        yield s


def test_chat_is_deterministic_and_counts_tokens(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100}
    a = post(server.url + "/v1/chat/completions", body)[1]
    b = post(server.url + "/v1/chat/completions", body)[1]
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    # one id per word, then the stop token the model sampled (counted, as SGLang counts it)
    assert a["usage"]["completion_tokens"] == len(a["choices"][0]["message"]["content"].split()) + 1
    assert a["choices"][0]["finish_reason"] == "stop"
    assert "prompt_token_ids" not in a["choices"][0] and "sglext" not in a  # only when asked for
    short = post(server.url + "/v1/chat/completions", dict(body, max_tokens=3))[1]
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3


def test_native_generate_models_health_metrics(server):
    gen = post(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})[1]
    assert gen["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    # input_ids in, output_ids out (tokenizer_manager.py's out_dict: text, output_ids, meta_info)
    gen = post(server.url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 50}})[1]
    assert gen["meta_info"]["prompt_tokens"] == 3 and len(gen["output_ids"]) == gen["meta_info"]["completion_tokens"]
    with urllib.request.urlopen(server.url + "/v1/models", timeout=5) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "m"
    for path in ("/health", "/health_generate"):
        with urllib.request.urlopen(server.url + path, timeout=5) as resp:
            assert resp.status == 200
    assert server.metrics()["sglang:num_requests_total"] >= 1


def test_wrong_model_and_too_long_prompts_are_4xx(server):
    with pytest.raises(urllib.error.HTTPError) as err:
        post(server.url + "/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "a"}]})
    assert err.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        post(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]})
    assert err.value.code == 400


def test_not_ready_period_answers_503():
    with StandinProcess(["--not-ready-for", "60"], model="m") as s:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(s.url + "/health_generate", timeout=5)
        assert err.value.code == 503


def test_refuses_to_listen_beyond_loopback():
    done = subprocess.run([sys.executable, STANDIN, "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2 and "loopback only" in done.stderr


def test_token_ids_only_when_asked_and_where_sglang_puts_them(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100}
    prompt_only = post(server.url + "/v1/chat/completions", dict(body, return_prompt_token_ids=True))[1]["choices"][0]
    assert len(prompt_only["prompt_token_ids"]) > 0 and "response_token_ids" not in prompt_only
    both = post(server.url + "/v1/chat/completions", dict(body, return_token_ids=True))[1]
    assert both["choices"][0]["prompt_token_ids"] == prompt_only["prompt_token_ids"]
    assert len(both["choices"][0]["response_token_ids"]) == both["usage"]["completion_tokens"]
    with pytest.raises(urllib.error.HTTPError) as err:  # serving_chat.py: not with streaming
        post(server.url + "/v1/chat/completions", dict(body, return_token_ids=True, stream=True))
    assert err.value.code == 400
    with StandinProcess(["--return-input-ids", "--return-output-ids"], model="m") as s:
        ext = post(s.url + "/v1/chat/completions", body)[1]  # the server flags: sglext on every response
    assert "prompt_token_ids" not in ext["choices"][0]
    assert ext["sglext"]["input_ids"] == prompt_only["prompt_token_ids"]
    assert len(ext["sglext"]["output_ids"][0]) == ext["usage"]["completion_tokens"]
