# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""module_utils/_lock.py with real files, real flock and real processes (no lab needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import (
    LockError,
    LockHeld,
    acquire,
    controller_alive,
    controller_identity,
    controller_pid,
    describe,
    flock_within,
    guarded,
    new_run_id,
    open_lock_file,
    read,
    release,
    run_to_take_over,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_starttime
from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

ENV = dict(os.environ, PYTHONPATH=str(ROOT / ".collections"))
OWNER = {"controller": "ctl.example.internal", "controller_pid": 4242, "user": "awx", "awx_job_id": "77"}

# Another run, in its own process: acquire (printing the result as JSON) or hold a flock until killed.
ACQUIRE = """
import json, sys
from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import LockHeld, acquire
print("acquiring", file=sys.stderr, flush=True)  # the caller times its wait from here, not from the spawn
try:
    print(json.dumps(acquire(sys.argv[1], sys.argv[2], {}, float(sys.argv[3]), 100.0)))
except LockHeld as exc:
    print(json.dumps({"acquired": False, "msg": str(exc)}))
"""
HOLD_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
"""


def other_run(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(ACQUIRE), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, stdin=subprocess.DEVNULL)


def acquiring(proc: subprocess.Popen) -> None:
    """Return once the other run has imported the lock code and is calling acquire (its wait starts here)."""
    assert proc.stderr.readline().strip() == "acquiring"


def hold_flock(path: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD_FLOCK), path, str(seconds)],
                            stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def on_disk(path: str) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "run" / "stop_training.lock")


# ------------------------------------------------------------------ leases on the target

def test_acquire_release_and_reenter(path):
    out = acquire(path, "a", OWNER, 0, 100)
    assert out["acquired"] and out["changed"] and "waited_for_other_run" not in out
    assert on_disk(path)["run_id"] == "a" and on_disk(path)["controller_pid"] == 4242
    assert on_disk(path)["expires_at"] - on_disk(path)["acquired_at"] == 100
    out = acquire(path, "a", OWNER, 0, 100)
    assert out["reentered"] and out["acquired"] and not out["changed"]
    assert read(path)["description"].startswith(
        "run a, AWX job 77, by awx on controller ctl.example.internal (ansible-playbook pid 4242), since ")
    out = release(path, "a")
    assert out["released"] and out["changed"] and not Path(path).exists()
    out = release(path, "a")
    assert not out["released"] and not out["changed"]
    assert read(path) == {"changed": False, "holder": None, "description": "nobody"}


def test_second_run_fails_after_the_bounded_wait_naming_the_holder(path):
    acquire(path, "a", OWNER, 0, 100)
    started = time.monotonic()
    with pytest.raises(LockHeld) as held:
        acquire(path, "b", OWNER, 0.5, 100)
    assert 0.5 <= time.monotonic() - started < 5
    assert held.value.waited >= 0.5 and held.value.holder["run_id"] == "a"
    assert "run a" in str(held.value) and "AWX job 77" in str(held.value) and "pid 4242" in str(held.value)
    assert on_disk(path)["run_id"] == "a"
    out = release(path, "b")
    assert not out["released"] and "left alone" in out["msg"] and Path(path).exists(), "never removes another's lock"


def test_second_run_waits_and_gets_the_lock_when_the_first_releases(path):
    acquire(path, "a", OWNER, 0, 100)
    waiter = other_run(path, "b", "30")
    # under load the interpreter's start can take a good part of a second: the wait is timed from acquire
    acquiring(waiter)
    time.sleep(1.0)
    assert waiter.poll() is None, "the second run must wait while the first holds the lock"
    release(path, "a")
    result = json.loads(waiter.communicate(timeout=30)[0])
    assert result["acquired"] and result["waited"] >= 0.9 and result["waited_for_other_run"]
    assert on_disk(path)["run_id"] == "b"


def test_racing_runs_never_both_win(path):
    procs = [other_run(path, "r%d" % i, "0") for i in range(6)]
    results = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    winners = [r for r in results if r["acquired"]]
    assert len(winners) == 1
    assert on_disk(path)["run_id"] == winners[0]["holder"]["run_id"]


def test_stale_locks_are_taken_over_and_say_why(path):
    acquire(path, "old", OWNER, 0, 0.2)
    time.sleep(0.4)
    out = acquire(path, "new", OWNER, 0, 100)
    assert out["taken_over"]["holder"]["run_id"] == "old" and "expired" in out["taken_over"]["reason"]
    # A run the controller proved dead (take_over) goes at once.
    out = acquire(path, "newer", OWNER, 0, 100, take_over="new")
    assert out["taken_over"]["reason"] == "its ansible-playbook process (pid 4242 on ctl.example.internal) is gone"
    # A take_over naming someone else does not break a live lock.
    with pytest.raises(LockHeld):
        acquire(path, "x", OWNER, 0, 100, take_over="not-the-holder")
    assert on_disk(path)["run_id"] == "newer"


@pytest.mark.parametrize("junk", ['{"run_id": "half', "[1, 2]", ""])
def test_a_torn_lock_file_never_wedges_the_target(path, junk):
    Path(path).parent.mkdir(parents=True)
    Path(path).write_text(junk)
    assert read(path)["description"] == "an unreadable lock file"
    out = acquire(path, "a", OWNER, 0, 100)
    assert out["taken_over"]["reason"] == "unreadable lock file" and on_disk(path)["run_id"] == "a"


def test_check_mode_writes_nothing_and_says_what_a_run_would_do(path):
    out = acquire(path, "a", OWNER, 30, 100, check_mode=True)
    assert out["changed"] and not out["acquired"] and not Path(path).exists()
    acquire(path, "a", OWNER, 0, 100)
    started = time.monotonic()
    out = acquire(path, "b", OWNER, 30, 100, check_mode=True)
    assert time.monotonic() - started < 5, "check mode never waits"
    assert out["would_wait"] and not out["acquired"] and not out["changed"] and "run a" in out["msg"]
    assert out["description"].startswith("run a, AWX job 77")
    out = acquire(path, "b", OWNER, 0, 100, take_over="a", check_mode=True)
    assert out["changed"] and out["taken_over"]["holder"]["run_id"] == "a" and on_disk(path)["run_id"] == "a"
    out = release(path, "a", check_mode=True)
    assert out["changed"] and not out["released"] and on_disk(path)["run_id"] == "a"


@pytest.mark.parametrize("args, option", [
    (("", 0, 10), "run_id"),
    (("a", -1, 10), "timeout"),
    (("a", 0, 0), "expiry"),
])
def test_bad_input_names_the_option(path, args, option):
    with pytest.raises(LockError, match="^%s: " % option):
        acquire(path, args[0], OWNER, args[1], args[2])
    assert not Path(path).exists()


def test_an_unusable_directory_names_the_option(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(LockError, match=r"^path: cannot create .*give a writable directory"):
        acquire(str(tmp_path / "file" / "sub" / "x.lock"), "a", OWNER, 0, 10)


# ------------------------------------------------------------------ flock with a bounded wait

def test_flock_within_waits_at_most_its_timeout_and_notes_the_holder_once(tmp_path):
    lock = str(tmp_path / "k.lock")
    holder = hold_flock(lock, 30)
    fd = open_lock_file(lock, "lock_dir")
    noted = []
    try:
        started = time.monotonic()
        assert flock_within(fd, 0.5, on_busy=lambda: noted.append(1)) is False
        assert 0.5 <= time.monotonic() - started < 5 and noted == [1]
    finally:
        holder.kill()
        holder.wait()
        os.close(fd)


def test_flock_within_takes_the_lock_when_the_holder_dies(tmp_path):
    lock = str(tmp_path / "k.lock")
    holder = hold_flock(lock, 0.5)  # exits while we wait: the kernel drops its flock
    fd = open_lock_file(lock, "lock_dir")
    try:
        assert flock_within(fd, 20) is True
        holder.wait(10)
    finally:
        os.close(fd)


def test_a_stuck_guard_fails_naming_it(path):
    os.makedirs(os.path.dirname(path))
    holder = hold_flock(path + ".guard", 30)
    try:
        with pytest.raises(LockError, match=r"^path: .*\.guard stayed locked for 0.3s"):
            with guarded(path, timeout=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------ the controller side

FORKED = """
import os, sys, time
if os.fork() == 0:
    print(os.getpid(), flush=True)  # a worker: same command line as its parent
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


