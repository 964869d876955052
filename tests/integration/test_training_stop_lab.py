# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""training_stop on the lab's PVE host, scoped with ``container: 200``, while CT201 runs the same command line.

The module runs through real ``ansible`` over the lab's sshd (the "PVE host"),
where it sees every container's processes under host PIDs. CT201 is started
(if it was stopped), gets the trainer pushed with ``pct push`` and runs the
exact command line CT200's trainer runs, with its fake GPUs in a private state
directory (so the shared fake GPUs stay as other tests expect). Afterwards the
CT200 trainer is restarted with the behaviour it had, CT201's trainer is killed
by the PIDs this test saw start, and CT201 is stopped again if it was stopped.
The lab itself is never brought down. Skipped when the lab is not up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from fake_trainer import verify_checkpoint
from trainer_harness import alive, cmdline

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    container_vmid_from_cgroup,
    iter_processes,
)
from tests.support.lab import DECOY_CT, MAIN_CT, lab_cli, lab_lock
from tests.support.paths import TRAINER_DIR
from tests.support.playbook import run_adhoc
from tests.support.ssh import on_host as ssh
from tests.support.wait import wait_for

TRAINER = str(TRAINER_DIR / "fake_trainer.py")
# the lane's containers as the module and /proc/PID/cgroup number them: CT200 and CT201 in lane 0
MAIN_VMID, DECOY_VMID = int(MAIN_CT), int(DECOY_CT)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

PRECISE = r"^\S*python3 /opt/lab/trainer/fake_trainer\.py "
# short rungs: a slow checkpoint is protected by progress_paths, not by a long first rung
LADDER = [{"signal": "SIGINT", "timeout": 3}, {"signal": "SIGTERM", "timeout": 5}, {"signal": "SIGKILL", "timeout": 5}]


def trainer_procs(vmid: int) -> dict[int, int]:
    """Host pid -> start time of the fake trainer's processes in container ``vmid``."""
    found = {}
    for info in iter_processes():
        if container_vmid_from_cgroup(info.cgroup) == vmid and re.search(PRECISE, info.command):
            found[info.pid] = info.starttime
    return found


def trainer_jobs() -> dict[int, frozenset]:
    """Container (VMID) -> the (pid, start time) of each process running the fake trainer's command line there:
    this lane's CT200, its CT201 twin and CT210 when the two-node lab is up, and any other lab lane's containers
    (one machine plays every lane's hosts). Two equal snapshots mean no trainer started or stopped between them."""
    jobs: dict[int, set] = {}
    for info in iter_processes():
        vmid = container_vmid_from_cgroup(info.cgroup) if re.search(PRECISE, info.command) else None
        if vmid is not None:
            jobs.setdefault(vmid, set()).add((info.pid, info.starttime))
    return {vmid: frozenset(procs) for vmid, procs in jobs.items()}


def same(procs: dict[int, int]) -> bool:
    """Every process still alive as the same process (pid + start time, not a zombie)."""
    return all(alive(pid, start) for pid, start in procs.items())


def module_on_host(status: dict, args: dict, check_mode: bool = False) -> dict:
    """Run the module on the lab's PVE host through real ansible; the parsed result."""
    done = run_adhoc("lab-pve", "gpuops.repurpose.training_stop", args, check=check_mode, options=["-o"])
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("lab-pve | ")]
    assert line, done.stdout + done.stderr
    result = json.loads(line[0].split(" => ", 1)[1])
    result["ansible_rc"] = done.returncode
    return result


def trainer_behaviour(procs: dict[int, int]) -> str | None:
    """The --behaviour on the running launcher's own command line (the lab's status may be stale)."""
    for pid in procs:
        match = re.search(r"--behaviour (\S+)", cmdline(pid))
        if match and "--worker" not in cmdline(pid):
            return match.group(1)
    return None


@pytest.fixture
def twin(lab):
    """CT201 running CT200's exact trainer command line; CT201 restored afterwards."""
    before = lab["containers"].get(DECOY_CT)
    command = lab["trainer"]["command"]
    started: dict[int, int] = {}
    try:
        if before != "running":
            ssh(lab, "pct", "start", DECOY_CT)
            wait_for(lambda: "running" in ssh(lab, "pct", "status", DECOY_CT).stdout, 60, f"CT{DECOY_CT} running")
        ssh(lab, "pct", "exec", DECOY_CT, "--", "mkdir", "-p", "/opt/lab/trainer", "/root/dflash/checkpoints",
            "/root/dflash/data")
        # the command's --data must exist (the lab's trainer_command names its TRAINER_DATA)
        ssh(lab, "pct", "exec", DECOY_CT, "--", "touch", "/root/dflash/data/train-v1.jsonl")
        ssh(lab, "pct", "push", DECOY_CT, TRAINER, "/opt/lab/trainer/fake_trainer.py")
        # the same argv; only the environment differs (private fake GPUs inside CT201)
        script = ("export FAKEGPU_DIR=/tmp/fakegpu-ct201; python3 /opt/lab/fakegpu/fakegpu.py init --count 8 >/dev/null;"
                  " cd /root/dflash; setsid %s </dev/null >/tmp/trainer.log 2>&1 &" % command)
        ssh(lab, "pct", "exec", DECOY_CT, "--", "sh", "-c", script)
        started.update(wait_for(lambda: len(trainer_procs(DECOY_VMID)) == 9 and trainer_procs(DECOY_VMID), 60,
                                f"CT{DECOY_CT} trainer with 8 workers"))
        yield started
    finally:
        for pid, start in started.items():
            if not alive(pid, start):  # gone (or the pid reused: with pid_max 32768 it comes round in minutes)
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if before != "running":
            ssh(lab, "pct", "stop", DECOY_CT, check=False)


