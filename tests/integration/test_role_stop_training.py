# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop_training role and playbooks/repurpose_ct200.yml, for real, against the CT200 lab.

Every test runs the real ``ansible-playbook`` (the real connection plugin, the
real modules, the real fake trainer in tmux) and checks what happened inside
CT200 through the lab's PVE host (``ssh`` + ``pct exec``) and in the fake GPU
state. The lab is set up per case with ``tests/lab/lab trainer BEHAVIOUR``
and is never brought down. Skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from tests.support.ct200 import (
    TRAINER_RE,
    ct_processes,
    decoy_pids,
    gpu_used,
    lock_holder,
    pane_pids,
    trainer_pids,
)
from tests.support.lab import DECOY_CT, MAIN_CT, lab_status, require_stopped, trainer
from tests.support.paths import ROOT
from tests.support.playbook import ansible_env, read_until, recap
from tests.support.ssh import in_ct as ct
from tests.support.stop_training import STUBBORN, argv, play, start
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]


# ---------------------------------------------------------------- tests

BAD = [
    pytest.param({"stop_training_vmid": f"{MAIN_CT}; reboot"}, "stop_training_vmid", id="vmid-not-a-number"),
    pytest.param({"proxmox_vmid": "abc"}, "stop_training_vmid", id="inventory-vmid-not-a-number"),
    pytest.param({"stop_training_ladder": [{"signal": "SIGFOO", "timeout": 5}]}, "SIGFOO", id="unknown-signal"),
    pytest.param({"stop_training_ladder": [{"signal": "SIGTERM", "timeout": -1}]}, "every rung timeout must be >= 0",
                 id="negative-rung-timeout"),
    pytest.param({"stop_training_gpu_timeout": -5}, "stop_training_gpu_timeout must be >= 0", id="negative-gpu-timeout"),
    pytest.param({"stop_training_lock_timeout": -1}, "stop_training_lock_timeout must be >= 0", id="negative-lock-timeout"),
    pytest.param({"stop_training_pve_host": "pve9"}, "stop_training_pve_host must name", id="unknown-pve-host"),
]


@pytest.fixture(scope="module")
def graceful_trainer(lab):
    trainer("graceful")
    return lab


@pytest.mark.parametrize(("bad", "named"), BAD)
def test_bad_variables_are_rejected_before_anything_runs(graceful_trainer, bad, named):
    before = trainer_pids(graceful_trainer)
    assert before, "the lab trainer is not running"
    rc, out = play(bad)
    assert rc != 0
    assert named in out
    # Nothing ran on any host: no pre-flight, no lock, no signal.
    assert "Pre-flight |" not in out
    assert lock_holder(graceful_trainer) is None
    assert trainer_pids(graceful_trainer) == before


def test_a_broad_match_is_refused_before_any_signal(graceful_trainer):
    """`python` would also hit the networkd-dispatcher-like daemon: refused, nothing signalled, lock released."""
    before = trainer_pids(graceful_trainer)
    decoys = decoy_pids(graceful_trainer)
    rc, out = play({"stop_training_match": "python", "stop_training_tmux_session": "",
                    "stop_training_ladder": [{"signal": "SIGINT", "timeout": 5}, {"signal": "SIGKILL", "timeout": 5}]})
    assert rc != 0
    assert "Stop | Plan" in out and "Stop | Run the stop-verify-kill ladder" not in out
    assert "networkd-dispatcher" in out and "allow_broad_match" in out
    assert trainer_pids(graceful_trainer) == before
    assert decoy_pids(graceful_trainer) == decoys
    assert lock_holder(graceful_trainer) is None


