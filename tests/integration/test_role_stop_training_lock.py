# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop_training role's run lock (roles/stop_training/files/stop_training_lock.py), run as the role runs it.

The role passes the file's text to ``python3 -c`` on the target; these tests do
the same with real processes and real files (no lab needed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = (Path(__file__).resolve().parents[2] / "roles" / "stop_training" / "files" / "stop_training_lock.py").read_text()


def lock(*args: str, timeout: float = 60) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)
    return done.returncode, json.loads(done.stdout)


def holder(run_id: str, **extra) -> str:
    return json.dumps(dict({"run_id": run_id, "controller": "ctl.example.internal", "controller_pid": 4242,
                            "user": "awx", "awx_job_id": "77"}, **extra))


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "run" / "stop_training.lock")


def test_acquire_release_and_reenter(path):
    rc, out = lock("acquire", path, holder("a"), 0, 100)
    assert rc == 0 and out["acquired"] and out["changed"]
    assert json.loads(Path(path).read_text())["run_id"] == "a"
    rc, out = lock("acquire", path, holder("a"), 0, 100)
    assert rc == 0 and out["reentered"] and not out["changed"]
    rc, out = lock("release", path, "a")
    assert rc == 0 and out["released"]
    assert not Path(path).exists()
    rc, out = lock("release", path, "a")
    assert rc == 0 and not out["released"]


def test_second_run_fails_after_bounded_wait_naming_the_holder(path):
    lock("acquire", path, holder("a"), 0, 100)
    rc, out = lock("acquire", path, holder("b"), 0.5, 100)
    assert rc == 3 and not out["acquired"]
    assert out["waited"] >= 0.5
    assert "run a" in out["msg"] and "AWX job 77" in out["msg"] and "pid 4242" in out["msg"]
    assert json.loads(Path(path).read_text())["run_id"] == "a"
    rc, out = lock("release", path, "b")
    assert not out["released"] and Path(path).exists(), "a run never removes another run's lock"


def test_second_run_waits_and_gets_the_lock_when_the_first_releases(path):
    lock("acquire", path, holder("a"), 0, 100)
    waiter = subprocess.Popen([sys.executable, "-c", SCRIPT, "acquire", path, holder("b"), "30", "100"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert waiter.poll() is None, "the second run must wait while the first holds the lock"
    lock("release", path, "a")
    out = waiter.communicate(timeout=30)[0]
    assert waiter.returncode == 0
    result = json.loads(out)
    assert result["acquired"] and result["waited"] >= 0.9
    assert json.loads(Path(path).read_text())["run_id"] == "b"


def test_racing_runs_never_both_win(path):
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, "acquire", path, holder("r%d" % i), "0", "100"],
                              stdout=subprocess.PIPE, text=True) for i in range(6)]
    results = [(p.wait(30), json.loads(p.stdout.read())) for p in procs]
    winners = [r for rc, r in results if rc == 0]
    assert len(winners) == 1
    assert json.loads(Path(path).read_text())["run_id"] == winners[0]["holder"]["run_id"]


def test_stale_locks_are_taken_over_and_say_why(path):
    lock("acquire", path, holder("old"), 0, 0.2)
    time.sleep(0.4)
    rc, out = lock("acquire", path, holder("new"), 0, 100)
    assert rc == 0 and out["taken_over"]["holder"]["run_id"] == "old"
    assert "expired" in out["taken_over"]["reason"]
    # A run proven dead by the controller (break id) is taken over at once.
    rc, out = lock("acquire", path, holder("newer"), 0, 100, "new")
    assert rc == 0 and "is gone" in out["taken_over"]["reason"]
    # A break id that names someone else does not break a live lock.
    rc, out = lock("acquire", path, holder("x"), 0, 100, "not-the-holder")
    assert rc == 3


def test_a_torn_lock_file_never_wedges_the_target(path):
    Path(path).parent.mkdir(parents=True)
    Path(path).write_text('{"run_id": "half')
    rc, out = lock("acquire", path, holder("a"), 0, 100)
    assert rc == 0 and out["taken_over"]["reason"] == "unreadable lock file"


@pytest.mark.parametrize("args", [
    ("acquire", "/tmp/x.lock", "not json", "0", "10"),
    ("acquire", "/tmp/x.lock", '{"no_run_id": 1}', "0", "10"),
    ("acquire", "/tmp/x.lock", '{"run_id": "a"}', "-1", "10"),
    ("frobnicate",),
])
def test_bad_usage_is_rc_2_with_a_message(args):
    rc, out = lock(*args)
    assert rc == 2 and out["failed"] and out["msg"]
