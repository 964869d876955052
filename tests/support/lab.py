"""The CT200 lab as tests see it: its status, the one skip rule, its trainer.

``tests/lab/lab status`` prints what a client needs (host, port, key, known_hosts,
lxcpath, containers, the trainer's PIDs, the fake GPUs' directory...). Status
changes while tests run (a trainer restart gives new PIDs), so :func:`lab_status`
reads it afresh; the ``lab`` fixture (tests/conftest.py) reads it once per test module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

from tests.support.paths import LAB_CLI, LANE

# This process's lane of the lab (tests/support/paths.py select_lane; tests/lab/lanes.py): its containers,
# users and addresses. A test names them through these (or the ``lab`` fixture's status), never lane 0's.
MAIN_CT = LANE.main_ct  # CT200 of lane 0
DECOY_CT = LANE.decoy_ct  # CT201, the stopped decoy
# the second lab node's GPU container (`tests/lab/lab up --nodes 2`): CT210
NODE2_CT = LANE.node2_ct
SUDO_USER = LANE.sudo_user  # pveops: sudo NOPASSWD for pct only
NOSUDO_USER = LANE.nosudo_user  # pvenosudo: no sudo rule
NARROW_USER = LANE.narrow_user  # pvenarrow: sudo for examples/pve-host/pct-narrow only, CT200 only
# the address each lab node's datagen services (SGLang workers, router, metrics) bind: 127.0.0.1 and 127.0.0.2
DATAGEN_HOST, DATAGEN_HOST2 = LANE.datagen_hosts
DEFAULT_BEHAVIOUR = "graceful"


def lab_status() -> Optional[dict]:
    """The lab's status, or None when there is no lab CLI or it gives no JSON (not root, never set up)."""
    if not LAB_CLI.exists():
        return None
    try:
        done = subprocess.run([str(LAB_CLI), "status"], capture_output=True, text=True, timeout=60, check=False)
        status = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return status if isinstance(status, dict) else None


def skip_reason(status: Optional[dict], euid: Optional[int] = None) -> Optional[str]:
    """Why a lab test cannot run, or None when it can.

    The one rule for every lab test, the strictest of the seven the suites had:
    root (lxc-attach, the lab's flock and the fake GPUs' state need it), a status
    that parses, ``up`` (the PVE host's sshd and CT200 both alive) and CT200
    running. The ``up`` flag alone was not enough for the tests that go straight
    into CT200 (``lxc-attach``/``pct exec``); naming CT200 keeps that explicit.
    """
    if (os.geteuid() if euid is None else euid) != 0:
        return "the CT200 lab needs root"
    if status is None:
        return "tests/lab/lab status gave no status (run: tests/lab/lab up as root)"
    if not status.get("up") or status.get("containers", {}).get(MAIN_CT) != "running":
        return "the CT200 lab is not up with CT200 running (run: tests/lab/lab up as root)"
    return None


def require_lab() -> dict:
    """The lab's status, or skip the calling test with the reason (see :func:`skip_reason`)."""
    status = lab_status()
    reason = skip_reason(status)
    if reason:
        pytest.skip(reason)
    assert status is not None
    return status


def fleet_skip_reason(status: Optional[dict], euid: Optional[int] = None) -> Optional[str]:
    """Why a two-node (fleet) lab test cannot run, or None when it can: the one lab rule
    (:func:`skip_reason`), then the second node up (``nodes`` 2) with its container CT210 running."""
    reason = skip_reason(status, euid)
    if reason:
        return reason
    assert status is not None
    node2 = status.get("node2") or {}
    if status.get("nodes", 1) < 2 or node2.get("containers", {}).get(NODE2_CT) != "running":
        return "the two-node lab is not up with CT%s running (run: tests/lab/lab up --nodes 2 as root)" % NODE2_CT
    return None


def lab_owned() -> bool:
    """The run owns the lab (``GPUOPS_LAB_CYCLE=1``, as scripts/test sets in CI): it may take it down and up."""
    return os.environ.get("GPUOPS_LAB_CYCLE") == "1"


def require_fleet() -> dict:
    """The two-node lab's status. When only the one-node lab is up and the run owns the lab
    (:func:`lab_owned`), the second node is brought up here (it stays up); otherwise the calling test is
    skipped with the reason (see :func:`fleet_skip_reason`)."""
    status = lab_status()
    reason = fleet_skip_reason(status)
    if reason and skip_reason(status) is None and lab_owned():
        done = lab_cli("up", "--nodes", "2", timeout=900)
        assert done.returncode == 0, "tests/lab/lab up --nodes 2: %s%s" % (done.stdout[-2000:], done.stderr[-2000:])
        status = lab_status()
        reason = fleet_skip_reason(status)
        assert reason is None, reason
    if reason:
        pytest.skip(reason)
    assert status is not None
    return status


