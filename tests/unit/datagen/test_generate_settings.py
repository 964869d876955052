"""generate: config validation and the pure helpers (backoff, response parsing, row checks)."""

from __future__ import annotations

import json

import pytest

from datagen.config import ConfigError
from datagen.gen.client import backoff_delay, parse_retry_after
from datagen.gen.rows import RowError, check_row, parse_response, prompt_messages
from datagen.gen.settings import DEFAULTS
from datagen.generate import settings_from_config
from tests.support.paths import DATAGEN_FIXTURES

BASE = {"servers": ["http://127.0.0.1:30000"], "model": "m", "sampling": {"max_tokens": 64}}


def cfg(**over):
    raw = json.loads(json.dumps(BASE))
    for key, value in over.items():
        if key == "generate":
            raw["generate"] = value
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("generate, servers, in_flight", [
    ({"concurrency": 16}, ["http://127.0.0.1:30000"], 16),  # fixed: per server
    ({"concurrency": 4}, ["http://127.0.0.1:30000", "http://127.0.0.1:30001"], 8),
    ({"concurrency_max": 100}, ["http://127.0.0.1:30000"], 100),  # auto: concurrency_max, one worker
    ({"concurrency_max": 64, "workers": ["http://127.0.0.1:%d" % p for p in (30001, 30002, 30003)]},
     ["http://127.0.0.1:30000"], 192),  # auto behind a router: concurrency_max per worker
])
def test_max_in_flight_follows_the_concurrency_the_run_uses(generate, servers, in_flight):
    assert settings_from_config(cfg(generate=generate, servers=servers)).max_in_flight == in_flight


def test_defaults_send_thinking_explicitly():
    s = settings_from_config(cfg())
    assert s.servers == ("http://127.0.0.1:30000",)
    assert s.model == "m"
    assert s.template_kwargs() == {"enable_thinking": False}
    assert s.retries == 8
    assert s.sampling == {"max_tokens": 64}


def test_concurrency_is_auto_unless_fixed():
    s = settings_from_config(cfg())
    assert s.adaptive and s.concurrency is None
    auto_keys = ("concurrency_min", "concurrency_max", "queue_target", "load_interval")
    assert {key: getattr(s, key) for key in auto_keys} == {key: DEFAULTS[key] for key in auto_keys}
    assert settings_from_config(cfg(generate={"concurrency": "auto"})).adaptive
    fixed = settings_from_config(cfg(generate={"concurrency": 128}))
    assert not fixed.adaptive and fixed.concurrency == 128
    tuned = settings_from_config(cfg(generate={"concurrency_min": 2, "concurrency_max": 64, "queue_target": 4,
                                               "load_interval": 0.25}))
    assert (tuned.concurrency_min, tuned.concurrency_max, tuned.queue_target, tuned.load_interval) == (2, 64, 4, 0.25)


def test_full_section_and_normalised_servers():
    s = settings_from_config(cfg(
        servers=["http://127.0.0.1:30000/", "http://127.0.0.1:30001/v1"],
        model={"name": "served", "tokenizer": "/x"},
        sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 512, "seed": 7, "max_length": 9},
        generate={"concurrency": 32, "retries": 3, "thinking": True, "chat_template_kwargs": {"reasoning_effort": "low"},
                  "fsync_interval": 0.5, "ready_timeout": 60, "limit": 10},
    ))
    assert s.servers == ("http://127.0.0.1:30000", "http://127.0.0.1:30001")
    assert s.model == "served"
    assert "max_length" not in s.sampling  # tokenize's, not a sampling parameter
    assert s.template_kwargs() == {"reasoning_effort": "low", "enable_thinking": True}
    assert (s.concurrency, s.retries, s.fsync_interval, s.ready_timeout, s.limit) == (32, 3, 0.5, 60.0, 10)