def test_check_mode_is_a_dry_run_that_shows_the_plan(graceful_trainer):
    before = trainer_pids(graceful_trainer)
    decoys = decoy_pids(graceful_trainer)
    held = gpu_used(graceful_trainer)
    rc, out = play(None, "--check")
    assert rc == 0, out
    assert "DRY RUN (check mode): nothing will be signalled" in out
    assert "Will stop %d process(es)" % len(before) in out or "Will stop" in out
    assert re.search(r"Last step line: step \d+ \|", out), out
    # the summaries say what a real run would do, never that anything was stopped (per host and fleet alike)
    flat = " ".join(out.split())
    busy = "busy 8/8 (0,1,2,3,4,5,6,7)"
    assert f"Would stop {len(before)} process(es) by the ladder; GPUs now {busy}." in flat, out[-3000:]
    assert "FLEET (dry run, nothing was signalled): 1 of 1 container(s) planned" in flat, out[-3000:]
    assert f"ct200 (CT {MAIN_CT} on lab-pve): would stop {len(before)} process(es) by the ladder; GPUs now {busy}" \
        in flat, out[-3000:]
    assert "stopped with their GPUs free" not in flat
    assert trainer_pids(graceful_trainer) == before
    assert decoy_pids(graceful_trainer) == decoys
    assert sum(gpu_used(graceful_trainer).values()) == sum(held.values()) > 0
    assert lock_holder(graceful_trainer) is None


def test_tmux_selection_is_the_module_s_exact_session_pane_shell_kept_prefix_session_untouched(lab):
    """The role passes only tmux_session/match: Ctrl-C ends the job, the pane's shell stays, and a session
    whose name merely starts with "dflash" is never signalled, captured or selected, even once dflash is gone."""
    trainer("graceful")
    ct(lab, "tmux", "kill-session", "-t", "=dflash-eval", check=False)
    # a pane process with a child, as the trainer's pane has: what the role's own pane listing
    # (list-panes -s -t =dflash, which falls back to dflash-eval) used to hand over as pids
    ct(lab, "tmux", "new-session", "-d", "-s", "dflash-eval", "echo 'step 999 | decoy'; sleep 3599; true")
    try:
        decoy = wait_for(lambda: pane_pids(lab, "dflash-eval"), 30, "the decoy session")
        child = wait_for(lambda: [pid for pid, args in ct_processes(lab).items() if args == "sleep 3599"], 30,
                         "the decoy's child")
        shell = pane_pids(lab, "dflash")
        assert len(shell) == 1
        rc, out = play()
        assert rc == 0, out
        assert "by rung SIGINT via tmux" in out, out
        assert re.search(r"Last step line before the first signal: step \d+ \|", out), out
        assert "step 999" not in out and not trainer_pids(lab)
        assert pane_pids(lab, "dflash") == shell and shell[0] in ct_processes(lab)  # the prompt's shell stays

        ct(lab, "tmux", "kill-session", "-t", "=dflash")  # no session: nothing selected, no fallback to dflash-eval
        rc, out = play()
        assert rc == 0, out
        assert "Stopped: nothing, no process was selected" in out and "step 999" not in out
        assert recap(out)["changed"] == 0
        assert pane_pids(lab, "dflash-eval") == decoy and decoy[0] in ct_processes(lab)
        assert child[0] in ct_processes(lab)
    finally:
        ct(lab, "tmux", "kill-session", "-t", "=dflash-eval", check=False)
        trainer("graceful")


def test_rerun_after_the_play_was_killed_between_ladder_and_gpu_check(lab):
    trainer("graceful")
    decoys = decoy_pids(lab)
    first = start()
    try:
        out1 = read_until(first, "Stop | Wait until every GPU's memory is released")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert "Stop | Run the stop-verify-kill ladder" in out1
    assert not trainer_pids(lab), "the ladder had finished before the kill"
    # The killed run could not release its lock; it names the dead ansible-playbook.
    holder = lock_holder(lab)
    assert holder is not None and int(holder["controller_pid"]) == first.pid

    rc, out = play()
    assert rc == 0, out
    assert "took over a stale lock" in out and "is gone" in out
    assert "Stopped: nothing, no process was selected" in out
    assert re.search(r"GPU memory after: +8 GPU\(s\) free", out), out
    assert recap(out)["changed"] == 0
    assert decoy_pids(lab) == decoys
    assert lock_holder(lab) is None