def require_stopped(status: dict, vmid: str = DECOY_CT) -> None:
    """Fail the calling test unless container VMID is stopped, as the lab leaves CT201: a lane runs one test at a
    time, so a running CT201 is an earlier test that did not clean up (a defect, not a reason to skip)."""
    assert status.get("containers", {}).get(vmid) == "stopped", \
        "CT%s is running: an earlier test in this lane left it so" % vmid


def lab_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``tests/lab/lab ARGS``, output captured (only test_lab_cycle.py may pass ``down``: the lab is shared)."""
    return subprocess.run([str(LAB_CLI), *args], capture_output=True, text=True, timeout=timeout, check=False)


def _trainer_args(behaviour: str, vmid: str) -> list:
    return ["trainer", behaviour] + ([] if vmid == MAIN_CT else ["--ct", vmid])


def trainer(behaviour: str = DEFAULT_BEHAVIOUR, vmid: str = MAIN_CT) -> dict:
    """(Re)start container VMID's dflash trainer (CT210: the second node's) with BEHAVIOUR; the lab waits for its
    step lines. Its trainer status."""
    done = lab_cli(*_trainer_args(behaviour, vmid))
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def restore_trainer(vmid: str = MAIN_CT) -> None:
    """Leave the lab as other suites expect it: container VMID's default trainer running (best effort, at
    teardown)."""
    lab_cli(*_trainer_args(DEFAULT_BEHAVIOUR, vmid))


def sshd_restart(down_for: float = 0.0) -> dict:
    """The lab PVE host's sshd restarted as ``systemctl restart ssh`` restarts a PVE host's (tests/lab/README.md
    "Faults"): the listener replaced, established sessions kept; DOWN_FOR seconds without a listener. Returns when
    the new one listens: its facts (``old_pid``, ``new_pid``, ``stopped_at``, ``up_at``, ``down_s``)."""
    return sshd_restart_result(start_sshd_restart(down_for), down_for)


def start_sshd_restart(down_for: float) -> subprocess.Popen:
    """:func:`sshd_restart` started in the background (read it with :func:`sshd_restart_result`)."""
    return subprocess.Popen([str(LAB_CLI), "sshd-restart", "--down-for", str(down_for)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)


def sshd_restart_result(proc: subprocess.Popen, down_for: float) -> dict:
    try:
        out, err = proc.communicate(timeout=down_for + 60)  # the lab's own waits: 10 s stop, gap + 30 s start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err + out
    return json.loads(out)


@contextlib.contextmanager
def lab_switched(on: Sequence[str], off: Sequence[str]) -> Iterator[None]:
    """``tests/lab/lab ON...`` (asserted to succeed) until the block ends, then ``tests/lab/lab OFF...`` (asserted
    too): a lab state a test turns on and must always turn off (``lab backup begin|end``, ``lab ha on|off``)."""
    done = lab_cli(*on)
    assert done.returncode == 0, done.stderr + done.stdout
    try:
        yield
    finally:
        done = lab_cli(*off)
        assert done.returncode == 0, done.stderr + done.stdout


@contextlib.contextmanager
def fault(name: str, content: str = "") -> Iterator[Path]:
    """The lab fault NAME (a key of ``lab status``'s ``faults``; tests/lab/README.md "Faults") switched on, with
    CONTENT in its file, until the block ends."""
    path = Path(lab_status()["faults"][name])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def reboot_hang_fault(status: dict, vmid: str = MAIN_CT) -> Iterator[Path]:
    """The lab's reboot-hang fault (tests/lab/README.md "Faults") switched on for container VMID only.

    Always switched off again, and the lab restored: CT200 running (``lab up``) with the default trainer.
    """
    fresh = lab_status() or status
    path = Path(fresh.get("faults", {}).get("reboot_hang")
                or os.path.join(status.get("lab_dir", LANE.lab_dir), "faults", "reboot-hang"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(vmid + "\n", encoding="utf-8")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        if (lab_status() or {}).get("containers", {}).get(MAIN_CT) != "running":
            lab_cli("up")
        trainer(DEFAULT_BEHAVIOUR)


@contextlib.contextmanager
def lab_lock(status: dict, timeout: float = 600) -> Iterator[None]:
    """The lab's own operation lock (tests/lab/labctl/host.py ``Lock``): no ``lab up|trainer`` changes CT200 meanwhile."""
    path = status["lock_file"]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < end, "the lab lock %s stayed busy for %ss" % (path, timeout)
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