@pytest.mark.parametrize("over, key", [
    ({"servers": None}, "servers"),
    ({"servers": []}, "servers"),
    ({"servers": ["127.0.0.1:30000"]}, "servers[0]"),
    ({"servers": ["http://127.0.0.1:notaport"]}, "servers[0]"),
    ({"servers": ["http://127.0.0.1:1", "http://127.0.0.1:1/"]}, "servers[1]"),
    ({"model": ""}, "model"),
    ({"model": {"tokenizer": "x"}}, "model"),
    ({"sampling": {"temperature": "hot"}}, "sampling.temperature"),
    ({"sampling": {"temprature": 0.7}}, "sampling.temprature"),
    ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
    ({"sampling": {"max_tokens": True}}, "sampling.max_tokens"),
    ({"sampling": {"top_p": 1.5}}, "sampling.top_p"),
    ({"sampling": {"n": 2}}, "sampling.n"),
    ({"generate": {"concurrency": 0}}, "generate.concurrency"),
    ({"generate": {"concurrency": "64"}}, "generate.concurrency"),
    ({"generate": {"concurrency": "automatic"}}, "generate.concurrency"),
    ({"generate": {"concurrency": True}}, "generate.concurrency"),
    ({"generate": {"concurrency_min": 0}}, "generate.concurrency_min"),
    ({"generate": {"concurrency_min": 64, "concurrency_max": 32}}, "generate.concurrency_max"),
    ({"generate": {"queue_target": 0}}, "generate.queue_target"),
    ({"generate": {"load_interval": 0}}, "generate.load_interval"),
    ({"generate": {"retries": -1}}, "generate.retries"),
    ({"generate": {"thinking": "yes"}}, "generate.thinking"),
    ({"generate": {"chat_template_kwargs": {"enable_thinking": True}}}, "generate.chat_template_kwargs.enable_thinking"),
    ({"generate": {"backoff_base": 5, "backoff_max": 1}}, "generate.backoff_max"),
    ({"generate": {"fsync_interval": 0}}, "generate.fsync_interval"),
    ({"generate": {"concurency": 8}}, "generate.concurency"),
    ({"generate": {"extra_body": {"temperature": 1}}}, "generate.extra_body.temperature"),
    ({"generate": {"tool_choice": "always"}}, "generate.tool_choice"),
    ({"generate": "fast"}, "generate"),
])
def test_bad_values_name_the_key(over, key):
    raw = cfg(**over)
    if over.get("servers") is None and "servers" in over:
        del raw["servers"]
    with pytest.raises(ConfigError) as err:
        settings_from_config(raw)
    first = getattr(err.value, "errors", None) or [str(err.value)]
    assert first[0].startswith(key + ":"), first


@pytest.mark.parametrize("attempt, retry_after, expect_max", [(0, None, 0.5), (3, None, 4.0), (10, None, 30.0),
                                                              (0, 100.0, 30.0)])
def test_backoff_is_jittered_exponential_and_capped(attempt, retry_after, expect_max):
    low = backoff_delay(attempt, 0.5, 30.0, retry_after, rand=lambda: 0.0)
    high = backoff_delay(attempt, 0.5, 30.0, retry_after, rand=lambda: 0.999999)
    assert high == pytest.approx(expect_max, rel=1e-3)
    assert low == (min(30.0, retry_after) if retry_after else 0.0)


def test_retry_after_parsing():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-1") is None


def _body(message, finish="stop", usage=None):
    return json.dumps({"choices": [{"message": message, "finish_reason": finish}],
                       "usage": usage or {"prompt_tokens": 3, "completion_tokens": 2}}).encode()


