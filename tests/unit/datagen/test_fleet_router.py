"""Every worker, the whole run: generate behind the REAL sglang-router 0.3.2 (harness.RouterProcess) with stand-in
workers, all on loopback. A router restart and a worker restart mid-run leave it on fewer workers for a while; the
run must say so (progress file, ``datagen status``, one journal line each way), bring every worker back
(registering again the one the router dropped) and write every id exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest
import yaml
from harness import RouterProcess, StandinProcess

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import ready
from datagen.gen.fleet import parse_router_workers
from tests.support.net import http
from tests.support.paths import DATAGEN_FILES
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes

pytest.importorskip("sglang_router", reason="the real sglang-router (requirements.txt) is not installed")

MODEL = "lab-model"
ENV = dict(os.environ, PYTHONPATH=str(DATAGEN_FILES))
# the router drops return_token_ids: the workers put the ids on every response themselves (as the role starts them)
WORKER_ARGS = ["--return-input-ids", "--return-output-ids"]
# short enough for a test; the router drops a worker not healthy within it
ROUTER_ARGS = ["--worker-startup-timeout-secs", "1", "--cb-timeout-duration-secs", "1"]


def _config(work, router: str, workers: List[str], n: int, **generate: Any) -> str:
    (work / "src.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with open(work / "prompts.jsonl", "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"row-{i:05d}", "source": "lab", "category": "general",
                                 "messages": [{"role": "user", "content": f"Question {i}?"}]}) + "\n")
    # retries outlast a router restart (about a second); the watch looks every 0.1 s
    gen = {"concurrency": 2, "backoff_base": 0.2, "backoff_max": 1.0, "retries": 10, "ready_interval": 0.05,
           "ready_timeout": 20, "fsync_interval": 0.05, "progress_interval": 0.05, "workers": workers,
           "workers_interval": 0.1, **generate}
    raw = {"work_dir": str(work), "model": MODEL, "servers": [router], "sampling": {"max_tokens": 16},
           "target_total": n, "target_mix": {"general": 1.0}, "max_length": 1024, "seed": 1, "generate": gen,
           "sources": [{"name": "lab", "adapter": "messages", "category": "general", "path": str(work / "src.jsonl")}]}
    path = work / "datagen.yml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _start(cfg: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "datagen", "generate", "--config", cfg], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_of_two_serving(progress: dict) -> dict | None:
    """PROGRESS when it says one worker serves, else None (wait_for's "not yet")."""
    return progress if progress.get("workers_serving") == 1 else None


def _progress(work) -> Dict[str, Any]:
    try:
        return json.loads((work / "generate.progress.json").read_text())
    except (OSError, ValueError):  # not written yet (it is replaced by a rename, never half there)
        return {}


def _written(work) -> int:
    return int(_progress(work).get("written") or 0)


def _status(cfg: str) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "datagen", "status", "--config", cfg], env=ENV, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    try:
        _out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return err


def _assert_every_worker_serves_and_every_id_once(work, router: RouterProcess, workers: List[str], n: int) -> None:
    assert router.workers() == {w: True for w in workers}
    final = _progress(work)
    assert final["state"] == "finished" and final["errors"] == 0
    assert (final["workers_serving"], final["workers_configured"], final["workers_missing"]) == \
        (len(workers), len(workers), {})
    ids = [json.loads(line)["id"] for line in (work / "generated.jsonl").read_text().splitlines()]
    assert sorted(ids) == [f"row-{i:05d}" for i in range(n)]  # every id, none twice