def test_gpu_memory_never_freed_fails_naming_holder_then_restart_rung_recovers(lab):
    trainer("graceful")
    # A process outside the job keeps GPU 5 (a stray notebook, a leaked context).
    ct(lab, "sh", "-c", "setsid -f python3 /opt/lab/fakegpu/fakegpu.py hold --gpu 5 --mib 12345"
       " >/dev/null 2>&1 </dev/null")
    stray = wait_for(lambda: {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a}, 30, "the stray holder")
    rc, out = play({"stop_training_gpu_timeout": 4})
    assert rc != 0
    assert "GPU memory is still held" in out
    assert any("holder pid %d" % pid in out for pid in stray), out
    assert "stop_training_restart_container=true" in out
    assert not trainer_pids(lab), "the job itself was stopped"
    assert {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a} == stray, "the role never kills a holder"

    rc, out = play({"stop_training_gpu_timeout": 10, "stop_training_restart_container": True})
    assert rc == 0, out
    assert f"LAST RUNG WAS NEEDED: CT {MAIN_CT} was restarted" in out
    assert not {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a}
    assert max(gpu_used(lab).values()) <= 512
    assert lab_status()["containers"][MAIN_CT] == "running"


def test_orphaned_ranks_of_a_killed_launcher_are_named_never_success_then_stopped(lab):
    """Issue 11: the launcher is killed -9; its workers keep holding the GPUs and (as real torchrun ranks)
    match no launcher regex. The role names them and fails; with stop_training_gpu_holders=stop it stops them."""
    trainer("graceful")
    procs = ct_processes(lab)
    launcher = [pid for pid, args in procs.items() if TRAINER_RE.search(args) and "--worker" not in args]
    assert len(launcher) == 1, procs
    ct(lab, "kill", "-9", str(launcher[0]))
    workers = wait_for(lambda: trainer_pids(lab) - set(launcher) if not (set(launcher) & trainer_pids(lab)) else None,
                       30, "the launcher gone, its workers left")
    no_match = {"stop_training_match": "", "stop_training_gpu_timeout": 4}
    rc, out = play(no_match)
    assert rc != 0, out
    assert "orphaned ranks" in out and all("pid %d" % pid in out for pid in workers), out
    assert "training stopped, GPUs free" not in out
    assert trainer_pids(lab) == workers, "fail never signals them"

    rc, out = play(dict(no_match, stop_training_gpu_holders="stop", stop_training_gpu_timeout=30))
    assert rc == 0, out
    assert "training stopped, GPUs free" in out
    assert not trainer_pids(lab) and max(gpu_used(lab).values()) <= 512


def test_concurrent_runs_one_fails_naming_the_holder_one_waits(lab):
    trainer("stubborn")
    first = start(STUBBORN)
    try:
        out_a = read_until(first, "Stop | Run the stop-verify-kill ladder")
        holder = lock_holder(lab)
        assert holder is not None and int(holder["controller_pid"]) == first.pid
        # A second run that may wait 1 s fails, naming the run that holds the lock.
        rc_b, out_b = play(dict(STUBBORN, stop_training_lock_timeout=1))
        assert rc_b != 0
        assert "Another run holds the stop_training lock" in out_b
        assert "ansible-playbook pid %d" % first.pid in out_b
        assert "Stop | Plan" not in out_b and "Stop | Run the stop-verify-kill ladder" not in out_b
        # A third run that may wait long enough starts after the first is done, and finds nothing to stop.
        third = start(dict(STUBBORN, stop_training_lock_timeout=300))
        rest_a = first.communicate(timeout=600)[0]
        out_c = third.communicate(timeout=600)[0]
    finally:
        for proc in (first,):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out_a += rest_a
    assert first.returncode == 0, out_a
    assert "by rung SIGKILL" in out_a
    assert third.returncode == 0, out_c
    assert "Stopped: nothing, no process was selected" in out_c
    assert recap(out_c)["changed"] == 0
    assert lock_holder(lab) is None


def test_stopped_container_is_reported_not_started_and_other_hosts_carry_on(lab, tmp_path):
    """CT201 (stopped) fails its own host only; CT200 in the same play is stopped as usual."""
    require_stopped(lab_status() or lab)
    trainer("graceful")
    extra = tmp_path / "ct201.yml"
    extra.write_text(json.dumps({"training_containers": {"hosts": {"ct201": {"proxmox_vmid": int(DECOY_CT)}}}}))
    cmd = argv(None, "-i", str(extra), "-e", "repurpose_serial=2")
    done = subprocess.run(cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"CT {DECOY_CT} on lab-pve is stopped" in out and "never starts a container" in out
    assert recap(out, "ct201")["failed"] == 1
    assert recap(out, "ct200")["failed"] == 0
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free" in out
    assert lab_status()["containers"][DECOY_CT] == "stopped"
    assert not trainer_pids(lab)
