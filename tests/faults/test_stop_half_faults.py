"""Faults in the stop half on the CT200 lab: ``ansible-playbook`` SIGKILLed after each task of the
``stop_training`` role, then a plain re-run (the real playbook, connection plugin, modules, fake trainer);
and CT200 rebooted by someone else during the ladder and during the GPU wait.

The kill after task k lands the moment banner k+1 is printed (the default callback prints ``TASK [...]`` as
each task starts, skipped ones included). The whole controller dies: its process group and every
descendant, including ansible-core 2.19's workers, which ``setsid`` themselves out of the group (one variant
kills the process group alone, as ``kill -9 -PGID`` does: any worker it misses must then end on its own
within ``WORKER_EXIT_BOUND_S``, pct_ssh having tied it to its controller).

Every k is injected with ``GPUOPS_FAULTS_FULL=1``; CI kills after the first and the last task and after
each task that reported ``changed`` in the reference run (:func:`selected_points`: where CT200's state can
differ). After each kill the test takes the fingerprint of what the killed run left in CT200
(``tests/support/stop_faults.LeftBehind``: the job's processes running and stopped, the run lock and
whether its holder lives, a ladder still running, the killed run's ladder record, the GPUs holding
memory). The first point of each distinct fingerprint gets the full re-run checks: a plain re-run
succeeds; its summary tells the truth (it stopped the processes still running, or says nothing was
selected and names the killed run's ladder, its pid and the rung that stopped the job; a stale lock is
reported taken over); no trainer process left; a second re-run changes nothing; the run lock is free;
the networkd-dispatcher decoy never received a signal (the lab's signal audit), ``vi``/``watch`` kept
their PIDs and are not stopped; every signal a trainer process received is one of the ladder's rungs, at
most once per run that ran the ladder (plus the launcher's forward of SIGTERM to its workers); every
checkpoint verifies. A later point whose fingerprint equals a verified one is recorded as "state identical
to point j (verified)" and CT200 is put back cheaply: the stale lock of the dead run is removed only when
the verified re-run took it over in that same state (what that re-run did to it), otherwise the plain
re-run runs; a ladder still running is never put back by hand. The cheap checks run at every point: no
decoy signalled, gone or stopped; no job process stopped (``T``) without a running ladder; the job got only
the rungs; every checkpoint verifies. With ``GPUOPS_FAULTS_FULL=1`` every point gets the full checks.

Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import pytest

from tests.support import ct200, playbook, ssh
from tests.support import lab as lab_support
from tests.support import stop_training as stop
from tests.support.faults import FULL
from tests.support.stop_faults import (
    LOCK_DEAD_HOLDER,
    RUNG_SIGNALS,
    WORKER_EXIT_BOUND_S,
    LeftBehind,
    audit,
    audit_boot,
    audited,
    checkpoint_ok,
    controller_tree,
    ladder_records,
    latest_record,
    my_record,
    read_left_behind,
    stopped_states,
    workers_gone_within_bound,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]


BEHAVIOUR = "stubborn"  # workers ignore SIGINT/SIGTERM: every rung of the ladder runs
# Short rungs so the per-point loop fits CI (the role's defaults are the incident's 60/30/10 s).
LADDER = [{"signal": "SIGINT", "via": "tmux", "timeout": 2},
          {"signal": "SIGTERM", "timeout": 2},
          {"signal": "SIGKILL", "timeout": 5}]
CATCHABLE_RUNGS = sum(1 for r in LADDER if r["signal"] != "SIGKILL")
FAULT_VARS = dict(stop.FAST, stop_training_ladder=LADDER, stop_training_lock_timeout=30)
# the ladder's own bound: its rungs plus the GPU wait (stop_training_gpu_timeout) plus the lock wait
LADDER_BOUND = sum(r["timeout"] for r in LADDER) + FAULT_VARS["stop_training_gpu_timeout"] + 30
# "A-B": only the points A..B of the every-task loop (a by-hand run under the lab lock, in parts); CI runs all
POINTS = os.environ.get("GPUOPS_FAULTS_STOP_POINTS", "")
LOCK_TASK = "Lock | Take the run lock"
LADDER_TASK = "Stop | Run the stop-verify-kill ladder"
STALE_LOCK_TAKEN = "Lock: took over a stale lock"


@pytest.fixture(scope="module")
def lab(lab):
    """The shared ``lab`` with the signal audit; the default trainer put back afterwards."""
    yield from audited(lab)


@dataclass
class Kill:
    """One injected kill: what the test knew before it and what the killed run left (its fingerprint)."""

    name: str
    behaviour: str
    job: Set[int]
    decoys: Set[int]
    since: float  # wall clock when the killed play started (its ladder record is newer)
    t0: float
    left: Optional[LeftBehind] = None
    states: Dict[int, Tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verified:
    """A point whose re-run got the full checks, and what that re-run did to the run lock."""

    k: int
    took_over_stale_lock: bool


def after_task(task: str):
    """DONE for :func:`banners_until`: the banner after TASK's is printed (the kill lands right after TASK)."""
    return lambda seen: len(seen) >= 2 and task in seen[-2]


