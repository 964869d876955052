"""training_stop finishes its ladder when the connection that started it dies, and the next run reports it.

The real module in its own process, on a real stubborn trainer (it ignores
SIGINT/SIGTERM, only SIGKILL ends it). The dead connection is what the module
sees of it: its stdout pipe closed by the reader (a dead SSH channel) and a
SIGHUP during the SIGTERM rung (what a pty's hangup delivers). The ladder must
climb to SIGKILL anyway, leave no process of the job behind (none stopped,
none half-signalled), and record its outcome; the re-run must say what it did,
by which rung and when, and a second re-run must change nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from trainer_harness import Trainer, pids_with, read_stat

from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder_lock import (
    describe_previous,
    outcome_fields,
)
from tests.support.module import module_command, module_env, run_module
from tests.support.paths import ROOT
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]


def _record(locks: str) -> dict:
    names = [name for name in os.listdir(locks) if name.endswith(".json")] if os.path.isdir(locks) else []
    if len(names) != 1:
        return {}
    try:
        with open(os.path.join(locks, names[0])) as handle:
            return json.load(handle)
    except ValueError:
        return {}


@pytest.fixture
def stubborn(tmp_path):
    trainer = Trainer(str(tmp_path / "job"), "stubborn", nproc=2)
    os.makedirs(trainer.workdir)
    trainer.start()
    yield trainer
    trainer.cleanup()


def test_ladder_finishes_after_its_connection_hangs_up_and_the_rerun_reports_it(stubborn, tmp_path):
    locks = str(tmp_path / "locks")
    args = {"match": stubborn.regex, "lock_dir": locks,
            "ladder": [{"signal": "SIGTERM", "timeout": 3}, {"signal": "SIGKILL", "timeout": 5}]}
    job = sorted(pid for pid, _start in stubborn.identities())
    module = subprocess.Popen(module_command("training_stop", args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=module_env(), cwd=ROOT)
    # the connection dies: nobody reads the module's output any more
    module.stdout.close()
    module.stderr.close()
    wait_for(lambda: _record(locks).get("state") == "running", 30, "the ladder to start", interval=0.02)
    os.kill(module.pid, signal.SIGHUP)  # during the SIGTERM rung (3 s)
    module.wait(timeout=60)
    assert pids_with(stubborn.ckpt_dir) == [], "the job outlived the ladder"
    stubborn.proc.wait(timeout=5)  # reap the launcher (this test's child)
    left = {pid: read_stat(pid) for pid in job}
    assert all(stat is None or stat[0] == "Z" for stat in left.values()), left  # dead, none left stopped (T)
    record = _record(locks)
    assert record["state"] == "done" and record["pid"] == module.pid, record
    assert record["stopped_by"] == "SIGKILL" and record["hangups"] == ["SIGHUP"]
    assert sorted(p["pid"] for p in record["stopped"]) == job and record["stopped_count"] == len(job)
    assert [r["signal"] for r in record["rungs"]] == ["SIGTERM", "SIGKILL"] and record["rungs"][1]["exited"] == len(job)

    rerun = run_module("training_stop", args)
    assert rerun["rc"] == 0 and rerun["changed"] is False and rerun["selected"] == [], rerun
    assert rerun["previous"]["pid"] == module.pid and rerun["previous"]["stopped_by"] == "SIGKILL"
    note = [n for n in rerun["notes"] if n.startswith("nothing selected now; ")]
    assert note and "stopped the job with SIGKILL" in note[0] and "training_stop pid %d" % module.pid in note[0], rerun["notes"]
    assert "%d process(es)" % len(job) in note[0] and "hung up during the ladder: SIGHUP" in note[0]
    second = run_module("training_stop", args)
    assert second["changed"] is False and second["selected"] == [] and second["previous"] == rerun["previous"]


def test_describe_previous_says_what_when_and_how():
    selected = [{"pid": 10, "cmdline": "python3 fake_trainer.py"}, {"pid": 11, "cmdline": "python3 fake_trainer.py --worker"}]
    rungs = [{"signal": "SIGTERM", "via": None, "sent_at": 0.1, "exited": []}, {"signal": "SIGKILL", "sent_at": 3.2, "exited": [10, 11]}]
    record = dict(outcome_fields(selected, rungs, "SIGKILL", []), state="done", pid=7, started=0, finished=60)
    text = describe_previous(record)
    assert text.startswith("the last ladder for this selection (training_stop pid 7, started 1970-01-01T00:00:00Z)")
    assert "stopped the job with SIGKILL at 1970-01-01T00:01:00Z, 2 process(es): pid 10 (python3 fake_trainer.py)" in text
    assert "hung up" not in text
    assert "interrupted before it finished" in describe_previous({"state": "interrupted", "pid": 7, "started": 0})
    failed = describe_previous(dict(record, stopped_by=None, state="failed", msg="1 process(es) survived SIGKILL"))
    assert "ended at 1970-01-01T00:01:00Z: 1 process(es) survived SIGKILL" in failed
