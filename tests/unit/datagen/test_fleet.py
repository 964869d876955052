"""The pure parts of the worker watch (gen/fleet.py) and its settings: who serves, what to register, what to log."""

from __future__ import annotations

import asyncio
import json

import pytest

from datagen.gen.fleet import (
    NOT_LISTED,
    UNHEALTHY,
    FleetWatch,
    missing_workers,
    parse_router_workers,
    to_register,
    wait_expired,
    width_line,
)
from datagen.gen.progress import Progress, summary_line
from datagen.gen.settings import ConfigError, settings_from_config

W = ("http://gpu1.example.internal:31000", "http://gpu1.example.internal:31001", "http://gpu2.example.internal:31000")
ROUTER = "http://gpu1.example.internal:30000"


def test_the_router_list_is_read_as_url_and_health():
    # the shape sglang-router 0.3.2 answers GET /workers with (trimmed), a trailing slash as a user might register
    body = json.dumps({"workers": [{"id": "a", "url": W[0] + "/", "is_healthy": True, "load": 0},
                                   {"id": "b", "url": W[1], "is_healthy": False}], "total": 2}).encode()
    assert parse_router_workers(body) == {W[0]: True, W[1]: False}
    for bad in (b"", b"<html>", b'{"workers": 3}', b'{"error": "unauthorized"}', b'{"workers": [{"id": 1}]}'):
        assert parse_router_workers(bad) is None, bad


def test_a_worker_serves_when_listed_healthy_and_its_own_check_passes():
    listed = {W[0]: True, W[1]: False}
    health = {W[0]: None, W[1]: None, W[2]: None}
    assert missing_workers(W, listed, health) == {W[1]: UNHEALTHY, W[2]: NOT_LISTED}
    # listed healthy by a router that has not noticed the restart yet: its own check decides
    assert missing_workers(W, {w: True for w in W}, dict(health, **{W[0]: "/health_generate HTTP 503"})) == \
        {W[0]: "/health_generate HTTP 503"}
    assert missing_workers(W, {w: True for w in W}, health) == {}


def test_a_router_that_does_not_answer_leaves_no_worker_serving_and_none_to_register():
    health = {w: None for w in W}
    assert missing_workers(W, None, health, "the router does not answer") == {w: "the router does not answer" for w in W}
    assert to_register(W, None, health) == []


def test_only_ready_workers_the_router_does_not_list_are_registered():
    listed = {W[0]: True, W[1]: False}  # unhealthy but listed: the router's own checks bring it back
    health = {W[0]: None, W[1]: None, W[2]: None}
    assert to_register(W, listed, health) == [W[2]]
    # a worker still loading would be dropped again after the router's startup timeout: not yet
    assert to_register(W, listed, dict(health, **{W[2]: "/health_generate HTTP 503"})) == []
    assert missing_workers(W, listed, dict(health, **{W[2]: "/health_generate HTTP 503"}))[W[2]] == \
        NOT_LISTED + "; /health_generate HTTP 503"


def test_width_line_names_the_missing_workers_down_and_back_up():
    assert width_line(3, {}, {}, None) is None
    down = width_line(3, {}, {W[2]: NOT_LISTED}, None)
    assert down == (f"generate: 2 of 3 workers serving; not serving: {W[2]} ({NOT_LISTED}); "
                    "going on with the rest (generate.fewer_workers: continue)")
    assert width_line(3, {W[2]: NOT_LISTED}, {W[2]: "other reason"}, None) is None  # the same workers: no new line
    more = width_line(3, {W[2]: NOT_LISTED}, {W[0]: UNHEALTHY}, 600.0)
    assert more is not None and f"not serving: {W[0]} ({UNHEALTHY})" in more
    assert "wait for them (generate.fewer_workers: wait, at most 600s)" in more and more.endswith(f"back: {W[2]}")
    assert width_line(3, {W[0]: UNHEALTHY, W[2]: NOT_LISTED}, {}, None) == \
        f"generate: all 3 workers serving again (back: {W[0]}, {W[2]})"


def test_workers_missing_for_one_reason_are_named_once_with_it():
    why = "the router does not answer"
    line = width_line(3, {}, {W[1]: why, W[0]: why, W[2]: NOT_LISTED}, None)
    assert line is not None and f"not serving: {W[0]}, {W[1]} ({why}); {W[2]} ({NOT_LISTED}); going on" in line


