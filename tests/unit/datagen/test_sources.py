"""Each adapter on rows in the real Hugging Face schema, including malformed ones."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from datagen.adapters import ADAPTERS, Adapter, adapters_of
from datagen.adapters.infinity_instruct import infinity_category
from datagen.config import SourceSpec
from datagen.prompts import Unusable, normalise_tools
from datagen.sources import adapt, iter_file
from tests.support import datagen_rows as fx
from tests.support.paths import DATAGEN_FILES

ADAPTER_DIR = DATAGEN_FILES / "datagen" / "adapters"


def spec(adapter, **kw):
    return SourceSpec(name=adapter, adapter=adapter, **kw)


def reason(adapter, row, **kw):
    with pytest.raises(Unusable) as e:
        adapt(spec(adapter, **kw), row)
    return e.value.reason


def test_infinity_english_prompt_drops_final_answer_and_categorises():
    msgs, tools, cat = adapt(spec("infinity_instruct"), fx.infinity_row(1, cate=("programming and software development",)))
    assert msgs == [{"role": "user", "content": "Explain idea number 1 in plain words."}]
    assert tools is None and cat == "coding"
    assert infinity_category({"cate_ability_en": ["mathematical ability"]}) == "math"
    assert infinity_category({"cate_ability_en": ["literary creation and artistic knowledge"]}) == "general"


def test_infinity_language_filter_and_malformed():
    assert reason("infinity_instruct", fx.infinity_row(1, lang="zh-cn")) == "language_filtered"
    row = fx.infinity_row(2)
    del row["langdetect"]
    assert reason("infinity_instruct", row) == "language_unknown"
    row = fx.infinity_row(3)
    row["conversations"] = [{"from": "alien", "value": "x"}]
    assert reason("infinity_instruct", row) == "unknown_role"
    row = fx.infinity_row(4)
    row["conversations"] = [{"from": "gpt", "value": "only an answer"}]
    assert reason("infinity_instruct", row) == "no_user_turn"
    # zh-cn kept when asked for
    msgs, _tools, _cat = adapt(spec("infinity_instruct", languages=["zh"]), fx.infinity_row(5, lang="zh-cn"))
    assert msgs[0]["role"] == "user"


def test_infinity_multi_turn_keeps_history():
    row = fx.infinity_row(1)
    row["conversations"] = [
        {"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
        {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"},
    ]
    msgs, _tools, _cat = adapt(spec("infinity_instruct"), row)
    assert [m["content"] for m in msgs] == ["a", "b", "c"]


@pytest.mark.parametrize("adapter,row,field,cat", [
    ("webinstruct", fx.webinstruct_row(1), "question", "science"),
    ("codefeedback", fx.codefeedback_row(1), "query", "coding"),
    ("metamath", fx.metamath_row(1), "query", "math"),
])
def test_single_turn_sources(adapter, row, field, cat):
    msgs, tools, got = adapt(spec(adapter), row)
    assert msgs == [{"role": "user", "content": row[field]}] and tools is None and got == cat
    bad = dict(row)
    del bad[field]
    assert reason(adapter, bad) == f"missing_{field}"
    assert reason(adapter, dict(row, **{field: "   "})) == "empty_prompt"
    assert reason(adapter, dict(row, **{field: 42})) == f"malformed_{field}"


def test_category_override():
    _msgs, _tools, cat = adapt(spec("webinstruct", category="math"), fx.webinstruct_row(1))
    assert cat == "math"


def test_hermes_tools_from_system_block_and_tool_turns_survive():
    msgs, tools, cat = adapt(spec("hermes_fc"), fx.hermes_row(1))
    assert cat == "tool_use"
    assert [t["function"]["name"] for t in tools] == ["get_weather"]
    assert tools[0]["function"]["parameters"]["required"] == ["city"]
    # boilerplate system turn dropped (the target's template renders tools itself); history kept
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    call = msgs[1]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "C1"}
    assert msgs[2]["tool_call_id"] == call["id"]
    assert json.loads(msgs[2]["content"]) == {"name": "get_weather", "content": {"temp": 1}}  # wrapper stripped


def test_hermes_tools_json_string_column_wins():
    msgs, tools, _cat = adapt(spec("hermes_fc"), fx.hermes_row(2, with_tools_column=True, multi_turn=False))
    assert tools[0]["function"]["description"] == "W"
    assert msgs == [{"role": "user", "content": "What is the weather in city 2?"}]


def test_hermes_malformed():
    assert reason("hermes_fc", dict(fx.hermes_row(1), tools="[{not json")) == "malformed_tools"
    assert reason("hermes_fc", dict(fx.hermes_row(1), conversations="{oops")) == "malformed_json"
    assert reason("hermes_fc", {"id": "x"}) == "missing_conversation"
    with pytest.raises(Unusable):
        normalise_tools([{"description": "no name"}])


def test_orca_agentinstruct_messages_json_string():
    msgs, tools, cat = adapt(spec("orca_agentinstruct"), fx.orca_row(1))
    assert msgs == [{"role": "user", "content": "Plan the steps to rename file 1 in a repository."}]
    assert cat == "agent"
    assert reason("orca_agentinstruct", {"messages": "[{'role': broken"}) == "malformed_json"
    assert reason("orca_agentinstruct", {"nothing": 1}) == "missing_messages"


def test_agentinstruct_trajectory_keeps_observations():
    msgs, _tools, cat = adapt(spec("agentinstruct"), fx.agentinstruct_row(3))
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[-1]["content"].startswith("The output of the OS")
    assert cat == "agent"


def test_generic_adapters_need_category():
    assert ADAPTERS["sharegpt"].needs_category and ADAPTERS["messages"].needs_category
    assert reason("sharegpt", {"conversations": [{"from": "human", "value": "hi"}]}) == "no_category"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    msgs, _tools, cat = adapt(spec("messages", category="general"), row)
    assert msgs == [{"role": "user", "content": "hi"}] and cat == "general"


def test_non_dict_record():
    assert reason("metamath", ["not", "a", "dict"]) == "malformed_record"


def test_readers_jsonl_parquet_json_array(tmp_path):
    rows = [fx.metamath_row(i) for i in range(3)]
    j = fx.write_jsonl(tmp_path / "a.jsonl", rows, raw_lines=["{broken"])
    assert list(iter_file(j)) == rows + [None]
    p = fx.write_parquet(tmp_path / "a.parquet", rows)
    assert list(iter_file(p)) == rows
    a = tmp_path / "a.json"
    a.write_text(json.dumps(rows))
    assert list(iter_file(str(a))) == rows


def test_json_array_streams_across_chunk_boundaries():
    import io

    from datagen.sources import iter_json_array
    from datagen.util import DatagenError

    rows = [fx.metamath_row(i) for i in range(50)] + [{"n": 12345}]
    text = " [\n" + ",\n  ".join(json.dumps(r) for r in rows) + "\n] \n"
    for chunk in (1, 7, 64, 1 << 20):
        assert list(iter_json_array(io.StringIO(text), "x", chunk=chunk)) == rows
    with pytest.raises(DatagenError, match="not valid JSON"):
        list(iter_json_array(io.StringIO(text[:-10]), "x", chunk=16))


def test_messages_adapter_keeps_tool_links():
    row = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "{\"t\": 1}"},
        {"role": "assistant", "content": "1 degree"}],
        "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}])}
    msgs, tools, _cat = adapt(spec("messages", category="tool_use"), row)
    assert msgs[1]["tool_calls"][0]["id"] == "c1" and msgs[1]["content"] == ""
    assert msgs[2] == {"role": "tool", "content": "{\"t\": 1}", "tool_call_id": "c1", "name": "get_weather"}
    assert tools == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_every_adapter_file_is_an_adapter_of_its_name():
    modules = sorted(p.stem for p in ADAPTER_DIR.glob("*.py") if not p.name.startswith("_"))
    assert list(ADAPTERS) == modules
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter.needs_category or adapter.hub_repo, f"{name}: a dataset adapter names its Hub repo"


def _module(name, **attrs):
    module = ModuleType(f"datagen.adapters.{name}")
    module.__dict__.update(attrs)
    return module


def test_a_misnamed_or_missing_adapter_stops_the_import():
    with pytest.raises(ImportError, match=r"ADAPTER is named 'alpacca'.*\('alpaca'\)"):
        adapters_of([_module("alpaca", ADAPTER=Adapter("alpacca", ADAPTERS["sharegpt"].fn, None))])
    with pytest.raises(ImportError, match="datagen.adapters.alpaca must define ADAPTER"):
        adapters_of([_module("alpaca")])
    assert adapters_of([_module("sharegpt", ADAPTER=ADAPTERS["sharegpt"])]) == {"sharegpt": ADAPTERS["sharegpt"]}
