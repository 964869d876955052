# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Role sglang_datagen, for real, against the CT200 lab (the SGLang stand-in serves).

The real ``ansible-playbook`` through the real ``pct_ssh`` connection: venv, the
datagen package, nine systemd units (eight stand-in workers and the REAL sglang-router of the
pinned version, installed by the role from PyPI), the readiness gate, and the ``datagen-pipeline`` unit, which must run all five stages (prepare,
generate, tokenize, merge, report) to the end after the play has returned, with the
lab's real tokenizer and existing dataset. Every request goes through the router to
the eight workers (their own /metrics say so), and the workers count prompt tokens
with the same tokenizer, so tokenize's prompt check must match every row. Then a
second run must change nothing, and a dry run must report nothing to do. With one
worker held back from readiness the role waits and fails naming it; a worker the
router dropped is registered again by the gate. Skipped with the reason when the
lab is not up.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from tests.support.datagen import (
    GATE_TASK,
    INSTALL_TASK,
    ROUTER,
    TOKEN_EXACT_PY,
    WORK,
    WORKERS,
    generated_rows,
    play,
    play_result,
    reset_pipeline,
    router_listed,
    router_workers,
    server_metrics,
    wait_pipeline_finished,
)
from tests.support.lab import DATAGEN_HOST
from tests.support.net import http
from tests.support.paths import LANE, lanes
from tests.support.playbook import changed_tasks, task_output
from tests.support.ssh import attach as in_ct

START_WORKERS = "Start the workers (restart those whose unit or GPUs changed, also in a killed run)"
START_ROUTER = "Start the router (restart it when its unit changed, also in a killed run)"

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]


def requests_since(before, after, url):
    """Chat requests a worker answered between two reads; a restarted worker (new start time) counts from 0."""
    now = after.get(url, {})
    then = before.get(url, {})
    same_process = then.get("standin_start_time_seconds") == now.get("standin_start_time_seconds")
    return int(now.get("standin_ok_total", 0) - (then.get("standin_ok_total", 0) if same_process else 0))


LISTENERS_PY = r"""
import json, sys
port = "%04X" % int(sys.argv[1])
out = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and local.endswith(":" + port):
            out.append(local.rsplit(":", 1)[0])
print(json.dumps(sorted(out)))
"""


def listener_hex(addr):
    """An IPv4 address as /proc/net/tcp writes a local address (little-endian hex: 127.0.0.1 is 0100007F)."""
    return socket.inet_aton(addr)[::-1].hex().upper()


# the other lab lanes' datagen addresses: the containers share this machine's network, so /proc/net/tcp in
# CT200 also lists the listeners of other lanes' routers (each on its own lane's address)
OTHER_LANES_HEX = {listener_hex(addr) for index in range(lanes.MAX_LANES) if index != LANE.index
                   for addr in lanes.lane(index).datagen_hosts}


