"""_datagen.ready, the readiness gate: its readings on tables, its loop on scripted answers; then
``sglang_ready_wait`` in its own process against stand-in workers behind the real sglang-router."""

from __future__ import annotations

import time

import pytest
from harness import RouterProcess, StandinProcess

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import ready
from tests.support.module import run_module
from tests.support.net import http

pytestmark = pytest.mark.processes

# ---------------------------------------------------------------- pure


@pytest.mark.parametrize("text,key", [
    ("SGLANG_DATAGEN_API_KEY=abc\n", "abc"),
    ("SGLANG_DATAGEN_API_KEY= a=b \n", "a=b"),  # the first = splits; the key may hold =
    ("  abc  \n", "abc"),
    ("", ""),
    ("\n\n", ""),
])
def test_parse_api_key(text, key):
    assert ready.parse_api_key(text) == key


@pytest.mark.parametrize("status,text,state", [
    (200, "", "ready"),
    (503, "loading", "HTTP 503"),
    (0, "Connection refused", "no answer: Connection refused"),
])
def test_worker_state(status, text, state):
    assert ready.worker_state(status, text) == state


@pytest.mark.parametrize("status,text,listed", [
    (200, '{"workers": [{"url": "http://a:1/", "is_healthy": true}, {"url": "http://b:1"}]}',
     {"http://a:1": True, "http://b:1": False}),
    (200, '{"workers": []}', {}),
    (200, "{}", {}),
    (401, '{"error": "Unauthorized"}', None),
    (0, "Connection refused", None),
    (200, "not json", None),
    (200, '{"workers": [{"no": "url"}]}', None),
    (200, "[1]", None),
])
def test_parse_router_workers(status, text, listed):
    assert ready.parse_router_workers(status, text) == listed


@pytest.mark.parametrize("case,listed,missing,unhealthy", [
    ("router lists all healthy", {"a": True, "b": True}, [], []),
    ("one dropped", {"a": True}, ["b"], []),
    ("one unhealthy", {"a": True, "b": False}, [], ["b"]),
    ("no answer", None, [], []),
])
def test_router_gaps(case, listed, missing, unhealthy):
    assert ready.router_gaps(["a", "b"], listed) == (missing, unhealthy), case


@pytest.mark.parametrize("case,states,router,listed,done", [
    ("all ready, no router", {"a": "ready", "b": "ready"}, None, None, True),
    ("one not ready", {"a": "ready", "b": "HTTP 503"}, None, None, False),
    ("all ready, router lists all", {"a": "ready"}, "r", {"a": True}, True),
    ("all ready, router did not answer", {"a": "ready"}, "r", None, False),
    ("all ready, router misses one", {"a": "ready"}, "r", {}, False),
    ("all ready, router lists one unhealthy", {"a": "ready"}, "r", {"a": False}, False),
])
def test_gate_done(case, states, router, listed, done):
    missing, unhealthy = ready.router_gaps(list(states), listed)
    assert ready.gate_done(states, router, listed, missing, unhealthy) is done, case


def test_bearer_headers_carry_the_key_only_when_there_is_one():
    assert ready.bearer_headers("") == {"Content-Type": "application/json"}
    assert ready.bearer_headers("k")["Authorization"] == "Bearer k"


# ---------------------------------------------------------------- the loop, on scripted answers


class Scripted:
    """The wire as the gate sees it: worker B turns ready on round 2; the router lists B once registered."""

    def __init__(self):
        self.now = 0.0
        self.calls = []
        self.router_list = {"http://a": True}

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds

    def __call__(self, method, url, body, timeout):
        self.calls.append((method, url, body))
        rounds = sum(1 for call in self.calls if call[1] == "http://b/health_generate")
        if url.endswith("/health_generate"):
            return (200, "") if url.startswith("http://a") or rounds >= 2 else (503, "")
        if method == "POST":
            self.router_list[body["url"]] = True
            return 202, ""
        workers = [{"url": u, "is_healthy": h} for u, h in self.router_list.items()]
        return 200, '{"workers": %s}' % str(workers).replace("'", '"').replace("True", "true")


def test_gate_registers_a_ready_worker_the_router_dropped_then_passes():
    wire = Scripted()
    out = ready.gate(wire, ["http://a", "http://b"], "http://r", 30, 1, clock=wire.clock, sleep=wire.sleep)
    assert out["ready"] and out["registered"] == ["http://b"] and out["stuck"] == [], out
    assert ("POST", "http://r/workers", {"url": "http://b"}) in wire.calls


def test_gate_in_check_mode_names_the_worker_it_would_register_and_registers_none():
    wire = Scripted()
    out = ready.gate(wire, ["http://a", "http://b"], "http://r", 3, 1, register=False, clock=wire.clock,
                     sleep=wire.sleep)
    assert not out["ready"] and out["registered"] == [] and out["would_register"] == ["http://b"], out
    assert out["stuck"] == ["http://b"] and not [c for c in wire.calls if c[0] == "POST"]