def test_parse_response_keeps_tool_calls_and_reasoning():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msg, finish, usage, ids = parse_response(_body({"role": "assistant", "content": None, "tool_calls": calls,
                                                    "reasoning_content": "hmm"}, "tool_calls"))
    assert msg == {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": "hmm"}
    assert finish == "tool_calls" and usage["completion_tokens"] == 2
    assert ids is None  # no ids in this body: the engine stops the run (see test_generate_run)


SGLANG = json.loads((DATAGEN_FIXTURES / "sglang_chat.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name,want", [("choice_ids", ([11, 12, 13], [21, 22])),
                                       ("sglext_ids", ([11, 12, 13], [21, 7])), ("no_ids", None)])
def test_parse_response_reads_the_token_ids_where_sglang_puts_them(name, want):
    """Bodies serialised by sglang 0.5.23's own ChatCompletionResponse (fixtures/record_sglang_chat.py)."""
    msg, finish, _usage, ids = parse_response(json.dumps(SGLANG["responses"][name]).encode())
    assert ids == want
    if name == "choice_ids":  # a tool call answer: content "" and the arguments still a JSON string
        assert msg["tool_calls"][0]["function"]["arguments"] == '{"city": "C5"}' and finish == "tool_calls"


@pytest.mark.parametrize("raw", [b'{"id":"x","choices":[{"index":0,', b"<html>bad gateway</html>", b'{"choices": []}',
                                 _body({"role": "assistant", "content": "x"}, "abort"),
                                 _body({"role": "assistant", "content": ""}, "stop")])
def test_unusable_responses_are_retried_not_written(raw):
    with pytest.raises(RowError) as err:
        parse_response(raw)
    assert err.value.retry


def test_prompt_messages_regenerates_only_a_trailing_assistant_turn():
    agent = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
             {"role": "tool", "content": "result", "tool_call_id": "1"},
             {"role": "assistant", "content": "old answer"}]
    assert prompt_messages(agent) == agent[:3]  # the tool result stays
    assert prompt_messages(agent[:3]) == agent[:3]


@pytest.mark.parametrize("row, problem", [
    ([], "not a JSON object"), ({"messages": [{"role": "user"}]}, "no string id"),
    ({"id": "a", "messages": []}, "no messages"), ({"id": "a", "messages": ["hi"]}, "with a role"),
    ({"id": "a", "messages": [{"role": "assistant", "content": "x"}]}, "only an assistant"),
    ({"id": "a", "messages": [{"role": "user", "content": "x"}], "tools": "{}"}, "tools is not a list"),
])
def test_bad_rows_are_named(row, problem):
    assert problem in check_row(row)
    assert check_row({"id": "a", "messages": [{"role": "user", "content": "x"}]}) is None


def test_an_empty_generate_section_gives_every_field_its_one_default():
    from dataclasses import MISSING, fields

    from datagen.gen.settings import DEFAULT_MAX_TOKENS, GenerateSettings

    s = settings_from_config({"servers": ["http://127.0.0.1:30000"]})
    for f in fields(GenerateSettings):
        if f.default is not MISSING:
            assert getattr(s, f.name) == f.default, f.name
    assert s.sampling == {"max_tokens": DEFAULT_MAX_TOKENS} and s.chat_template_kwargs == {} and s.extra_body == {}


@pytest.mark.parametrize("key", sorted({"load_interval", "request_timeout", "concurrency_min", "retries", "limit",
                                        "max_consecutive_failures", "fewer_workers_max_wait"}))
def test_each_numeric_setting_refuses_a_value_below_its_least_and_a_string(key):
    from datagen.gen.settings import INTEGERS, NUMBERS

    least = {**NUMBERS, **INTEGERS}[key]
    for bad in (least - 1, "5"):
        with pytest.raises(ConfigError, match=r"generate\.%s: .*; set an? (number|integer) >= " % key):
            settings_from_config(cfg(generate={key: bad}))
    assert getattr(settings_from_config(cfg(generate={key: least})), key) == least


def test_every_generate_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        settings_from_config(cfg(servers=["ftp://x"], sampling={"top_p": 2},
                                 generate={"retries": -1, "tool_choice": "sometimes", "concurency": 8}))
    keys = sorted(line.split(":", 1)[0] for line in info.value.errors)
    assert keys == ["generate.concurency", "generate.retries", "generate.tool_choice", "sampling.top_p", "servers[0]"]