def start_trainer(behaviour: str) -> Set[int]:
    started = lab_support.trainer(behaviour)
    return set(started["pids"]["workers"]) | {started["pids"]["launcher"]}


def inject(lab, figures, name: str, behaviour: str, job: Set[int], decoys: Set[int], done, with_workers: bool = True,
           before_kill=None) -> Tuple[Kill, List[str]]:
    """Start the play, kill it once DONE(banners) holds (then BEFORE_KILL(kill) returns), take the fingerprint."""
    kill = Kill(name, behaviour, job, decoys, since=time.time(), t0=time.monotonic())
    proc = stop.start(FAULT_VARS)
    seen = playbook.banners_until(proc, done)
    if not done(seen):
        playbook.kill_playbook(proc)
        raise AssertionError(f"{name}: the play ended after {len(seen)} tasks, before the kill point")
    if before_kill:
        before_kill(kill)
    workers = {} if with_workers else controller_tree(proc.pid)  # the task's worker, if it is forked yet
    playbook.kill_playbook(proc, with_workers)
    figures.injected(name)
    if workers:  # left out of the kill: pct_ssh ties each to its controller, so they end on their own
        figures.wait("workers gone after their controller's group was killed", workers_gone_within_bound(workers),
                     WORKER_EXIT_BOUND_S)
    kill.left, kill.states = read_left_behind(lab, job, kill.since)
    return kill, seen


def cheap_checks(lab, kill: Kill, boot: str, ladders: int) -> int:
    """The invariants checked at every point (no re-run needed); the number of decoys wrongly signalled."""
    left = kill.left
    assert left is not None
    assert not (left.job_stopped and not left.ladder_running), \
        f"{kill.name}: job processes stopped (T) with no ladder running: {left.describe()}"
    records = [r for r in audit(lab) if r["boot_id"] == boot]
    wrong = sum(1 for r in records if r["role"] == "networkd-dispatcher" and r["pid"] in kill.decoys and r["signals"])
    now = {pid for pid, (_st, args) in kill.states.items() if ct200.is_decoy(args)} if kill.states \
        else ct200.decoy_pids(lab)
    wrong += len(kill.decoys - now)
    wrong += sum(1 for pid in now if kill.states.get(pid, ("",))[0].startswith("T")) if kill.states \
        else len(stopped_states(lab, now))
    for rec in records:
        if rec["pid"] in kill.job and rec["role"] != "networkd-dispatcher":
            assert set(rec["signals"]) <= RUNG_SIGNALS, f"{kill.name}: {rec['role']} got {rec['signals']}"
            forward = 1 if rec["role"].startswith("worker") else 0  # the launcher's SIGTERM to its workers
            assert rec["signals"].count("SIGTERM") <= ladders + forward, f"{kill.name}: {rec}"
            assert rec["signals"].count("SIGINT") <= ladders, f"{kill.name}: {rec}"
            assert rec["signals"].count("SIGCONT") <= ladders * CATCHABLE_RUNGS, f"{kill.name}: {rec}"
    assert wrong == 0, f"{kill.name}: decoys signalled, gone or stopped: before {kill.decoys}, now {now}"
    assert checkpoint_ok(lab), f"{kill.name}: a checkpoint does not verify"
    return wrong


