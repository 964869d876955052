"""SGLang's chat request handling, as datagen and the stand-in read it, against fixtures recorded from
sglang 0.5.23's own classes (fixtures/record_sglang_chat.py: protocol.py and serving_chat.py)."""

from __future__ import annotations

import json

import pytest
from standin import sglang_template_inputs

from datagen.sglang_chat import TOKEN_ID_FLAGS, template_inputs, token_ids_from_response
from tests.support.paths import DATAGEN_FIXTURES

SGLANG = json.loads((DATAGEN_FIXTURES / "sglang_chat.json").read_text(encoding="utf-8"))
CASES = sorted(SGLANG["template_inputs"])


def test_the_fixture_is_from_the_pinned_sglang():
    assert SGLANG["upstream"].startswith("sglang 0.5.23:")
    assert set(CASES) == {"plain", "tools_auto", "tools_none", "tools_named"}
    # the request fields exist in sglang's ChatCompletionRequest (off by default): the names datagen sends
    assert set(SGLANG["request_flags"]) == set(TOKEN_ID_FLAGS) and not any(SGLANG["request_flags"].values())


@pytest.mark.parametrize("case", CASES)
def test_datagen_renders_what_sglang_hands_the_template(case):
    req = SGLANG["template_inputs"][case]["request"]
    messages, tools = template_inputs(req["messages"], req.get("tools"), req.get("tool_choice", "auto"))
    # key order too: templates that `tojson` a tool or a tool call render keys in dict order
    assert json.dumps({"messages": messages, "tools": tools}) == json.dumps(SGLANG["template_inputs"][case]["expected"])


@pytest.mark.parametrize("case", CASES)
def test_the_standin_renders_what_sglang_hands_the_template(case):
    req = SGLANG["template_inputs"][case]["request"]
    messages, tools = sglang_template_inputs(req)
    assert json.dumps({"messages": messages, "tools": tools}) == json.dumps(SGLANG["template_inputs"][case]["expected"])


def test_the_normalisation_does_not_touch_the_callers_rows():
    req = SGLANG["template_inputs"]["tools_auto"]["request"]
    before = json.dumps(req)
    template_inputs(req["messages"], req["tools"])
    sglang_template_inputs(req)
    assert json.dumps(req) == before


def test_tool_call_arguments_that_are_not_an_object_are_sglangs_400():
    bad = [{"role": "user", "content": "q"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]},
           {"role": "tool", "tool_call_id": "c", "content": "r"}]
    with pytest.raises(ValueError, match="JSON object"):
        template_inputs(bad, None)
    bad[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(ValueError, match="valid JSON"):
        template_inputs(bad, None)


@pytest.mark.parametrize("name,want", [("choice_ids", ([11, 12, 13], [21, 22])),
                                       ("sglext_ids", ([11, 12, 13], [21, 7])), ("no_ids", None)])
def test_token_ids_are_read_where_sglang_puts_them(name, want):
    assert token_ids_from_response(SGLANG["responses"][name]) == want


def test_malformed_ids_are_not_ids():
    body = json.loads(json.dumps(SGLANG["responses"]["choice_ids"]))
    body["choices"][0]["prompt_token_ids"] = [1, "2"]
    assert token_ids_from_response(body) is None
    body["choices"][0]["prompt_token_ids"] = []
    assert token_ids_from_response(body) is None
