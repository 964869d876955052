"""Faults in the stop half on the CT200 lab: ``ansible-playbook`` SIGKILLed after each task of the
``stop_training`` role, then a plain re-run (the real playbook, connection plugin, modules, fake trainer).

The task boundaries come from a reference run of the same play (its ``TASK [...]`` banners, which
the default callback prints as each task starts, skipped ones included): the kill after task k
lands the moment banner k+1 is printed. The whole controller dies: its process group and every
descendant, including ansible-core 2.19's workers, which ``setsid`` themselves out of the group
(one variant kills the process group alone, as ``kill -9 -PGID`` does: any worker it misses must then end
on its own within ``WORKER_EXIT_BOUND_S``, pct_ssh having tied it to its controller).

After each kill, a plain re-run must succeed; a second re-run changes nothing; the re-run's summary
tells the truth (it stopped the processes still running, or says nothing was selected when the
killed run had already stopped the job); the networkd-dispatcher decoy never received a signal (the
lab's signal audit), ``vi``/``watch`` kept their PIDs and are not stopped; every signal a trainer
process received is one of the ladder's rungs, at most once per run that ran the ladder (plus the
launcher's forward of SIGTERM to its workers); the last checkpoint is intact; the run lock is free.

Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from tests.support import ct200, playbook, ssh
from tests.support import lab as lab_support
from tests.support import stop_training as stop
from tests.support.stop_faults import (
    RUNG_SIGNALS,
    WORKER_EXIT_BOUND_S,
    audit,
    audit_boot,
    audited,
    checkpoint_ok,
    controller_tree,
    stopped_states,
    workers_gone_within_bound,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]


BEHAVIOUR = "stubborn"  # workers ignore SIGINT/SIGTERM: every rung of the ladder runs
# Short rungs so the per-point loop fits CI (the role's defaults are the incident's 60/30/10 s).
LADDER = [{"signal": "SIGINT", "via": "tmux", "timeout": 2},
          {"signal": "SIGTERM", "timeout": 2},
          {"signal": "SIGKILL", "timeout": 5}]
CATCHABLE_RUNGS = sum(1 for r in LADDER if r["signal"] != "SIGKILL")
FAULT_VARS = dict(stop.FAST, stop_training_ladder=LADDER, stop_training_lock_timeout=30)
BANNER = re.compile(r"^TASK \[(.+?)\]", re.M)
# the ladder's own bound: its rungs plus the GPU wait (stop_training_gpu_timeout) plus the lock wait
LADDER_BOUND = sum(r["timeout"] for r in LADDER) + FAULT_VARS["stop_training_gpu_timeout"] + 30


@pytest.fixture(scope="module")
def lab(lab):
    """The shared ``lab`` with the signal audit; the default trainer put back afterwards."""
    yield from audited(lab)


def run_until_banner(k: int) -> tuple[subprocess.Popen, list[str]]:
    """Start the play; return once banner k+1 (the start of the task after task k) is printed."""
    proc = stop.start(FAULT_VARS)
    seen: list[str] = []
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        m = BANNER.match(line)
        if m:
            seen.append(m.group(1))
            if len(seen) == k + 1:
                return proc, seen
        if time.monotonic() > deadline:
            break
    return proc, seen  # the play ended before banner k+1


def check_point(lab, figures, name: str, k: int, with_workers: bool, reference: list[str]) -> None:
    started = lab_support.trainer(BEHAVIOUR)
    job = set(started["pids"]["workers"]) | {started["pids"]["launcher"]}
    decoys_before = ct200.decoy_pids(lab)
    t0 = time.monotonic()
    proc, seen = run_until_banner(k)
    assert len(seen) == k + 1, f"{name}: the play ended after {len(seen)} tasks, the reference run had {len(reference)}"
    workers = {} if with_workers else controller_tree(proc.pid)  # the task's worker, if it is forked yet
    playbook.kill_playbook(proc, with_workers)
    figures.injected(name)
    if workers:  # left out of the kill: pct_ssh ties each to its controller, so they end on their own
        figures.wait("workers gone after their controller's group was killed", workers_gone_within_bound(workers),
                     WORKER_EXIT_BOUND_S)
    killed_after = seen[k - 1]
    left = ct200.trainer_pids(lab) & job

    rc, out = stop.play(FAULT_VARS)
    assert rc == 0, f"{name} (after '{killed_after}'): re-run failed:\n{out[-4000:]}"
    figures.wait("kill + re-run of the stop half", time.monotonic() - t0, LADDER_BOUND + 300)
    # the summary tells the truth about what was still running
    if left:
        assert re.search(r"Stopped: \d+ process\(es\)", out), \
            f"{name}: {len(left)} processes were running, the summary does not say it stopped them:\n{out[-3000:]}"
    else:
        assert "Stopped: nothing, no process was selected" in out, out[-3000:]
    assert not ct200.trainer_pids(lab), f"{name}: trainer processes survived the re-run"
    rc2, out2 = stop.play(FAULT_VARS)
    assert rc2 == 0 and playbook.recap(out2)["changed"] == 0, f"{name}: the second re-run changed something:\n{out2[-3000:]}"
    assert ct200.lock_holder(lab) is None

    # nothing outside the job was signalled; the job only by the rungs
    wrong = 0
    records = [r for r in audit(lab) if r["boot_id"] == audit_boot(lab)]
    for rec in records:
        if rec["role"] == "networkd-dispatcher" and rec["pid"] in decoys_before and rec["signals"]:
            wrong += 1
    now = ct200.decoy_pids(lab)
    wrong += len(set(decoys_before) - set(now)) + len(stopped_states(lab, now))
    ladders = 1 + (1 if left else 0)  # the killed run may have run it; the re-run did if anything was left
    for rec in records:
        if rec["pid"] in job and rec["role"] != "networkd-dispatcher":
            assert set(rec["signals"]) <= RUNG_SIGNALS, f"{name}: {rec['role']} got {rec['signals']}"
            forward = 1 if rec["role"].startswith("worker") else 0  # the launcher's SIGTERM to its workers
            assert rec["signals"].count("SIGTERM") <= ladders + forward, f"{name}: {rec}"
            assert rec["signals"].count("SIGINT") <= ladders, f"{name}: {rec}"
            assert rec["signals"].count("SIGCONT") <= ladders * CATCHABLE_RUNGS, f"{name}: {rec}"
    assert wrong == 0, f"{name}: decoys signalled or gone: before {decoys_before}, now {now}"
    assert checkpoint_ok(lab), f"{name}: a checkpoint does not verify"
    figures.survived(name, wrongly_signalled=wrong)


FULL = os.environ.get("GPUOPS_FAULTS_FULL") == "1"


def kill_points(reference: list[str]) -> list[int]:
    """k for "killed after task k": every task of the play with GPUOPS_FAULTS_FULL=1 (about 50 points, over an
    hour on the lab); by default, to fit CI's budget, the two points where a killed run leaves the most behind:
    the run lock held (after "Take the run lock") and the job stopped with the GPU wait not done (after
    the ladder). A kill before the lock leaves nothing in CT200; one after the unlock leaves a finished run."""
    if FULL:
        return list(range(1, len(reference)))
    after = ("Take the run lock", "Run the stop-verify-kill ladder")
    points = {k + 1 for k, name in enumerate(reference) if any(a in name for a in after)}
    return sorted(k for k in points if k < len(reference))


def kill_variants(points: list[int]) -> list[tuple[int, bool]]:
    """(k, with_workers) to run. Full: both variants at the first point, the whole controller at the others.
    CI: each variant once, at a different point: the process group alone (its setsid'd workers left running)
    while the run lock is held, the whole controller after the ladder; both points and both variants are
    covered, not their cross product."""
    if FULL:
        return [(k, with_workers) for n, k in enumerate(points) for with_workers in ((True, False) if n == 0 else (True,))]
    return [(k, n != 0) for n, k in enumerate(points)]


def test_playbook_sigkilled_after_each_task_then_rerun(lab, figures):
    lab_support.trainer(BEHAVIOUR)
    rc, out = stop.play(FAULT_VARS)
    assert rc == 0, out[-4000:]
    reference = BANNER.findall(out)
    assert len(reference) > 5, out[-3000:]
    points = kill_points(reference)
    figures.note("stop half tasks (reference run)", reference)
    figures.note("stop half kill points", points)
    assert len(points) == 2 or FULL, (points, reference)  # the lock and the ladder are both in the play
    failures = []
    for k, with_workers in kill_variants(points):
        name = "ansible-playbook SIGKILLed after task %d%s" % (k, "" if with_workers else " (workers left)")
        try:
            check_point(lab, figures, name, k, with_workers, reference)
        except AssertionError as exc:
            failures.append(f"{name} ('{reference[k - 1]}'): {exc}"[:2000])
            figures.failed(name, failures[-1])
    assert not failures, "\n\n".join(failures)


# CI reboots CT200 during the ladder (the stop half's own bounded loop, which nothing host-side covers);
# gpu_free_wait's mid-wait faults run host-side in CI (test_gpu_faults.py), its reboot case in the full mode.
REBOOT_POINTS = [pytest.param("Stop | Run the stop-verify-kill ladder", id="ladder"),
                 pytest.param("Stop | Wait until every GPU's memory is released", id="gpu_free_wait",
                              marks=pytest.mark.skipif(not FULL, reason="full mode only (GPUOPS_FAULTS_FULL=1): "
                                                       "CI's budget runs the ladder's reboot case"))]


@pytest.mark.parametrize("during", REBOOT_POINTS)
def test_ct200_rebooted_by_someone_else_during_the_stop(lab, figures, during):
    """Someone reboots CT200 (``pct reboot`` on the PVE host) while the ladder or the GPU wait runs:
    the play ends within its bounds (no hang), and a plain re-run is ok and converges."""
    started = lab_support.trainer(BEHAVIOUR)
    job = set(started["pids"]["workers"]) | {started["pids"]["launcher"]}
    # a GPU held outside the job keeps gpu_free_wait waiting (the reboot lands in it, not after it)
    if "GPU" in during:
        ssh.in_ct(lab, "sh", "-c",
                  "setsid -f python3 /opt/lab/fakegpu/fakegpu.py hold --gpu 5 --mib 12345 >/dev/null 2>&1 </dev/null")
    name = f"CT200 rebooted during {during.split('| ')[1]}"
    t0 = time.monotonic()
    proc = stop.start(dict(FAULT_VARS, stop_training_restart_container=False))
    try:
        playbook.read_until(proc, f" : {during}]", timeout=300)
        time.sleep(1.0)  # inside the task
        rebooted = ssh.on_host(lab, "pct reboot 200 --timeout 30", timeout=300, check=False)
        figures.injected(name)
        assert rebooted.returncode == 0, rebooted.stderr
        out, _err = proc.communicate(timeout=LADDER_BOUND + 120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    waited = time.monotonic() - t0
    figures.wait(f"play with CT200 rebooted during {during}", waited, LADDER_BOUND + 120)
    try:
        # the reboot ended the job and the stray GPU holder; the lab puts its trainer and decoys back
        up = lab_support.lab_cli("up", timeout=600)
        assert up.returncode == 0, up.stderr + up.stdout
        assert not (ct200.trainer_pids(lab) & job)
        rc, out = stop.play(FAULT_VARS)
        assert rc == 0, out[-4000:]
        rc2, out2 = stop.play(FAULT_VARS)
        assert rc2 == 0 and playbook.recap(out2)["changed"] == 0, out2[-3000:]
        assert ct200.lock_holder(lab) is None
        records = [r for r in audit(lab) if r["boot_id"] == audit_boot(lab) and r["role"] == "networkd-dispatcher"]
        assert all(not r["signals"] for r in records), records
        figures.survived(name)
    finally:
        lab_support.lab_cli("up", timeout=600)