def full_checks(lab, figures, kill: Kill, boot: str) -> Tuple[Verified, str]:
    """The plain re-run after KILL and everything it must show; what it did to the lock, and its output."""
    left = kill.left
    assert left is not None
    name = kill.name
    mine = latest_record(ladder_records(lab), kill.since)  # the killed run's ladder record, if it started one
    rc, out = stop.play(FAULT_VARS)
    assert rc == 0, f"{name}: re-run failed ({left.describe()}):\n{out[-4000:]}"
    figures.wait("kill + re-run of the stop half", time.monotonic() - kill.t0, LADDER_BOUND + 300)
    # the summary tells the truth about what was still running, and about the killed run's ladder
    if left.job_running and not left.ladder_running:
        assert re.search(r"Stopped: \d+ process\(es\)", out), \
            f"{name}: {left.job_running} processes were running, the summary does not say it stopped them:\n{out[-3000:]}"
    else:
        assert "Stopped: nothing, no process was selected" in out, f"{name}: {left.describe()}\n{out[-3000:]}"
        if mine:
            assert f"training_stop pid {mine['pid']}" in out, f"{name}: the killed run's ladder not reported:\n{out[-3000:]}"
            if mine.get("stopped_by"):
                assert f"stopped the job with {mine['stopped_by']}" in out, out[-3000:]
    took_over = STALE_LOCK_TAKEN in out
    assert took_over == (left.lock == LOCK_DEAD_HOLDER), \
        f"{name}: lock {left.lock}, yet the re-run {'took' if took_over else 'did not take'} over a stale lock:\n{out[-3000:]}"
    assert not ct200.trainer_pids(lab), f"{name}: trainer processes survived the re-run"
    rc2, out2 = stop.play(FAULT_VARS)
    assert rc2 == 0 and playbook.recap(out2)["changed"] == 0, f"{name}: the second re-run changed something:\n{out2[-3000:]}"
    assert ct200.lock_holder(lab) is None
    # the killed run may have run the ladder; the re-run did if anything was left for it
    ladders = 1 + (1 if left.job_running and not left.ladder_running else 0)
    kill.states = {}  # the decoys are looked at afresh, after both re-runs
    cheap_checks(lab, kill, boot, ladders)
    return Verified(0, took_over), out


def put_back(lab, kill: Kill, verified: Verified) -> str:
    """CT200 back to the start state after a kill whose state equals VERIFIED's, as cheaply as is honest;
    how it was done."""
    left = kill.left
    assert left is not None and not left.ladder_running
    if left.lock == LOCK_DEAD_HOLDER:
        if verified.took_over_stale_lock:  # what the verified re-run did to this same stale lock
            ssh.in_ct(lab, "rm", "-f", ct200.LOCK)
            return "the dead run's lock removed (the verified re-run took it over)"
        rc, out = stop.play(FAULT_VARS)
        assert rc == 0, f"{kill.name}: re-run failed:\n{out[-4000:]}"
        return "plain re-run"
    return "nothing to put back" if left.job_running == len(kill.job) else "none (the trainer is restarted)"


def point_range(n: int) -> range:
    """The ks of the every-task loop: 1..n-1, or the part GPUOPS_FAULTS_STOP_POINTS=A-B names."""
    if not POINTS:
        return range(1, n)
    first, _sep, last = POINTS.partition("-")
    return range(max(1, int(first)), min(n, int(last or first) + 1))


def selected_points(n: int, changed: Set[int]) -> List[int]:
    """The ks this run kills at: every k of :func:`point_range` in full mode or with GPUOPS_FAULTS_STOP_POINTS;
    in CI the first, the last and every k right after a task that reported ``changed`` in the reference run
    (CHANGED). A kill after a task that changes nothing leaves CT200 as the kill after the last one that did
    (the controller keeps nothing between runs), with one exception: the run lock's release reports ``ok``
    (it changes nothing the run did not change itself), so the last point stands for "everything done, the
    lock released". The full loop of 2026-12-01 found its 4 distinct states at these points (1, the lock
    taken, the ladder done, the lock released)."""
    ks = list(point_range(n))
    if FULL or POINTS:
        return ks
    return [k for k in ks if k in (ks[0], ks[-1]) or k in changed]


