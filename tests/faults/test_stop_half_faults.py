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
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from tests.support import ct200, faults, playbook, ssh
from tests.support import lab as lab_support
from tests.support import stop_training as stop
from tests.support.faults import FULL, Fault, Figures
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
KILLED = "ansible-playbook SIGKILLed"


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
    workers: Dict[int, str] = {}

    def at_the_point() -> None:
        if before_kill:
            before_kill(kill)
        if not with_workers:  # the task's worker, if it is forked yet
            workers.update(controller_tree(proc.pid))

    seen = faults.controller_killed(proc, done, with_workers=with_workers, before_kill=at_the_point,
                                    quiet_after=False)
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


@dataclass
class Stop:
    """A point's context: the lab, the ledger, the audit's boot and the decoys before the fault; for the every-task
    loop its state (the fingerprints verified so far, the play's task list and changed tasks from the first
    verified re-run, the job running now)."""

    lab: dict
    figures: Figures
    boot: str
    decoys: Set[int]
    verified: Dict[LeftBehind, Verified] = field(default_factory=dict)
    reference: List[str] = field(default_factory=list)
    changed: Set[int] = field(default_factory=set)
    states: Dict[str, Dict[str, str]] = field(default_factory=dict)
    job: Set[int] = field(default_factory=set)
    started: float = 0.0
    restored: bool = False

    def rows(self) -> Iterator[Fault]:
        """The every-task loop's rows, each k picked once the point before it has run (the task list and the
        changed tasks come from the first verified point's re-run)."""
        k: Optional[int] = int(POINTS.partition("-")[0]) if POINTS else 1
        while k is not None:
            yield Fault(KILLED, f"after task {k}", lambda ctx, k=k: ctx.kill_after(k),
                        lambda ctx, landed, k=k: ctx.rerun_or_put_back(k, *landed), at={"k": k})
            k = next((j for j in selected_points(len(self.reference), self.changed) if j > k), None)

    def kill_after(self, k: int) -> Tuple[Kill, List[str]]:
        """The injector: the stubborn trainer's play killed whole as banner K+1 is printed."""
        self.started = time.monotonic()
        if not self.job:
            self.job = start_trainer(BEHAVIOUR)
        return inject(self.lab, self.figures, f"{KILLED} after task {k}", BEHAVIOUR, self.job, self.decoys,
                      lambda s: len(s) == k + 1)

    def rerun_or_put_back(self, k: int, kill: Kill, seen: List[str]) -> None:
        """The first point of each fingerprint (every point in full mode) gets the full re-run checks, a later one
        the cheap checks and CT200 put back (module docstring)."""
        left = kill.left
        assert left is not None
        same = self.verified.get(left)
        if FULL or same is None or left.ladder_running:
            check, out = full_checks(self.lab, self.figures, kill, self.boot)
            self.verified.setdefault(left, Verified(k, check.took_over_stale_lock))
            if not self.reference:
                self.reference, self.changed = playbook.BANNER.findall(out), changed_ks(out)
            how, self.job = "full re-run checks", set()
        else:
            cheap_checks(self.lab, kill, self.boot, ladders=1)
            how = f"injected, state identical to point {same.k} (verified); put back: {put_back(self.lab, kill, same)}"
            if left.job_running != len(self.job) or left.lock == LOCK_DEAD_HOLDER and not same.took_over_stale_lock:
                self.job = set()
        self.states[str(k)] = {"task": seen[k - 1], "state": left.describe(), "checked": how,
                               "seconds": str(round(time.monotonic() - self.started, 1))}
        self.figures.note("stop half kill points", self.states)

    def after_a_failure(self, row: Fault) -> None:
        """A point failed: the next starts a new job, and the task list is still needed to go on."""
        self.job = set()
        if not self.reference:
            rc, out = stop.play(FAULT_VARS)
            self.reference, self.changed = playbook.BANNER.findall(out) or ["?"], changed_ks(out)


def test_playbook_sigkilled_after_each_task_then_rerun(lab, figures):
    """Every task boundary k = 1..n-1 of the play (stubborn trainer, whole controller killed). The play's task
    list comes from the first verified point's re-run (a whole play with the job running, as a reference
    run would be), so no separate reference run is paid for."""
    ctx = Stop(lab, figures, audit_boot(lab), ct200.decoy_pids(lab))
    try:
        faults.each(figures, ctx.rows(), ctx, on_failure=ctx.after_a_failure)
    finally:
        figures.note("stop half tasks", ctx.reference)
        figures.note("stop half distinct states", {v.k: s.describe() for s, v in ctx.verified.items()})
    reference = ctx.reference
    assert len(reference) > 40 and reference.index(next(t for t in reference if LOCK_TASK in t)) > 0, reference


def killed_at(name: str, behaviour: str, done, with_workers: bool = True, before_kill=None):
    """The injector for one kill (NAME) of BEHAVIOUR's play: whole (or its process group alone) once DONE(banners),
    BEFORE_KILL(ctx, kill) having returned."""

    def kill(ctx: Stop) -> Kill:
        killed, _seen = inject(ctx.lab, ctx.figures, name, behaviour, start_trainer(behaviour),
                               ct200.decoy_pids(ctx.lab), done, with_workers=with_workers,
                               before_kill=(lambda k: before_kill(ctx, k)) if before_kill else None)
        return killed

    return kill


def ladder_started(ctx: Stop, kill: Kill) -> None:
    """BEFORE_KILL for the kill as the ladder starts: its record "running" in CT200 (the save under way)."""
    wait_for(lambda: my_record(ctx.lab, kill.since).get("state") == "running", 30,
             "the killed run's ladder record (running) in CT200")