def test_controller_pid_is_the_top_of_the_forked_chain():
    main = subprocess.Popen([sys.executable, "-c", FORKED, "ansible-playbook", "site.yml"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        worker = int(main.stdout.readline())
        assert controller_pid(worker) == main.pid  # this test process has another command line: the climb stops
        assert controller_pid(main.pid) == main.pid
        identity = controller_identity(worker, "ctl.example.internal")
        assert identity == {"controller": "ctl.example.internal", "controller_pid": main.pid,
                            "controller_started": read_starttime(main.pid)}
        assert controller_alive(identity)
    finally:
        os.killpg(main.pid, 9)
        main.wait()
    assert not controller_alive(identity), "the same PID and start time no longer run"
    assert controller_pid(main.pid) == 0


def test_controller_alive_judges_by_pid_and_start_time():
    me = controller_identity(os.getpid(), "ctl")
    assert controller_alive(me)
    assert not controller_alive(dict(me, controller_started=me["controller_started"] - 1)), "a reused PID"
    # recorded without a start time: alive while that PID runs something called ansible
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ansible-playbook"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert controller_alive({"controller_pid": decoy.pid})
        assert not controller_alive({"controller_pid": plain.pid})
    finally:
        for proc in (decoy, plain):
            proc.kill()
            proc.wait()
    assert not controller_alive({"controller_pid": decoy.pid})
    for doubt in (0, -1, "x", None):
        assert controller_alive({"controller_pid": doubt}), "never take over on doubt"


@pytest.mark.parametrize("holder, dead, expected", [
    ({"run_id": "r1", "controller": "ctl", "controller_pid": 10}, True, "r1"),
    ({"run_id": "r1", "controller": "ctl", "controller_pid": 10}, False, ""),
    ({"run_id": "r1", "controller": "other", "controller_pid": 10}, True, ""),  # judged only where it ran
    ({"run_id": "me", "controller": "ctl", "controller_pid": 10}, True, ""),  # our own run
    ({"run_id": "r1", "controller": "ctl", "controller_pid": 0}, True, ""),
    ({"run_id": "r1", "controller": "ctl", "controller_pid": "junk"}, True, ""),
    ({"run_id": "", "unknown": True}, True, ""),
    (None, True, ""),
])
def test_run_to_take_over(holder, dead, expected):
    assert run_to_take_over(holder, {"controller": "ctl", "run_id": "me"}, lambda h: not dead) == expected


def test_new_run_id_and_describe():
    assert new_run_id(4242, 0, 1234567) == "4242-19700101T000000-234567"
    assert describe(None) == "nobody"
    assert describe({"run_id": "r", "user": "u", "controller": "c", "controller_pid": 1}) == \
        "run r, by u on controller c (ansible-playbook pid 1)"