def changed_ks(output: str) -> Set[int]:
    """The ks (1-based task numbers) of the tasks that reported ``changed`` in a run's OUTPUT."""
    return {position + 1 for position, _task in playbook.changed_tasks(output)}


def test_playbook_sigkilled_after_each_task_then_rerun(lab, figures):
    """Every task boundary k = 1..n-1 of the play (stubborn trainer, whole controller killed). The play's task
    list comes from the first verified point's re-run (a whole play with the job running, as a reference
    run would be), so no separate reference run is paid for."""
    boot = audit_boot(lab)
    decoys = ct200.decoy_pids(lab)
    verified: Dict[LeftBehind, Verified] = {}
    reference: List[str] = []
    changed: Set[int] = set()  # the ks whose task reported changed in the reference run
    states: Dict[int, Dict[str, str]] = {}
    failures: List[str] = []
    job: Set[int] = set()
    k: Optional[int] = int(POINTS.partition("-")[0]) if POINTS else 1
    while k is not None:
        name = f"ansible-playbook SIGKILLed after task {k}"
        t_point = time.monotonic()
        try:
            if not job:
                job = start_trainer(BEHAVIOUR)
            kill, seen = inject(lab, figures, name, BEHAVIOUR, job, decoys, lambda s, k=k: len(s) == k + 1)
            left = kill.left
            assert left is not None
            same = verified.get(left)
            if FULL or same is None or left.ladder_running:
                check, out = full_checks(lab, figures, kill, boot)
                verified.setdefault(left, Verified(k, check.took_over_stale_lock))
                if not reference:
                    reference, changed = playbook.BANNER.findall(out), changed_ks(out)
                how, job = "full re-run checks", set()
            else:
                cheap_checks(lab, kill, boot, ladders=1)
                how = f"injected, state identical to point {same.k} (verified); put back: {put_back(lab, kill, same)}"
                if left.job_running != len(job) or left.lock == LOCK_DEAD_HOLDER and not same.took_over_stale_lock:
                    job = set()
            figures.survived(name)
            states[str(k)] = {"task": seen[k - 1], "state": left.describe(), "checked": how,
                              "seconds": str(round(time.monotonic() - t_point, 1))}
            figures.note("stop half kill points", states)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}"[:2000])
            figures.failed(name, failures[-1])
            job = set()
            if not reference:  # the task list is still needed to go on
                rc, out = stop.play(FAULT_VARS)
                reference, changed = playbook.BANNER.findall(out) or ["?"], changed_ks(out)
        k = next((j for j in selected_points(len(reference), changed) if j > k), None)
    figures.note("stop half tasks", reference)
    figures.note("stop half distinct states", {v.k: s.describe() for s, v in verified.items()})
    assert len(reference) > 40 and reference.index(next(t for t in reference if LOCK_TASK in t)) > 0, reference
    assert not failures, "\n\n".join(failures)


def test_playbook_process_group_killed_at_the_run_lock(lab, figures):
    """The process group alone SIGKILLed (``kill -9 -PGID``: ansible-core 2.19's setsid'd workers are not in it)
    right after the run lock is taken: any worker it missed ends within WORKER_EXIT_BOUND_S, then the full
    re-run checks (the stale lock reported taken over)."""
    boot = audit_boot(lab)
    name = "ansible-playbook's process group SIGKILLed after the run lock (workers left)"
    kill, _seen = inject(lab, figures, name, BEHAVIOUR, start_trainer(BEHAVIOUR), ct200.decoy_pids(lab),
                         after_task(LOCK_TASK), with_workers=False)
    full_checks(lab, figures, kill, boot)
    figures.survived(name)


