"""The stand-in as sglang-router (forwarding to real stand-in workers) and with a real tokenizer;
the lab's committed tokenizer is what the shared builder writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lab", "sglang_standin"))
from harness import STANDIN, StandinProcess  # noqa: E402

BUILDER = os.path.join(ROOT, "tests", "lab", "tokenizer", "build_tokenizer.py")
LAB_TOKENIZER = os.path.join(ROOT, "tests", "lab", "tokenizer", "lab-tokenizer")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return resp.status, json.loads(resp.read())


def get_status(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def chat(url, text, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 32, **extra}
    return post(url + "/v1/chat/completions", body)[1]


def routed(router, n):
    """Requests each worker got through the router, from the router's /metrics."""
    text = get_status(router.url + "/metrics")[1]
    return [int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
            if line.startswith("sgl_router_processed_requests_total{")][:n]


@pytest.fixture(scope="module")
def workers():
    ws = [StandinProcess(["--latency", "0.05"], model="m").start() for _n in range(3)]
    yield ws
    for w in ws:
        w.stop()


def test_round_robin_router_forwards_to_every_worker_in_turn(workers):
    before = [w.metrics()["sglang:num_requests_total"] for w in workers]
    with StandinProcess(["--worker-urls", *[w.url for w in workers], "--policy", "round_robin"], model="m") as r:
        answers = [chat(r.url, f"question {i}") for i in range(9)]
        assert routed(r, 3) == [3, 3, 3]
        # the answer is the worker's own (same text as asking a worker directly), not the router's
        assert answers[4]["choices"][0]["message"]["content"] == \
            chat(workers[0].url, "question 4")["choices"][0]["message"]["content"]
        models = json.loads(get_status(r.url + "/v1/models")[1])
        assert [m["id"] for m in models["data"]] == ["m"]
        assert get_status(r.url + "/health_generate")[0] == 200
    after = [w.metrics()["sglang:num_requests_total"] for w in workers]
    assert [a - b for a, b in zip(after, before)] == [4, 3, 3]  # +1: the direct question to worker 0


def test_least_loaded_router_spreads_concurrent_requests(workers):
    with StandinProcess(["--worker-urls", *[w.url for w in workers], "--policy", "cache_aware"], model="m") as r:
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda i: chat(r.url, f"parallel {i}"), range(24)))
        assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in answers)
        counts = routed(r, 3)
        assert sum(counts) == 24 and min(counts) >= 4, counts


def test_router_skips_a_dead_worker_and_reports_it_unready(workers):
    with StandinProcess([], model="m") as dead:
        dead_url = dead.url
    with StandinProcess(["--worker-urls", workers[0].url, dead_url, "--policy", "round_robin"], model="m") as r:
        status, text = get_status(r.url + "/health_generate")
        assert status == 503 and dead_url in text
        # connection refused on the dead worker (every 2nd pick after the first): retried on the live one
        assert all(chat(r.url, f"retry {i}")["object"] == "chat.completion" for i in range(4))
        metrics = get_status(r.url + "/metrics")[1]
        assert f'sgl_router_worker_errors_total{{worker="{dead_url}"}} 3' in metrics, metrics


def test_router_refuses_non_loopback_workers():
    done = subprocess.run([sys.executable, STANDIN, "--worker-urls", "http://pve1.example.internal:31000"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--worker-urls" in done.stderr and "loopback" in done.stderr


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
        got = post(s.url + "/v1/chat/completions", {"model": "m", "messages": messages, "tools": TOOLS,
                                                    "chat_template_kwargs": kwargs, "max_tokens": 200,
                                                    "return_token_ids": True})[1]
        assert got["usage"]["prompt_tokens"] == want
        choice = got["choices"][0]
        assert choice["prompt_token_ids"] == ids
        # the answer's ids are the raw Hermes markup the parser turned into tool_calls, and the stop token
        out = choice["response_token_ids"]
        assert len(out) == got["usage"]["completion_tokens"] and out[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        assert tok.decode(out) == choice["message"]["content"] + "<|im_end|>"  # the final answer after the tool
        # before the tool result: a tool call, whose ids are the raw Hermes markup the parser turned into tool_calls
        choice = post(s.url + "/v1/chat/completions", {"model": "m", "messages": messages[:2], "tools": TOOLS,
                                                       "max_tokens": 200, "return_token_ids": True})[1]["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert tok.decode(choice["response_token_ids"]) == (
            "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": json.loads(call["arguments"])})
            + "\n</tool_call><|im_end|>")
        assert choice["message"]["content"] == "" and choice["finish_reason"] == "tool_calls"
        assert s.metrics()["standin_tokenizer_info"] == 1
    with StandinProcess([], model="m") as s:  # without: the chars/4 estimate, which differs here
        plain = post(s.url + "/v1/chat/completions", {"model": "m", "messages": messages, "tools": TOOLS,
                                                      "max_tokens": 16})[1]
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