def test_gate_gives_up_after_the_timeout_naming_every_stuck_worker():
    wire = Scripted()
    out = ready.gate(wire, ["http://a", "http://b"], None, 0.5, 1, clock=wire.clock, sleep=wire.sleep)
    assert not out["ready"] and out["not_ready"] == ["http://b"] and out["router_answered"] is None, out
    assert out["workers"] == {"http://a": "ready", "http://b": "HTTP 503"}


@pytest.mark.parametrize("p,msg", [
    ({"timeout": -1, "delay": 1}, "timeout must be >= 0"),
    ({"timeout": 1, "delay": 0}, "delay > 0"),
    ({"timeout": 1, "delay": 1, "api_key_file": "/nonexistent/api-key.env"}, "cannot read api_key_file"),
])
def test_wait_ready_refuses_bad_options(p, msg):
    out = ready.wait_ready(dict({"workers": ["http://a"], "router": None, "api_key_file": None}, **p))
    assert out["failed"] and msg in out["msg"], out


# ---------------------------------------------------------------- the module, in its own process


def gate(workers, router=None, timeout=30.0, delay=0.5, check_mode=False, **more):
    return run_module("sglang_ready_wait", dict({"workers": workers, "router": router, "timeout": timeout,
                                                 "delay": delay}, **more), check_mode=check_mode, timeout=90)


def test_module_registers_a_worker_the_router_dropped_and_waits_for_it(tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    with StandinProcess([], model="m") as up, StandinProcess(["--not-ready-while", str(hold)], model="m") as late:
        with RouterProcess([up.url, late.url], expect=1, args=["--worker-startup-timeout-secs", "1"]) as r:
            # the router gave up on the late worker: its AddWorker job failed (smg src/core/job_queue.rs logs it),
            # which takes its startup timeout plus retries, longer on a loaded machine; a fixed sleep raced it
            r.wait_log(f"Failed job: type=AddWorker, worker={late.url},")
            assert late.url not in r.workers()
            hold.unlink()
            out = gate([up.url, late.url], r.url, check_mode=True, timeout=2)
            assert out["would_register"] == [late.url] and out["registered"] == [] and out["changed"], out
            assert late.url not in r.workers()  # check mode registered nothing
            out = gate([up.url, late.url], r.url)
            assert out["rc"] == 0 and out["ready"] and out["changed"], out
            assert out["registered"] == [late.url]
            assert r.workers() == {up.url: True, late.url: True}
            before = late.metrics()["sglang:num_requests_total"]
            for i in range(4):
                body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
                http(r.url + "/v1/chat/completions", body=body).expect(200)
            assert late.metrics()["sglang:num_requests_total"] - before == 2  # round robin: it routes there now
            # ready now: a second run registers nothing
            out = gate([up.url, late.url], r.url, timeout=5)
            assert out["rc"] == 0 and out["registered"] == [] and not out["changed"], out


def test_module_fails_naming_the_worker_held_back(tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    with StandinProcess([], model="m") as up, StandinProcess(["--not-ready-while", str(hold)], model="m") as held:
        with RouterProcess([up.url, held.url], expect=1) as r:
            t0 = time.monotonic()
            out = gate([up.url, held.url], r.url, timeout=3)
            assert time.monotonic() - t0 >= 3 - 0.6  # it waited
            assert out["rc"] == 1 and out["failed"] and not out["ready"], out
            assert out["not_ready"] == [held.url] and out["workers"][held.url] == "HTTP 503"
            assert out["router_missing"] == [held.url] and out["registered"] == [] and out["stuck"] == [held.url]
            assert held.url in out["msg"] and out["msg"].startswith("1 of 2 SGLang workers not ready")


def test_module_without_router_and_a_worker_that_does_not_listen():
    with StandinProcess([], model="m") as gone:
        url = gone.url
    with StandinProcess([], model="m") as up:
        out = gate([up.url, url], timeout=0)
        assert out["rc"] == 1 and out["not_ready"] == [url] and out["workers"][url].startswith("no answer"), out
        out = gate([up.url + "/"], timeout=0)
        assert out["rc"] == 0 and out["router"] is None and list(out["workers"]) == [up.url], out


KEY = "k3y-" + "x" * 40


def test_module_sends_the_key_from_its_file_and_never_shows_it(tmp_path):
    env_file = tmp_path / "api-key.env"
    env_file.write_text(f"SGLANG_DATAGEN_API_KEY={KEY}\n")
    with StandinProcess(["--api-key", KEY]) as worker:
        with RouterProcess([worker.url], api_key=KEY) as router:
            without = gate([worker.url], router.url, timeout=3, delay=1)
            assert without["rc"] == 1 and without["router_answered"] is False, without  # GET /workers needs the key
            keyed = gate([worker.url], router.url, timeout=3, delay=1, api_key_file=str(env_file))
            assert keyed["rc"] == 0 and keyed["ready"] is True, keyed
            assert KEY not in repr(keyed)