def test_router_restart_drops_a_slow_worker_and_the_run_waits_until_it_is_registered_again(tmp_path):
    """(a) The router is killed mid-run and started again on its port while worker 1 is not ready (held, as
    SGLang loading its weights): the new router knows only worker 0 and drops worker 1 after its startup timeout
    for good. With fewer_workers: wait the run sends nothing new meanwhile; once worker 1 answers, the watch
    registers it again and the run goes on to the end on both."""
    hold = tmp_path / "hold-{port}"
    ws = [StandinProcess(WORKER_ARGS + ["--latency", "0.05", "--not-ready-while", str(hold)], model=MODEL)
          for _index in range(2)]
    try:
        for w in ws:
            w.start()
        urls = [w.url for w in ws]
        held = tmp_path / f"hold-{ws[1].port}"
        with RouterProcess(urls, args=ROUTER_ARGS) as router:
            n = 200
            cfg = _config(tmp_path, router.url, urls, n, fewer_workers="wait", fewer_workers_max_wait=60)
            proc = _start(cfg)
            wait_for(lambda: _written(tmp_path) >= 20, 30, "the first rows through the router", interval=0.05)
            held.write_text("")
            router.proc.kill()  # a crash: no goodbye to the workers
            router.stop()
            wait_for(lambda: _progress(tmp_path).get("workers_serving") == 0, 10, "no worker serving without the router",
                     interval=0.05)
            router.expect = 1
            router.start(attempts=1)  # the same port: the pipeline's `servers` still points at it
            router.wait_log(f"Failed job: type=AddWorker, worker={urls[1]},", timeout=20)
            assert list(router.workers()) == [urls[0]]  # dropped for good: nothing in the router brings it back
            short = wait_for(lambda: one_of_two_serving(_progress(tmp_path)), 10, "one of two workers serving",
                             interval=0.05)
            assert list(short["workers_missing"]) == [urls[1]] and "not in the router's worker list" in \
                short["workers_missing"][urls[1]]
            paused_at = _written(tmp_path)
            status = _status(cfg)  # `datagen status` while it lasts (another process, as an operator runs it)
            assert (status["running"], status["workers_serving"], status["workers_configured"]) == (True, 1, 2)
            assert _written(tmp_path) <= paused_at + 2  # waiting: only rows already in flight land
            held.unlink()
            err = _finish(proc)
            _assert_every_worker_serves_and_every_id_once(tmp_path, router, urls, n)
            # the role's gate and the watch read the router's list alike
            assert ready.parse_router_workers(*ready.urllib_http(ready.bearer_headers(""))(
                "GET", router.url + "/workers", None, 5)) == parse_router_workers(http(router.url + "/workers").text.encode())
    finally:
        for w in ws:
            w.stop()
    assert f"{urls[1]} is ready and the router {router.url} did not list it: registered again" in err
    assert "generate: 0 of 2 workers serving" in err and "new requests wait for them" in err
    assert f"generate: all 2 workers serving again (back: {urls[1]})" in err


def test_a_worker_restarted_slower_than_the_router_startup_timeout_comes_back_into_the_run(tmp_path):
    """(b) Worker 1 is stopped mid-run and started again on its port, not ready for longer than the router's
    startup timeout. With fewer_workers: continue the run goes on with worker 0, the progress file and the
    journal name worker 1 while it is gone, and the run ends on both. (A running sglang-router 0.3.2 keeps a
    restarted worker in its list, healthy until its health checks say otherwise: it is the worker's own
    /health_generate that shows it gone; the drop at the router's startup is case (a).)"""
    ws = [StandinProcess(WORKER_ARGS + ["--latency", "0.1"], model=MODEL) for _index in range(2)]
    try:
        for w in ws:
            w.start()
        urls = [w.url for w in ws]
        with RouterProcess(urls, args=ROUTER_ARGS) as router:
            n = 200  # 10 s at two rows in flight of 0.1 s: worker 1 is back after about 3
            cfg = _config(tmp_path, router.url, urls, n)
            proc = _start(cfg)
            wait_for(lambda: _written(tmp_path) >= 20, 30, "the first rows through the router", interval=0.05)
            ws[1].stop()
            ws[1] = StandinProcess(WORKER_ARGS + ["--latency", "0.1", "--not-ready-for", "2"], model=MODEL,
                                   port=ws[1].port).start()
            short = wait_for(lambda: one_of_two_serving(_progress(tmp_path)), 10, "one of two workers serving",
                             interval=0.05)
            assert list(short["workers_missing"]) == [urls[1]]
            before = _written(tmp_path)
            status = _status(cfg)
            assert (status["running"], status["workers_serving"]) == (True, 1)
            wait_for(lambda: _written(tmp_path) > before + 10, 20, "rows while one worker is gone", interval=0.05)
            wait_for(lambda: _progress(tmp_path).get("workers_serving") == 2, 20, "both workers serving again",
                     interval=0.05)
            assert _progress(tmp_path)["state"] == "running"  # back while the run still had rows to send
            err = _finish(proc)
            _assert_every_worker_serves_and_every_id_once(tmp_path, router, urls, n)
    finally:
        for w in ws:
            w.stop()
    assert f"generate: 1 of 2 workers serving; not serving: {urls[1]} (" in err
    assert "going on with the rest (generate.fewer_workers: continue)" in err
    assert f"generate: all 2 workers serving again (back: {urls[1]})" in err
