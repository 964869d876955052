"""What reaches a worker through the real sglang-router 0.3.2: the router re-serialises every chat request
from its own typed struct, so generate sends the form it passes through unchanged (``canonical_request``),
and the workers' response-level token ids come back through it."""

from __future__ import annotations

import json

import pytest
from harness import RouterProcess, StandinProcess

from datagen.sglang_chat import TOKEN_ID_FLAGS, canonical_request, token_ids_from_response
from tests.support.net import HttpReply, http

pytestmark = pytest.mark.processes

pytest.importorskip("sglang_router", reason="the real sglang-router (requirements.txt) is not installed")


MESSAGES = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Weather in C4?", "name": "bob"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "index": 0, "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"C4\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "4 degrees"},
]
TOOLS = [
    {"type": "function", "function": {"parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                                      "description": "Weather now.", "name": "get_weather", "x-extra": 1},
     "defer_loading": True},
    {"type": "function", "function": {"name": "get_time"}},  # no parameters: the router answers 400
    {"type": "function", "function": {"name": "ping", "strict": True, "parameters": {"type": "object"}}},
]


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """A stand-in worker recording what it receives, behind the real router (both on loopback)."""
    record = str(tmp_path_factory.mktemp("route") / "requests.jsonl")
    with StandinProcess(["--record-requests", record, "--return-input-ids", "--return-output-ids"],
                        model="m") as worker, RouterProcess([worker.url]) as router:
        yield router.url, record


def _chat(url, messages, tools) -> HttpReply:
    body = dict({"model": "m", "messages": messages, "tools": tools, "max_tokens": 16}, **TOKEN_ID_FLAGS)
    return http(url + "/v1/chat/completions", body=body, timeout=30)


def _last_received(record):
    with open(record, encoding="utf-8") as fh:
        return json.loads(fh.readlines()[-1])


def test_the_canonical_request_reaches_the_worker_unchanged(routed):
    url, record = routed
    messages, tools = canonical_request(MESSAGES, TOOLS)
    answer = _chat(url, messages, tools).expect(200).json()
    got = _last_received(record)
    assert got["tools"] == tools
    # the router leaves out a null content (SGLang reads it as "" either way): the rest is as sent
    assert [{k: v for k, v in m.items() if v is not None} for m in got["messages"]] == \
        [{k: v for k, v in m.items() if v is not None} for m in messages]
    assert json.dumps(got["tools"]) == json.dumps(tools)  # key order too: templates tojson the tools
    # the request's token-id flags do not get through, the workers' sglext does
    assert "return_token_ids" not in got and "return_prompt_token_ids" not in got
    assert "prompt_token_ids" not in answer["choices"][0]
    ids = token_ids_from_response(answer)
    assert ids is not None and len(ids[0]) == answer["usage"]["prompt_tokens"]


def test_the_raw_request_is_refused_or_rewritten_by_the_router(routed):
    """Why canonical_request exists: what the router does to the rows as the sources give them."""
    url, record = routed
    refused = _chat(url, MESSAGES, TOOLS)
    assert refused.status == 400 and "parameters" in refused.text
    tools = [TOOLS[0], TOOLS[2]]
    _chat(url, MESSAGES, tools).expect(200)
    got = _last_received(record)
    assert list(got["tools"][0]["function"]) == ["name", "description", "parameters"]  # reordered, x-extra gone
    assert "defer_loading" not in got["tools"][0]
    assert "name" not in got["messages"][3] and "index" not in got["messages"][2]["tool_calls"][0]