def full_rerun(ctx: Stop, kill: Kill) -> None:
    full_checks(ctx.lab, ctx.figures, kill, ctx.boot)


def ladder_still_saving(ctx: Stop, kill: Kill) -> None:
    """Killed as the ladder starts: the ladder must finish the save on its own, the re-run wait for it and report it."""
    assert kill.left is not None and kill.left.ladder_running, kill.left
    full_rerun(ctx, kill)


def stopped_by_sigint_alone(ctx: Stop, kill: Kill) -> None:
    """Killed after the ladder: the job stopped by SIGINT alone, the checkpoint just written."""
    assert kill.left is not None and kill.left.job_running == 0 \
        and kill.left.ladder[1].startswith("stopped by SIGINT"), kill.left
    full_rerun(ctx, kill)


def rebooted_during(task: str):
    """The injector: someone reboots CT200 (``pct reboot`` on the PVE host) 1 s into TASK; the play, the job and
    when the play started."""

    def reboot(ctx: Stop) -> Tuple[subprocess.Popen, Set[int], float, str]:
        lab = ctx.lab
        job = start_trainer(BEHAVIOUR)
        # a GPU held outside the job keeps gpu_free_wait waiting (the reboot lands in it, not after it)
        if "GPU" in task:
            ssh.in_ct(lab, "sh", "-c",
                      "setsid -f python3 /opt/lab/fakegpu/fakegpu.py hold --gpu 5 --mib 12345 >/dev/null 2>&1 </dev/null")
        t0 = time.monotonic()
        proc = stop.start(dict(FAULT_VARS, stop_training_restart_container=False))
        try:
            playbook.read_until(proc, f" : {task}]", timeout=300)
            time.sleep(1.0)  # inside the task
            rebooted = ssh.on_host(lab, f"pct reboot {lab_support.MAIN_CT} --timeout 30", timeout=300, check=False)
            assert rebooted.returncode == 0, rebooted.stderr
        except BaseException:
            end_play(proc)
            raise
        return proc, job, t0, task

    return reboot


def end_play(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def play_ends_and_rerun_converges(ctx: Stop, landed: Tuple[subprocess.Popen, Set[int], float, str]) -> None:
    """The play ends within its bounds (no hang); ``lab up`` puts the trainer and decoys back; a plain re-run is ok
    and converges, the lock free, the decoy never signalled."""
    lab, (proc, job, t0, task) = ctx.lab, landed
    try:
        proc.communicate(timeout=LADDER_BOUND + 120)
    finally:
        end_play(proc)
    ctx.figures.wait(f"play with CT200 rebooted during {task}", time.monotonic() - t0, LADDER_BOUND + 120)
    # the reboot ended the job and the stray GPU holder; the lab puts its trainer and decoys back
    up = lab_support.lab_cli("up", timeout=600)
    assert up.returncode == 0, up.stderr + up.stdout
    ctx.restored = True
    assert not (ct200.trainer_pids(lab) & job)
    rc, out = stop.play(FAULT_VARS)
    assert rc == 0, out[-4000:]
    rc2, out2 = stop.play(FAULT_VARS)
    assert rc2 == 0 and playbook.recap(out2)["changed"] == 0, out2[-3000:]
    assert ct200.lock_holder(lab) is None
    boot = audit_boot(lab)  # once: a call per record (pct exec each) cost minutes once the audit held hundreds
    records = [r for r in audit(lab) if r["boot_id"] == boot and r["role"] == "networkd-dispatcher"]
    assert all(not r["signals"] for r in records), records


FAULTS = [
    # the process group alone (``kill -9 -PGID``: ansible-core 2.19's setsid'd workers are not in it) right after
    # the run lock is taken: any worker it missed ends within WORKER_EXIT_BOUND_S; the stale lock reported taken over
    Fault("ansible-playbook's process group SIGKILLed (workers left)", "after the run lock",
          killed_at("process group killed after the run lock", BEHAVIOUR, after_task(LOCK_TASK), with_workers=False),
          full_rerun),
    # the slow_checkpoint trainer (a 20 s shutdown save that keeps its ``.tmp`` growing, so the SIGINT rung waits on
    # progress) where it behaves differently from the stubborn one: before the ladder the killed run has signalled
    # nothing (the stubborn points' state), after the GPU wait has begun the job is gone as with the stubborn one
    Fault(KILLED + " (slow_checkpoint trainer)", "as the ladder starts",
          killed_at("slow_checkpoint killed as the ladder starts", "slow_checkpoint",
                    lambda s: bool(s) and LADDER_TASK in s[-1], before_kill=ladder_started),
          ladder_still_saving),
    Fault(KILLED + " (slow_checkpoint trainer)", "after the ladder",
          killed_at("slow_checkpoint killed after the ladder", "slow_checkpoint", after_task(LADDER_TASK)),
          stopped_by_sigint_alone),
    # someone reboots CT200 while the ladder or the GPU wait runs; ``lab up`` puts the trainer and decoys back
    # once, a second time only when the test failed before that
    Fault("CT200 rebooted by someone else", "during the ladder", rebooted_during(LADDER_TASK),
          play_ends_and_rerun_converges, at={"reboots": True}),
    Fault("CT200 rebooted by someone else", "during gpu_free_wait",
          rebooted_during("Stop | Wait until every GPU's memory is released"), play_ends_and_rerun_converges,
          at={"reboots": True}),
]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_stop_half_fault_then_a_plain_rerun(row, lab, figures):
    ctx = Stop(lab, figures, audit_boot(lab), set())
    try:
        faults.run(figures, row, ctx)
    finally:
        if row.at.get("reboots") and not ctx.restored:
            lab_support.lab_cli("up", timeout=600)
