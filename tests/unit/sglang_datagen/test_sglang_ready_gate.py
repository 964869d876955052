"""The role's readiness gate (files/ready_gate.py) against stand-in workers behind the real sglang-router."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from harness import RouterProcess, StandinProcess

from tests.support.net import http
from tests.support.paths import ROOT

GATE = ROOT / "roles" / "sglang_datagen" / "files" / "ready_gate.py"


def run_gate(*args, timeout=60):
    done = subprocess.run([sys.executable, str(GATE), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)
    return done.returncode, json.loads(done.stdout)


def test_gate_registers_a_worker_the_router_dropped_and_waits_for_it(tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    with StandinProcess([], model="m") as ready, StandinProcess(["--not-ready-while", str(hold)], model="m") as late:
        with RouterProcess([ready.url, late.url], expect=1, args=["--worker-startup-timeout-secs", "1"]) as r:
            # the router gave up on the late worker: its AddWorker job failed (smg src/core/job_queue.rs logs it),
            # which takes its startup timeout plus retries, longer on a loaded machine; a fixed sleep raced it
            r.wait_log(f"Failed job: type=AddWorker, worker={late.url},")
            assert late.url not in r.workers()
            hold.unlink()
            rc, out = run_gate("--router", r.url, "--worker", ready.url, "--worker", late.url,
                               "--timeout", "30", "--delay", "0.5")
            assert rc == 0 and out["ready"], out
            assert out["registered"] == [late.url]
            assert r.workers() == {ready.url: True, late.url: True}
            before = late.metrics()["sglang:num_requests_total"]
            for i in range(4):
                body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
                http(r.url + "/v1/chat/completions", body=body).expect(200)
            assert late.metrics()["sglang:num_requests_total"] - before == 2  # round robin: it routes there now
            # ready now: a second run registers nothing
            rc, out = run_gate("--router", r.url, "--worker", ready.url, "--worker", late.url, "--timeout", "5")
            assert rc == 0 and out["registered"] == []


def test_gate_fails_naming_the_worker_held_back(tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    with StandinProcess([], model="m") as ready, StandinProcess(["--not-ready-while", str(hold)], model="m") as held:
        with RouterProcess([ready.url, held.url], expect=1) as r:
            t0 = time.monotonic()
            rc, out = run_gate("--router", r.url, "--worker", ready.url, "--worker", held.url,
                               "--timeout", "3", "--delay", "0.5")
            assert time.monotonic() - t0 >= 3 - 0.6  # it waited
            assert rc == 1 and not out["ready"]
            assert out["not_ready"] == [held.url] and out["workers"][held.url] == "HTTP 503"
            assert out["router_missing"] == [held.url] and out["registered"] == []


def test_gate_without_router_and_a_worker_that_does_not_listen():
    with StandinProcess([], model="m") as gone:
        url = gone.url
    with StandinProcess([], model="m") as ready:
        rc, out = run_gate("--worker", ready.url, "--worker", url, "--timeout", "0")
        assert rc == 1 and out["not_ready"] == [url] and out["workers"][url].startswith("no answer")
        rc, out = run_gate("--worker", ready.url, "--timeout", "0")
        assert rc == 0 and out["router"] is None
