"""The stand-in workers behind the REAL sglang-router (the pinned wheel), their SGLang endpoints, and a real
tokenizer; the lab's committed tokenizer is what the shared builder writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from harness import STANDIN, RouterProcess, StandinProcess

from tests.support.net import http
from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

BUILDER = os.path.join(ROOT, "tests", "lab", "tokenizer", "build_tokenizer.py")
LAB_TOKENIZER = os.path.join(ROOT, "tests", "lab", "tokenizer", "lab-tokenizer")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def chat(url, text, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 32, **extra}
    return http(url + "/v1/chat/completions", body=body).expect(200).json()


def worker_requests(workers):
    return [w.metrics()["sglang:num_requests_total"] for w in workers]


@pytest.fixture(scope="module")
def workers():
    ws = [StandinProcess(["--latency", "0.05"], model="m").start() for _n in range(3)]
    yield ws
    for w in ws:
        w.stop()


def test_real_router_round_robin_forwards_to_every_worker_in_turn(workers):
    before = worker_requests(workers)
    with RouterProcess([w.url for w in workers], policy="round_robin") as r:
        # sglang-router reads the model id from each worker's /model_info (SGLang's http_server.py)
        status, text = http(r.url + "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(text)["data"]] == ["m"], text
        answers = [chat(r.url, f"question {i}") for i in range(9)]
        # the answer is the worker's own (same text as asking the worker directly), not the router's
        assert answers[0]["choices"][0]["message"]["content"] == \
            chat(workers[0].url, "question 0")["choices"][0]["message"]["content"]
    after = worker_requests(workers)
    deltas = [a - b for a, b in zip(after, before)]
    assert sum(deltas) == 10 and sorted(deltas) == [3, 3, 4], deltas  # +1: the direct question to worker 0


def test_real_router_health_generate_is_200_with_one_worker_of_two(tmp_path, workers):
    # why the role's gate cannot use the router's /health_generate (sglang-router 0.3.2): it is 200 as soon as
    # one worker is registered, and a worker not healthy within --worker-startup-timeout-secs is dropped
    hold = tmp_path / "hold"
    hold.write_text("")
    with StandinProcess(["--not-ready-while", str(hold)], model="m") as held:
        assert http(held.url + "/health_generate")[0] == 503
        with RouterProcess([workers[0].url, held.url], expect=1,
                           args=["--worker-startup-timeout-secs", "2"]) as r:
            status, text = http(r.url + "/health_generate")
            assert status == 200, text
            time.sleep(3)  # past the router's startup timeout
            hold.unlink()
            assert http(held.url + "/health_generate")[0] == 200
            time.sleep(3)  # the late worker is ready now, and never registered
            assert list(r.workers()) == [workers[0].url]


def test_real_router_drops_fields_it_does_not_know_and_keeps_seed(tmp_path):
    record = tmp_path / "requests.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "seed": 7,
            "temperature": 0.5, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True, "return_prompt_token_ids": True, "rid": "row-1", "frobnicate": 1}
    with StandinProcess(["--record-requests", str(record)], model="m") as w, RouterProcess([w.url]) as r:
        http(r.url + "/v1/chat/completions", body=body).expect(200)
        assert http(r.url + "/v1/chat/completions")[0] in (404, 405)  # GET: not a route
    got = json.loads(record.read_text().splitlines()[0])
    assert {"return_token_ids", "return_prompt_token_ids", "rid", "frobnicate", "max_tokens"} <= set(body) - set(got)
    assert (got["seed"], got["max_completion_tokens"], got["top_k"]) == (7, 8, 5)
    assert got["chat_template_kwargs"] == {"enable_thinking": False}


def test_real_router_metrics_listen_on_the_configured_host_only(workers):
    psutil = pytest.importorskip("psutil")
    with RouterProcess([workers[0].url]) as r:
        ports = {c.laddr for c in psutil.Process(r.proc.pid).net_connections("inet") if c.status == "LISTEN"}
        assert ports == {("127.0.0.1", r.port), ("127.0.0.1", r.metrics_port)}, ports
        status, text = http(r.metrics_url)
        assert status == 200 and 'smg_worker_health{worker="' + workers[0].url + '"} 1' in text


def test_standin_worker_follows_sglangs_startup_and_model_endpoints(tmp_path):
    hold = tmp_path / "hold-{port}"
    with StandinProcess(["--not-ready-while", str(hold), "--tool-call-parser", "qwen"], model="m") as w:
        held = tmp_path / f"hold-{w.port}"
        held.write_text("")
        # SGLang while starting: /health and /health_generate 503, /v1/models and /model_info already answer
        assert http(w.url + "/health")[0] == 503
        assert http(w.url + "/health_generate")[0] == 503
        assert http(w.url + "/v1/models")[0] == 200
        info = json.loads(http(w.url + "/get_model_info")[1])
        assert (info["served_model_name"], info["is_generation"], info["tool_call_parser"]) == ("m", True, "qwen")
        assert http(w.url + "/v1/models/other")[0] == 404
        held.unlink()
        assert http(w.url + "/health")[0] == 200
        assert http(w.url + "/health_generate")[0] == 200


def test_standin_ignores_the_seed_unless_deterministic_inference_is_on():
    def answer(url, seed):
        return chat(url, "same question", seed=seed, temperature=1.0)["choices"][0]["message"]["content"]

    with StandinProcess([], model="m") as plain:
        assert answer(plain.url, 1) == answer(plain.url, 2) == answer(plain.url, None)
    with StandinProcess(["--enable-deterministic-inference"], model="m") as det:
        assert answer(det.url, 1) != answer(det.url, 2)
        assert answer(det.url, 1) == answer(det.url, 1)


def test_router_passes_exactly_the_chat_fields_the_role_allows_in_extra_body(tmp_path):
    # the role refuses extra_body keys outside vars/main.yml's list; measure the list against the real router:
    # every listed field reaches the worker, and the fields it drops do not
    import yaml

    allowed = yaml.safe_load(open(os.path.join(ROOT, "roles", "sglang_datagen", "vars", "main.yml")))[
        "sglang_datagen__router_chat_fields"]
    values = {"logit_bias": {"1": 0.5}, "response_format": {"type": "text"}, "stop_token_ids": [1],
              "reasoning_effort": "low", "chat_template_kwargs": {}, "session_params": {}, "stop": "x",
              "ebnf": "x", "regex": "x", "lora_path": "x"}
    bools = {"continue_final_message", "ignore_eos", "logprobs", "no_stop_trim", "parallel_tool_calls",
             "return_hidden_states", "separate_reasoning", "skip_special_tokens", "stream_reasoning"}
    dropped = ["return_token_ids", "return_prompt_token_ids", "rid", "user", "input_ids", "custom_params"]
    record = tmp_path / "requests.jsonl"
    with StandinProcess(["--record-requests", str(record)], model="m") as w, RouterProcess([w.url]) as r:
        for field in allowed + dropped:
            value = values.get(field, True if field in bools or field in dropped[:2] else 1)
            extra = {"logprobs": True} if field == "top_logprobs" else {}
            body = {"model": "m", "messages": [{"role": "user", "content": field}], field: value, **extra}
            http(r.url + "/v1/chat/completions", body=body).expect(200)
    got = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(got) == len(allowed) + len(dropped)
    assert [f for f, g in zip(allowed, got) if f not in g] == []
    assert [f for f, g in zip(dropped, got[len(allowed):]) if f in g] == []


def test_standin_has_no_router_mode_of_its_own():
    done = subprocess.run([sys.executable, STANDIN, "--worker-urls", "http://127.0.0.1:31000"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--worker-urls" in done.stderr and "sglang_router" in done.stderr


def test_prompt_tokens_are_the_tokenizers_count_of_the_rendered_template(tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 degrees"}]
    kwargs = {"enable_thinking": False}
    # what sglang 0.5.23 hands the template (serving_chat.py): the messages' model_dump() with the tool-call
    # arguments parsed, content None as "", and Tool.model_dump() (defer_loading: null)
    none = {"tool_call_id": None, "name": None, "phase": None, "reasoning_content": None, "tool_calls": None,
            "tools": None, "prefix": None}
    sg_messages = [dict(none, role="system", content="You are terse."), messages[1],
                   dict(none, role="assistant", content="", tool_calls=[
                       {"id": "c1", "index": None, "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]),
                   dict(none, role="tool", content="18 degrees", tool_call_id="c1")]
    sg_tools = [{"type": "function", "function": TOOLS[0]["function"], "defer_loading": None}]
    text = tok.apply_chat_template(sg_messages, tools=sg_tools, tokenize=False, add_generation_prompt=True, **kwargs)
    ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    want = len(ids)
    naive = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kwargs)
    assert naive != text  # the normalisation shows in this template: a plain re-render would not match
    with StandinProcess(["--tokenizer", tiny_tokenizer], model="m") as s:
        got = http(s.url + "/v1/chat/completions", body={"model": "m", "messages": messages, "tools": TOOLS,
                                                         "chat_template_kwargs": kwargs, "max_tokens": 200,
                                                         "return_token_ids": True}).expect(200).json()
        assert got["usage"]["prompt_tokens"] == want
        choice = got["choices"][0]
        assert choice["prompt_token_ids"] == ids
        # the answer's ids are the raw Hermes markup the parser turned into tool_calls, and the stop token
        out = choice["response_token_ids"]
        assert len(out) == got["usage"]["completion_tokens"] and out[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        assert tok.decode(out) == choice["message"]["content"] + "<|im_end|>"  # the final answer after the tool
        # before the tool result: a tool call, whose ids are the raw Hermes markup the parser turned into tool_calls
        choice = http(s.url + "/v1/chat/completions", body={"model": "m", "messages": messages[:2], "tools": TOOLS,
                                                            "max_tokens": 200, "return_token_ids": True}
                      ).expect(200).json()["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert tok.decode(choice["response_token_ids"]) == (
            "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": json.loads(call["arguments"])})
            + "\n</tool_call><|im_end|>")
        assert choice["message"]["content"] == "" and choice["finish_reason"] == "tool_calls"
        assert s.metrics()["standin_tokenizer_info"] == 1
    with StandinProcess([], model="m") as s:  # without: the chars/4 estimate, which differs here
        plain = http(s.url + "/v1/chat/completions", body={"model": "m", "messages": messages, "tools": TOOLS,
                                                           "max_tokens": 16}).expect(200).json()
        assert plain["usage"]["prompt_tokens"] != want


def test_unusable_tokenizer_is_a_clear_startup_error(tmp_path):
    done = subprocess.run([sys.executable, STANDIN, "--port", "0", "--tokenizer", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "--tokenizer" in done.stderr and "missing" in done.stderr


def test_committed_lab_tokenizer_is_what_the_builder_writes():
    done = subprocess.run([sys.executable, BUILDER, "--check", LAB_TOKENIZER],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    cfg = json.load(open(os.path.join(LAB_TOKENIZER, "tokenizer_config.json")))
    assert "tool_response" in cfg["chat_template"] and "tools" in cfg["chat_template"]
    assert sorted(os.listdir(LAB_TOKENIZER)) == ["tokenizer.json", "tokenizer_config.json"]