def listeners(lab, port):
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) listening on ``port`` in CT200."""
    return json.loads(in_ct(lab, "/opt/datagen/venv/bin/python", "-c", LISTENERS_PY, str(port)).stdout)


def drop_from_router(url):
    """Remove worker URL from the router (DELETE /workers/{id}), as it drops one that was not healthy within
    --worker-startup-timeout-secs; bounded wait until its list no longer has it."""
    wid = [w["id"] for w in router_listed() if w["url"] == url][0]
    deleted = http(f"{ROUTER}/workers/{wid}", method="DELETE", timeout=10)
    assert 200 <= deleted.status < 300, deleted
    for _attempt in range(100):
        if url not in router_workers():
            return
        time.sleep(0.1)


def test_role_serves_gates_and_launches_the_pipeline_then_changes_nothing(lab):
    """The whole role and the pipeline it launches; a re-run and a dry run change nothing; then what an
    operator undoes by hand (units stopped or disabled, a worker dropped from the router) is all a re-run
    changes."""
    reset_pipeline(lab)
    before = server_metrics()
    out = play()[0]
    assert "pipeline: started" in out or "pipeline: running" in out, out[-3000:]

    # it runs on after the play: wait (bounded) until the unit has finished
    wait_pipeline_finished(lab, 300)

    rows = generated_rows(lab)
    prompts = in_ct(lab, "cat", f"{WORK}/prompts.jsonl").stdout.splitlines()
    assert len(rows) == len(prompts) == 100
    assert len({r["id"] for r in rows}) == 100
    assert {r["server"] for r in rows} == {f"http://{DATAGEN_HOST}:30000"}  # through the router
    assert all(r["model"] == "lab-model" and r["messages"][-1]["role"] == "assistant" for r in rows)

    # the router answered nothing itself: the 100 requests reached the workers, every one of them
    after = server_metrics()
    per_worker = [requests_since(before, after, url) for url in WORKERS]
    assert sum(per_worker) == 100 and min(per_worker) > 0, per_worker
    assert all(after[url]["standin_tokenizer_info"] == 1 for url in WORKERS)
    # the router is the real one, from the venv, and lists all eight workers healthy
    assert router_workers() == {url: True for url in WORKERS}
    argv = in_ct(lab, "systemctl", "show", "-p", "ExecStart", "sglang-datagen-router.service").stdout
    assert "sglang_router.launch_router" in argv and "standin" not in argv, argv
    assert f"--prometheus-host {DATAGEN_HOST}" in argv and "--worker-startup-timeout-secs 1800" in argv, argv
    version = in_ct(lab, "/opt/datagen/venv/bin/python", "-c",
                    "import importlib.metadata as m; print(m.version('sglang-router'))").stdout.strip()
    assert version == "0.3.2"
    assert in_ct(lab, "/opt/datagen/venv/bin/python", "-m", "pip", "check", check=False).returncode == 0
    # the router's metrics listener: the lane's datagen address (127.0.0.1 in lane 0), port 30100 only
    # (sglang-router binds 0.0.0.0 unless told)
    assert [addr for addr in listeners(lab, 30100) if addr not in OTHER_LANES_HEX] == [listener_hex(DATAGEN_HOST)]
    nofile = in_ct(lab, "systemctl", "show", "-p", "LimitNOFILE", "datagen-pipeline.service").stdout.strip()
    assert nofile == f"LimitNOFILE={2 * 16 + 1024}", nofile  # concurrency 16, one server (the router)

    # tokenize, merge, report ran with the lab tokenizer and the existing set
    tokenized = json.loads(in_ct(lab, "cat", f"{WORK}/tokenized/manifest.json").stdout)
    check = tokenized["prompt_check"]
    assert (check["checked"], check["matched"], check["mismatched"]) == (100, 100, 0), check
    # token-exact: every row is the server's prompt + output ids, tool and agent rows (lab-source.jsonl) too
    exact = json.loads(in_ct(lab, "/opt/datagen/venv/bin/python", "-c", TOKEN_EXACT_PY, WORK).stdout)
    assert (exact["rows"], exact["exact"], exact["with_ids"]) == (100, 100, 100), exact
    assert exact["tool"] >= 10 and exact["agent"] >= 5, exact
    assert tokenized["token_exact"] == 100
    assert (tokenized["rows_out"], tokenized["tokenizer"]) == (100, "/srv/datagen/tokenizer")
    merged = json.loads(in_ct(lab, "cat", f"{WORK}/merged/manifest.json").stdout)
    assert merged["existing_per_category"] == {"coding": 45, "general": 13}
    assert merged["merged_per_category"] == {"coding": 45, "general": 113} and merged["rows"] == 158
    shards = [p for p in merged["shards"] if in_ct(lab, "test", "-s", p, check=False).returncode == 0]
    assert shards and len(shards) == len(merged["shards"])
    for name in ("composition.md", "mix.png", "lengths.png"):
        assert in_ct(lab, "test", "-s", f"{WORK}/report/{name}", check=False).returncode == 0, name
    table = in_ct(lab, "cat", f"{WORK}/report/composition.md").stdout
    assert re.search(r"\| coding \| 45 \| 77\.6% \| 0 \| 45 \| 28\.5% \| 30\.0% \|", table), table[:1500]

    # the units are real systemd units, enabled, one worker per fake GPU
    for unit in [f"sglang-datagen-worker@{i}.service" for i in range(8)] + ["sglang-datagen-router.service"]:
        assert in_ct(lab, "systemctl", "is-active", unit, check=False).stdout.strip() == "active", unit
    env3 = in_ct(lab, "cat", "/opt/datagen/workers/worker-3.env").stdout
    assert "CUDA_VISIBLE_DEVICES=3" in env3 and "SGLANG_DATAGEN_PORT=31003" in env3

    # status from another process while nothing runs
    status = in_ct(lab, "env", "PYTHONPATH=/opt/datagen/lib", "/opt/datagen/venv/bin/python", "-m", "datagen",
                   "status", "--config", "/opt/datagen/datagen.yml").stdout
    status = json.loads(status)
    assert (status["state"], status["done"], status["total"], status["running"]) == ("finished", 100, 100, False)

    # again: nothing changes and the finished pipeline is not started again; the venv holds every pin,
    # so the installer is not even asked
    out, changed = play()
    assert changed == 0, out[-4000:]
    assert "finished for this config" in out
    assert task_output(out, INSTALL_TASK) == ["skipping: [ct200]"], out[-4000:]

    # dry run: nothing to do either
    out, changed = play("--check")
    assert changed == 0, out[-4000:]

    # the converged node is where the two re-run cases below start (each would otherwise pay a converge)
    rerun_starts_and_enables_only_the_serving_units_that_need_it(lab)
    gate_registers_a_worker_the_router_dropped()


def rerun_starts_and_enables_only_the_serving_units_that_need_it(lab):
    """One worker stopped, another disabled, the router stopped: the re-run starts, enables and starts
    those and calls systemd for no other worker (the node names the units already started and enabled);
    the next run makes no call at all."""
    in_ct(lab, "systemctl", "stop", "sglang-datagen-worker@2.service")
    in_ct(lab, "systemctl", "disable", "sglang-datagen-worker@5.service")
    in_ct(lab, "systemctl", "stop", "sglang-datagen-router.service")

    out = play()[0]
    # the worker items count once, as one task; the gate may also register workers the restarted router
    # has not listed yet (it does so on its own as each answers its health check)
    changed = [name.split(" : ", 1)[-1] for _position, name in changed_tasks(out)]
    assert changed[:2] == [START_WORKERS, START_ROUTER] and set(changed[2:]) <= {GATE_TASK}, out[-4000:]
    assert task_output(out, START_WORKERS) == [
        "changed: [ct200] => (item=sglang-datagen-worker@2)", "changed: [ct200] => (item=sglang-datagen-worker@5)"]
    assert task_output(out, START_ROUTER) == ["changed: [ct200]"]
    for unit in ("sglang-datagen-worker@2.service", "sglang-datagen-worker@5.service", "sglang-datagen-router.service"):
        assert in_ct(lab, "systemctl", "is-active", unit, check=False).stdout.strip() == "active", unit
        assert in_ct(lab, "systemctl", "is-enabled", unit, check=False).stdout.strip() == "enabled", unit
    assert router_workers() == {url: True for url in WORKERS}

    out, changed = play()
    assert changed == 0, out[-4000:]
    assert task_output(out, START_WORKERS) == ["skipping: [ct200]"]
    assert task_output(out, START_ROUTER) == ["skipping: [ct200]"]


def gate_registers_a_worker_the_router_dropped():
    """Worker 2 dropped from the real router (every worker registered before): the role's gate must see
    it missing and register it again."""
    drop_from_router(WORKERS[2])
    assert WORKERS[2] not in router_workers()
    out = play()[0]
    gate = task_output(out, GATE_TASK)
    assert gate and gate[0].startswith("changed:"), out[-4000:]  # the gate registered it
    assert router_workers() == {url: True for url in WORKERS}


def test_role_waits_for_a_worker_held_back_then_fails_naming_it(lab):
    # the stand-in's lab switch (--not-ready-while /run/standin/hold-{port}): worker 5 answers 503 on /health
    # and /health_generate, as SGLang does while it is still starting
    in_ct(lab, "mkdir", "-p", "/run/standin")
    in_ct(lab, "touch", "/run/standin/hold-31005")
    try:
        t0 = time.monotonic()
        done = play_result("-e", "sglang_datagen_ready_timeout=6")
        elapsed = time.monotonic() - t0
    finally:
        in_ct(lab, "rm", "-f", "/run/standin/hold-31005")
    assert done.rc != 0, done.stdout[-3000:]
    text = " ".join(done.stdout.split())
    found = re.search(r"(\S+) of 8 SGLang workers not ready after sglang_datagen_ready_timeout=6s: (.*?) Check the units",
                      text)
    assert found and found.group(1) == "1", done.stdout[-3000:]
    error = found.group(2)
    assert f"sglang-datagen-worker@5.service (http://{DATAGEN_HOST}:31005): HTTP 503" in error, error
    # the worker's own journal: its start, or (when the router restarted meanwhile) the router's gRPC probes,
    # which a worker still starting logs as uvicorn does
    assert "last journal lines:" in error, error
    assert "standin: serving 'lab-model'" in error or "Invalid HTTP request received" in error, error
    assert "worker@4" not in error and "worker@6" not in error, error
    assert elapsed >= 6
    assert "pipeline: started" not in done.stdout  # nothing launched against a server that is not there
