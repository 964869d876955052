# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop_training role's run lock (gpuops.repurpose.run_lock), run as the role runs it.

Real ``ansible`` processes on this host (no lab needed): the action plugin reads
the controller's identity and proves a holder's controller process gone, the
module takes, waits for and releases the lock file. The lease logic itself is
tested in tests/unit/plugins/module_utils/test_lock.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import acquire, controller_identity
from tests.support.paths import ROOT

ANSIBLE = Path(sys.executable).parent / "ansible"


def run_lock(tmp_path: Path, args: dict, check: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    """One ``ansible localhost -m gpuops.repurpose.run_lock`` (a new controller process each time)."""
    tree = tmp_path / ("tree-%d" % len(list(tmp_path.glob("tree-*"))))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree", ANSIBLE_CALLBACK_TREE_DIR=str(tree),
               ANSIBLE_NOCOLOR="1")
    argv = [str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local", "-m", "gpuops.repurpose.run_lock",
            "-a", json.dumps(args), "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", "awx_job_id=77"]
    done = subprocess.run(argv + (["--check"] if check else []), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    result_file = tree / "localhost"
    assert result_file.exists(), "no result (rc %s):\n%s\n%s" % (done.returncode, done.stdout, done.stderr)
    return done, json.loads(result_file.read_text())


def on_disk(path: str) -> dict | None:
    return json.loads(Path(path).read_text()) if Path(path).exists() else None


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "run" / "stop_training.lock")


def test_acquire_reenter_and_release_only_your_own(tmp_path, path):
    done, out = run_lock(tmp_path, {"path": path, "timeout": 0})
    assert done.returncode == 0 and out["acquired"] and out["changed"]
    holder = on_disk(path)
    assert holder["run_id"] == out["run_id"] and holder["run_id"].startswith("%d-" % holder["controller_pid"])
    assert holder["controller"] == os.uname().nodename and holder["awx_job_id"] == "77"
    assert holder["controller_pid"] > 1 and isinstance(holder["controller_started"], int)
    run_id = out["run_id"]
    # The same run (the restart rung takes it again) changes nothing; its holder record stays.
    done, out = run_lock(tmp_path, {"path": path, "run_id": run_id, "timeout": 0})
    assert done.returncode == 0 and out["reentered"] and not out["changed"] and on_disk(path) == holder
    done, out = run_lock(tmp_path, {"path": path, "state": "released", "run_id": "someone-else"})
    assert done.returncode == 0 and not out["released"] and on_disk(path) == holder, "never another run's lock"
    done, out = run_lock(tmp_path, {"path": path, "state": "released", "run_id": run_id})
    assert done.returncode == 0 and out["released"] and on_disk(path) is None


def test_a_live_run_makes_the_next_fail_after_the_bounded_wait_naming_it(tmp_path, path):
    # The holder: this test process, on this controller, alive for the whole test.
    me = dict(controller_identity(os.getpid(), os.uname().nodename), user="awx", awx_job_id="41")
    acquire(path, "live-run", me, 0, 100)
    done, out = run_lock(tmp_path, {"path": path, "timeout": 0.5})
    assert done.returncode != 0 and not out["acquired"]
    assert out["waited"] >= 0.5 and out["holder"]["run_id"] == "live-run"
    assert "run live-run, AWX job 41" in out["msg"] and "ansible-playbook pid %d" % os.getpid() in out["msg"]
    assert on_disk(path)["run_id"] == "live-run"
    # Check mode neither waits nor writes; it says a real run would wait, and for whom.
    done, out = run_lock(tmp_path, {"path": path, "timeout": 300}, check=True)
    assert done.returncode == 0 and out["would_wait"] and not out["acquired"]
    assert out["description"].startswith("run live-run, AWX job 41")


def test_a_run_killed_on_this_controller_is_taken_over_at_once(tmp_path, path):
    # The first run takes the lock and its controller process ends without releasing it.
    done, first = run_lock(tmp_path, {"path": path, "timeout": 0, "expiry": 3600})
    assert done.returncode == 0 and first["acquired"]
    done, out = run_lock(tmp_path, {"path": path, "timeout": 0, "expiry": 3600})
    assert done.returncode == 0 and out["acquired"] and out["run_id"] != first["run_id"]
    assert out["taken_over"]["holder"]["run_id"] == first["run_id"]
    assert out["taken_over"]["reason"] == "its ansible-playbook process (pid %d on %s) is gone" % (
        first["holder"]["controller_pid"], os.uname().nodename)


def test_a_dead_run_of_another_controller_is_left_to_expire(tmp_path, path):
    # Its PID means nothing here: only its own controller could prove it gone.
    acquire(path, "elsewhere", {"controller": "ctl2.example.internal", "controller_pid": 4242, "user": "awx"}, 0, 100)
    done, out = run_lock(tmp_path, {"path": path, "timeout": 0})
    assert done.returncode != 0 and "run elsewhere" in out["msg"] and on_disk(path)["run_id"] == "elsewhere"


@pytest.mark.parametrize("args, message", [
    ({"timeout": -1}, "timeout: must be >= 0"),
    ({"expiry": 0}, "expiry: must be > 0"),
    ({"state": "released"}, "run_id"),
])
def test_bad_input_fails_naming_the_option(tmp_path, path, args, message):
    done, out = run_lock(tmp_path, dict({"path": path}, **args))
    assert done.returncode != 0 and message in out["msg"]
    assert on_disk(path) is None