def test_the_wait_gives_up_naming_the_workers_and_both_ways_out():
    text = wait_expired(3, {W[2]: NOT_LISTED}, 601.4, 600.0)
    assert text.startswith("only 2 of 3 workers served for 601s (generate.fewer_workers: wait, "
                           "generate.fewer_workers_max_wait: 600)")
    assert W[2] in text and "run again" in text and "generate.fewer_workers: continue" in text


def _watch(wait_max, lines, failures):
    progress = Progress(10, 0, (ROUTER,))
    return FleetWatch(ROUTER, W, 1.0, wait_max, progress, lines.append, failures.append), progress


def test_wait_holds_new_requests_until_every_worker_serves_then_gives_up_after_the_bound():
    async def scenario():
        lines, failures = [], []
        watch, progress = _watch(10.0, lines, failures)
        stop = asyncio.Event()
        held = asyncio.ensure_future(watch.admit(stop))
        await asyncio.sleep(0)
        assert not held.done()  # closed until the first round
        watch.note({}, now=0.0)
        await asyncio.wait_for(held, 1)
        watch.note({W[1]: UNHEALTHY}, now=1.0)
        assert (progress.workers_serving, progress.workers_configured) == (2, 3)
        held = asyncio.ensure_future(watch.admit(stop))
        await asyncio.sleep(0)
        assert not held.done()
        watch.note({W[1]: UNHEALTHY}, now=10.9)
        assert not failures and not held.done()
        watch.note({W[1]: UNHEALTHY}, now=11.0)  # ten seconds short in a row
        assert failures and W[1] in failures[0]
        await asyncio.wait_for(held, 1)  # let go: the run is stopping
        assert len(lines) == 1 and "1 of 3" not in lines[0] and "2 of 3" in lines[0]
        # a stop lets held requests go too
        watch._open.clear()
        held = asyncio.ensure_future(watch.admit(stop))
        stop.set()
        await asyncio.wait_for(held, 1)

    asyncio.run(scenario())


def test_continue_never_holds_and_the_summary_says_who_is_missing():
    async def scenario():
        lines, failures = [], []
        watch, progress = _watch(None, lines, failures)
        watch.note({W[2]: NOT_LISTED}, now=0.0)
        await asyncio.wait_for(watch.admit(asyncio.Event()), 1)
        watch.note({W[2]: NOT_LISTED}, now=99999.0)
        assert not failures
        snap = progress.snapshot()
        assert (snap["workers_serving"], snap["workers_configured"], snap["workers_missing"]) == \
            (2, 3, {W[2]: NOT_LISTED})
        assert summary_line(snap).endswith(f"only 2/3 workers serving (not serving: {W[2]})")
        watch.note({}, now=1.0)
        assert "workers" not in summary_line(progress.snapshot()) and lines[-1].startswith("generate: all 3 workers")

    asyncio.run(scenario())


def _settings(servers, **generate):
    return settings_from_config({"servers": servers, "generate": generate})


def test_workers_settings_defaults_and_validation():
    s = _settings([ROUTER])
    assert (s.workers, s.workers_interval, s.fewer_workers, s.fewer_workers_max_wait) == ((), 15.0, "continue", 1800.0)
    s = _settings([ROUTER], workers=[w + "/" for w in W], fewer_workers="wait", fewer_workers_max_wait=60)
    assert (s.workers, s.fewer_workers, s.fewer_workers_max_wait) == (W, "wait", 60.0)


@pytest.mark.parametrize("servers, generate, named", [
    ([ROUTER], {"fewer_workers": "pause"}, "generate.fewer_workers: 'pause' is not continue or wait; write continue"),
    ([ROUTER], {"fewer_workers_max_wait": -1}, "generate.fewer_workers_max_wait: -1 is below 0.0"),
    ([ROUTER], {"workers_interval": 0}, "generate.workers_interval: 0 is below 0.05"),
    ([ROUTER], {"workers": ["ftp://x"]}, "generate.workers[0]: 'ftp://x' is not an http(s) base URL"),
    ([ROUTER, W[0]], {"workers": [W[0]]}, "generate.workers: lists the workers behind one router, but servers is"),
    ([W[0]], {"workers": [W[0]]}, "set servers to the router alone, or remove generate.workers"),
])
def test_bad_workers_settings_name_the_key_and_the_fix(servers, generate, named):
    with pytest.raises(ConfigError) as err:
        _settings(servers, **generate)
    assert named in str(err.value)