@pytest.mark.parametrize("when", ["as_the_ladder_starts", "after_the_ladder"])
def test_slow_checkpoint_trainer_killed_at_the_ladder(lab, figures, when):
    """The slow_checkpoint trainer (a 20 s shutdown save that keeps its ``.tmp`` growing, so the SIGINT rung
    waits on progress) where it behaves differently from the stubborn one: before the ladder the killed run
    has signalled nothing (the same state as the stubborn points; the re-run's ladder meets the slow save,
    as the role's own tests show), and after the GPU wait has begun the job is gone as with the stubborn
    trainer. So: the kill landing as the ladder starts (its record "running" in CT200, the save under way:
    the ladder must finish the save on its own, the re-run wait for it and report it) and right after the
    ladder (the job stopped by SIGINT alone, the checkpoint just written)."""
    boot = audit_boot(lab)
    name = f"ansible-playbook SIGKILLed {when.replace('_', ' ')} (slow_checkpoint trainer)"
    job = start_trainer("slow_checkpoint")
    if when == "as_the_ladder_starts":
        def ladder_started(kill: Kill) -> None:
            wait_for(lambda: my_record(lab, kill.since).get("state") == "running", 30,
                     "the killed run's ladder record (running) in CT200")
        kill, _seen = inject(lab, figures, name, "slow_checkpoint", job, ct200.decoy_pids(lab),
                             lambda s: bool(s) and LADDER_TASK in s[-1], before_kill=ladder_started)
        assert kill.left is not None and kill.left.ladder_running, kill.left
    else:
        kill, _seen = inject(lab, figures, name, "slow_checkpoint", job, ct200.decoy_pids(lab), after_task(LADDER_TASK))
        assert kill.left is not None and kill.left.job_running == 0 \
            and kill.left.ladder[1].startswith("stopped by SIGINT"), kill.left
    full_checks(lab, figures, kill, boot)
    figures.survived(name)


REBOOT_POINTS = [pytest.param("Stop | Run the stop-verify-kill ladder", id="ladder"),
                 pytest.param("Stop | Wait until every GPU's memory is released", id="gpu_free_wait")]


@pytest.mark.parametrize("during", REBOOT_POINTS)
def test_ct200_rebooted_by_someone_else_during_the_stop(lab, figures, during):
    """Someone reboots CT200 (``pct reboot`` on the PVE host) while the ladder or the GPU wait runs:
    the play ends within its bounds (no hang), and a plain re-run is ok and converges. ``lab up`` puts the
    trainer and decoys back once; a second time only when the test failed before that."""
    job = start_trainer(BEHAVIOUR)
    # a GPU held outside the job keeps gpu_free_wait waiting (the reboot lands in it, not after it)
    if "GPU" in during:
        ssh.in_ct(lab, "sh", "-c",
                  "setsid -f python3 /opt/lab/fakegpu/fakegpu.py hold --gpu 5 --mib 12345 >/dev/null 2>&1 </dev/null")
    name = f"CT200 rebooted during {during.split('| ')[1]}"
    t0 = time.monotonic()
    proc = stop.start(dict(FAULT_VARS, stop_training_restart_container=False))
    restored = False
    try:
        try:
            playbook.read_until(proc, f" : {during}]", timeout=300)
            time.sleep(1.0)  # inside the task
            rebooted = ssh.on_host(lab, f"pct reboot {lab_support.MAIN_CT} --timeout 30", timeout=300, check=False)
            figures.injected(name)
            assert rebooted.returncode == 0, rebooted.stderr
            proc.communicate(timeout=LADDER_BOUND + 120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        figures.wait(f"play with CT200 rebooted during {during}", time.monotonic() - t0, LADDER_BOUND + 120)
        # the reboot ended the job and the stray GPU holder; the lab puts its trainer and decoys back
        up = lab_support.lab_cli("up", timeout=600)
        assert up.returncode == 0, up.stderr + up.stdout
        restored = True
        assert not (ct200.trainer_pids(lab) & job)
        rc, out = stop.play(FAULT_VARS)
        assert rc == 0, out[-4000:]
        rc2, out2 = stop.play(FAULT_VARS)
        assert rc2 == 0 and playbook.recap(out2)["changed"] == 0, out2[-3000:]
        assert ct200.lock_holder(lab) is None
        boot = audit_boot(lab)  # once: a call per record (pct exec each) cost minutes once the audit held hundreds
        records = [r for r in audit(lab) if r["boot_id"] == boot and r["role"] == "networkd-dispatcher"]
        assert all(not r["signals"] for r in records), records
        figures.survived(name)
    finally:
        if not restored:
            lab_support.lab_cli("up", timeout=600)
