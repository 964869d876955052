"""The SGLang stand-in itself: the endpoints and faults the generate tests rely on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import STANDIN, StandinProcess

from tests.support.net import http

pytestmark = pytest.mark.processes


def post(url: str, body: dict) -> dict:
    """The JSON answer to a POST that must succeed (HTTP 200)."""
    return http(url, body=body, timeout=10).expect(200).json()


@pytest.fixture(scope="module")
def server():
    with StandinProcess(["--max-natural-tokens", "40", "--context-length", "200"], model="m") as s:
        yield s


def test_chat_is_deterministic_and_counts_tokens(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100}
    a = post(server.url + "/v1/chat/completions", body)
    b = post(server.url + "/v1/chat/completions", body)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    # one id per word, then the stop token the model sampled (counted, as SGLang counts it)
    assert a["usage"]["completion_tokens"] == len(a["choices"][0]["message"]["content"].split()) + 1
    assert a["choices"][0]["finish_reason"] == "stop"
    assert "prompt_token_ids" not in a["choices"][0] and "sglext" not in a  # only when asked for
    short = post(server.url + "/v1/chat/completions", dict(body, max_tokens=3))
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3


def test_native_generate_models_health_metrics(server):
    gen = post(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert gen["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    # input_ids in, output_ids out (tokenizer_manager.py's out_dict: text, output_ids, meta_info)
    gen = post(server.url + "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 50}})
    assert gen["meta_info"]["prompt_tokens"] == 3 and len(gen["output_ids"]) == gen["meta_info"]["completion_tokens"]
    assert http(server.url + "/v1/models", timeout=5).expect(200).json()["data"][0]["id"] == "m"
    for path in ("/health", "/health_generate"):
        assert http(server.url + path, timeout=5).status == 200
    assert server.metrics()["sglang:num_requests_total"] >= 1


def test_wrong_model_is_served_and_too_long_prompts_are_400(server):
    # SGLang does not check a chat request's model name (serving_base.py); it echoes it back
    wrong_model = {"model": "x", "messages": [{"role": "user", "content": "a"}]}
    assert http(server.url + "/v1/chat/completions", body=wrong_model, timeout=10).expect(200).json()["model"] == "x"
    too_long = {"messages": [{"role": "user", "content": "word " * 400}]}
    assert http(server.url + "/v1/chat/completions", body=too_long, timeout=10).status == 400


def test_not_ready_period_answers_503():
    with StandinProcess(["--not-ready-for", "60"], model="m") as s:
        assert http(s.url + "/health_generate", timeout=5).status == 503


def test_refuses_to_listen_beyond_loopback():
    done = subprocess.run([sys.executable, STANDIN, "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2 and "loopback only" in done.stderr


def test_token_ids_only_when_asked_and_where_sglang_puts_them(server):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100}
    prompt_only = post(server.url + "/v1/chat/completions", dict(body, return_prompt_token_ids=True))["choices"][0]
    assert len(prompt_only["prompt_token_ids"]) > 0 and "response_token_ids" not in prompt_only
    both = post(server.url + "/v1/chat/completions", dict(body, return_token_ids=True))
    assert both["choices"][0]["prompt_token_ids"] == prompt_only["prompt_token_ids"]
    assert len(both["choices"][0]["response_token_ids"]) == both["usage"]["completion_tokens"]
    streamed = dict(body, return_token_ids=True, stream=True)  # serving_chat.py: not with streaming
    assert http(server.url + "/v1/chat/completions", body=streamed, timeout=10).status == 400
    with StandinProcess(["--return-input-ids", "--return-output-ids"], model="m") as s:
        ext = post(s.url + "/v1/chat/completions", body)  # the server flags: sglext on every response
    assert "prompt_token_ids" not in ext["choices"][0]
    assert ext["sglext"]["input_ids"] == prompt_only["prompt_token_ids"]
    assert len(ext["sglext"]["output_ids"][0]) == ext["usage"]["completion_tokens"]