def ensure_ct200_trainer(lab: dict) -> dict[int, int]:
    procs = trainer_procs(MAIN_VMID)
    if len(procs) != 9:
        behaviour = lab.get("trainer", {}).get("behaviour") or "graceful"
        lab_cli("trainer", behaviour)
        procs = trainer_procs(MAIN_VMID)
    return procs


EXPECTED = {"graceful": "SIGINT", "slow_checkpoint": "SIGINT", "orphans": "SIGTERM", "respawn": "SIGTERM",
            "stubborn": "SIGKILL"}


def test_container_scope_stops_ct200_only(lab, twin):
    """The lab lock keeps 'lab trainer' away from CT200 meanwhile. Other lanes' trainers are counted by the broad
    match too (one machine plays every lane's host); a count that another lane's test disturbed (a trainer of its
    (re)started or stopped during the module's run) is retried, and five disturbed attempts fail the test."""
    ckpt = os.path.join(lab["lxcpath"], MAIN_CT, "rootfs", "root", "dflash", "checkpoints")
    try:
        for _attempt in range(5):
            ensure_ct200_trainer(lab)
            with lab_lock(lab):
                ct200 = trainer_procs(MAIN_VMID)
                behaviour = trainer_behaviour(ct200)
                if len(ct200) != 9 or behaviour not in EXPECTED:
                    continue
                # the same regex without the scope is one job per container running it (CT200, its CT201 twin,
                # and CT210 when the two-node lab is up: one machine plays both hosts, so this host sees its
                # processes too; so are other lab lanes' containers): refused, nothing signalled
                jobs = trainer_jobs()
                broad = module_on_host(lab, {"match": PRECISE, "ladder": LADDER})
                if trainer_jobs() != jobs:
                    continue  # another lane's trainer (re)started or stopped meanwhile: its count is not judged
                assert broad["ansible_rc"] != 0 and broad["msg"].startswith(
                    "match hits %d unrelated process groups" % len(jobs)), (sorted(jobs), broad["msg"])
                # a loose regex inside CT200 also hits the lab's editor decoy (vi with the script open): refused
                loose = module_on_host(lab, {"container": MAIN_VMID, "match": r"fake_trainer\.py",
                                             "ladder": LADDER})
                assert loose["ansible_rc"] != 0 and re.search(r"program vi\b", loose["msg"]), loose["msg"]
                plan = module_on_host(lab, {"container": MAIN_VMID, "match": PRECISE, "ladder": LADDER},
                                      check_mode=True)
                assert plan["ansible_rc"] == 0
                assert same(twin), "CT201's trainer was touched"
                if not same(ct200) or sorted(e["pid"] for e in plan["selected"]) != sorted(ct200):
                    continue  # another test restarted or stopped CT200's trainer meanwhile
                t_before = time.time()
                # progress_paths: the checkpoint directory as the PVE host sees it (the container's rootfs)
                result = module_on_host(lab, {"container": MAIN_VMID, "match": PRECISE, "ladder": LADDER,
                                              "progress_paths": [ckpt], "progress_stall": 3})
                assert result["ansible_rc"] == 0, result
                assert sorted(e["pid"] for e in result["selected"]) == sorted(ct200)
                assert result["stopped_by"] == EXPECTED[behaviour], (behaviour, result["rungs"])
                assert result["unkillable"] == [] and result["pidfd"] is True and not same(ct200)
                assert same(twin), "CT201's trainer was touched"
                log = ssh(lab, "pct", "exec", DECOY_CT, "--", "cat", "/tmp/trainer.log").stdout
                assert "got SIG" not in log and "step " in log
                if behaviour != "stubborn":
                    with open(os.path.join(ckpt, "latest")) as handle:
                        path = os.path.join(ckpt, handle.read().strip())
                    assert verify_checkpoint(path) >= 682 and os.path.getmtime(path) >= t_before - 1
                if behaviour == "slow_checkpoint":
                    assert result["rungs"][0]["extended_by"] > 0
                return
        pytest.fail("CT200's trainer kept changing under the test (a lane runs one test at a time); nothing was judged")
    finally:
        ensure_ct200_trainer(lab)
