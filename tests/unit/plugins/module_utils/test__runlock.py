"""The module's run lock: a real flock held by another process, a bounded wait, the recorded outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder_lock import (
    RunLock,
    RunLockError,
    describe_holder,
    lock_key,
)

pytestmark = pytest.mark.processes

HOLDER = """
    import fcntl, json, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time() - 42, "selection": "tmux_session=dflash"}).encode())
    print("ready", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(path, seconds):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), path, str(seconds)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def test_lock_key_is_per_container_and_selection():
    one = lock_key({"tmux_session": "dflash", "container": None, "match": "x"})
    assert one == lock_key({"match": "x", "tmux_session": "dflash", "container": None})  # order does not matter
    assert one != lock_key({"tmux_session": "dflash", "container": None, "match": "y"})
    assert one.startswith("training_stop-local-") and lock_key({"container": 200}).startswith("training_stop-ct200-")


def test_a_held_lock_fails_naming_its_holder_after_the_bounded_wait(tmp_path):
    lock = RunLock(str(tmp_path / "locks"), "k")
    os.makedirs(lock.directory)
    other = hold(lock.lock_path, 30)
    try:
        with pytest.raises(RunLockError, match=r"another ladder is still running for this selection: training_stop pid %d "
                                               r"\(started .*, 4\ds ago, selection tmux_session=dflash\); waited 0.3s"
                                               % other.pid):
            lock.acquire(0.3, {"pid": os.getpid()})
        assert lock.fd is None
    finally:
        other.kill()
        other.wait()


def test_the_lock_is_taken_when_the_holder_dies_and_the_outcome_is_recorded(tmp_path):
    lock = RunLock(str(tmp_path / "locks"), "k")
    os.makedirs(lock.directory)
    other = hold(lock.lock_path, 0.5)  # exits (the kernel drops its flock) while we wait
    lock.acquire(20, {"pid": os.getpid(), "started": 1.0, "selection": "s"})
    other.wait()
    try:
        assert lock.waited > 0 and "training_stop pid %d" % other.pid in lock.waited_for
        assert json.load(open(lock.lock_path))["pid"] == os.getpid()  # we describe ourselves to the next one
        assert lock.previous() is None
        lock.record({"pid": other.pid, "state": "running"})
        assert lock.previous()["state"] == "interrupted"  # its process is gone
        lock.record({"pid": os.getpid(), "state": "done", "stopped_by": "SIGKILL"})
        assert lock.previous() == {"pid": os.getpid(), "state": "done", "stopped_by": "SIGKILL"}
    finally:
        lock.release()


def test_an_unusable_lock_dir_names_the_option(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(RunLockError, match=r"^lock_dir: cannot create"):
        RunLock(str(tmp_path / "file" / "sub"), "k").acquire(1, {})
    assert describe_holder(None, 0).startswith("a training_stop run whose record")
