"""The SSH link to the PVE host cut while ``training_stop`` runs inside CT200, during each rung of its ladder.

On the lab: ``training_stop`` runs inside CT200 through real ``ansible`` and ``gpuops.repurpose.pct_ssh``
(its own control directory per point), against the ``stubborn`` trainer (workers ignore SIGINT and SIGTERM:
every rung runs) with short rungs. The link is cut two ways, and the host's sshd restarted, each during each
rung:

- ``master_killed``: the pct_ssh control master SIGKILLed (the controller side dies);
- ``sshd_child_killed``: the lab PVE host's sshd processes serving that connection SIGKILLed (the host
  side dies; found by the TCP socket they hold, only among the lab sshd's own descendants);
- ``sshd_restarted``: the lab PVE host's whole sshd restarted as ``systemctl restart ssh`` restarts a PVE host's
  (``tests/lab/lab sshd-restart``): Debian's ssh.service has ``KillMode=process``, so only the listener gets
  SIGTERM (OpenSSH's handler closes the listening sockets and exits) and the session processes it forked go on.
  The link is *not* cut: the established connection must carry the run to its end.

A catchable rung (SIGINT via tmux, SIGTERM) is cut 1 s after it began (its timeout is 3 s); the SIGKILL
rung, which the stubborn trainer ends at once, is cut the moment its signal has landed (a trainer process
seen gone on the host), while the rung waits to confirm the job is gone. One more point runs the
``slow_checkpoint`` trainer (a 20 s shutdown save after Ctrl-C) with the link cut mid-save.
``sshd_child_frozen`` (the same sshd processes SIGSTOPped: a silent host that only the keepalives notice)
runs during each rung. ``sshd_down_master_killed`` runs during each rung: the host's sshd stopped (a stop,
a gap, a start) from DOWN_LEAD_S seconds before the cut moment until DOWN_S seconds after it, and the control
master SIGKILLed at the cut moment, with nothing listening.

At a restart point (no cut): the run finishes normally with the ladder's real result (no UNREACHABLE, within the
ladder's bound), the control master and the session serving it are the ones from before, a re-run goes through
that same connection and a run with a fresh master connects through the new listener. With the daemon down and
the master killed: the run fails as for ``master_killed``; a new connection while nobody listens fails at once with
pct_ssh's "cannot reach" message; after the daemon is back the plain re-run reports the ladder.

At each cut point (what tests/faults/README.md says must happen):

- the ``ansible`` run fails fast, unreachable, naming the dead connection, within the documented
  worst-case detection time (``dead_after`` of the connection's defaults, + ansible's own start/end);
- the ladder inside CT200 finishes on its own (no job process left, none stopped) and leaves its result:
  state ``done``, stopped by the rung the trainer obeys, the rungs it climbed;
- the plain re-run reports what the detached ladder did (its pid, the rung) instead of "nothing to do";
  a second re-run changes nothing and climbs no rung;
- no decoy was signalled (the lab's signal audit), each job process got only the ladder's rungs, at most once;
- every checkpoint verifies; no training_stop is left running in CT200 and the run lock is free (or held by
  the same record as before the point: these runs never take it).

The restart points and the down point check the same ladder, re-run, signal and checkpoint facts.

CI runs each kind once (``CI_POINTS``: the three rungs spread over the kinds, and the mid-save point);
``GPUOPS_FAULTS_FULL=1`` runs every kind during every rung (16 points).

Marked ``lab`` (and ``faults``): skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from tests.support import ct200, faults
from tests.support import lab as lab_support
from tests.support.faults import Fault, Figures
from tests.support.paths import ROOT
from tests.support.playbook import adhoc_argv, ansible_env, start_adhoc
from tests.support.playbook import control_dir as cp_dir
from tests.support.procfs import descendants, listening
from tests.support.stop_faults import (
    RUNG_SIGNALS,
    WORKER_EXIT_BOUND_S,
    audited,
    checkpoint_ok,
    controller_tree,
    gone,
    job_signals,
    master_pid,
    my_record,
    result_of,
    serving_sshd,
    stop_masters,
    stopped_states,
    workers_gone_within_bound,
    wrongly_signalled,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

RUNG_S = 3.0  # each catchable rung's timeout: short, so a point costs little
KILL_RUNG_S = 5.0
CUT_INTO_S = 1.0  # a catchable rung is cut this long after it began
SAVE_S = 20.0  # the slow_checkpoint trainer's shutdown save (fake_trainer.py's default --checkpoint-seconds)
RUNGS = ("SIGINT", "SIGTERM", "SIGKILL")
CUTS = ("master_killed", "sshd_child_killed")
FROZEN = "sshd_child_frozen"  # SIGSTOP: a silent host, noticed only by keepalives (each rung)
RESTARTED = "sshd_restarted"  # the host's sshd restarted, KillMode=process: the link survives (each rung)
DOWN_KILLED = "sshd_down_master_killed"  # the host's sshd down while the master dies (each rung)
DOWN_S = 10.0  # from the cut: long enough for the failed run to end and a new ansible run to try to connect meanwhile
DOWN_LEAD_S = 2.0  # the stop starts this long before the cut moment: the listener is closed when the master dies
# a connection nobody listens for is refused at once; the bound is the `timeout` option (TCP connect and login)
CONNECT_BOUND_S = 10.0
# the connection's defaults (server_alive_interval 5, server_alive_count_max 3): the documented worst case
DETECT_BOUND_S = _pct_ssh.dead_after(_pct_ssh.Settings(host="pve1.example.internal"))
SLACK_S = 15.0  # ansible's own start and end on a loaded 2-core machine


ORPHAN_RUNG_S = 12.0  # the SIGTERM rung when the controller is killed in it (see the test)


def ladder(first_rung_s: float = RUNG_S) -> list:
    return [{"signal": "SIGINT", "via": "tmux", "timeout": first_rung_s}, {"signal": "SIGTERM", "timeout": RUNG_S},
            {"signal": "SIGKILL", "timeout": KILL_RUNG_S}]


def args(steps: list) -> dict:
    return {"tmux_session": "dflash", "ladder": steps, "lock_timeout": 30}


RUNG_POINTS = [(cut, rung, "stubborn") for cut in CUTS for rung in range(3)]
RUNG_POINTS.append(("sshd_child_killed", 0, "slow_checkpoint"))
RUNG_POINTS += [(FROZEN, rung, "stubborn") for rung in range(3)]
# last: a restart leaves the module's ``lab`` with the new sshd's PID (updated by the test), the cuts above use it
RUNG_POINTS += [(RESTARTED, rung, "stubborn") for rung in range(3)]
RUNG_POINTS += [(DOWN_KILLED, rung, "stubborn") for rung in range(3)]
# (cut, rung, trainer, id)
POINTS = [(cut, rung, behaviour, "%s-%s%s" % (cut, RUNGS[rung], "" if behaviour == "stubborn" else "-" + behaviour))
          for cut, rung, behaviour in RUNG_POINTS]
# CI: every cut kind once, the three rungs spread over them (SIGINT: master killed, daemon down; SIGTERM: sshd
# child killed, as in the incident, and the restart; SIGKILL: the frozen child), and the mid-save point.
# GPUOPS_FAULTS_FULL=1 runs every kind in every rung.
CI_POINTS = ("master_killed-SIGINT", "sshd_child_killed-SIGTERM", "sshd_child_killed-SIGINT-slow_checkpoint",
             FROZEN + "-SIGKILL", RESTARTED + "-SIGTERM", DOWN_KILLED + "-SIGINT")


@pytest.fixture(scope="module")
def lab(lab):
    """The shared ``lab`` with the signal audit; the default trainer put back afterwards."""
    yield from audited(lab)


def adhoc(env: dict, module_args: dict) -> subprocess.Popen:
    """training_stop on ct200 through real ``ansible`` (one-line output)."""
    return start_adhoc("ct200", "gpuops.repurpose.training_stop", module_args, options=["-o"], env=env)


def start_adhoc_in_group(env: dict, module_args: dict) -> subprocess.Popen:
    """training_stop through ``ansible`` as its own process group leader (killable as a group, like a job)."""
    argv = adhoc_argv("ct200", "gpuops.repurpose.training_stop", module_args, options=["-o"])
    return subprocess.Popen(argv, cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def host_trainer_pids(lab: dict) -> list:
    """The fake trainer's processes as host PIDs (CT200's init's descendants): watched without a round trip."""
    init = ct200.ct_init_pid(lab)
    found = []
    for pid in descendants(init) if init else []:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"fake_trainer.py") for a in argv):
            found.append(pid)
    return found


def trainer_up(lab: dict, behaviour: str) -> tuple:
    """Start the BEHAVIOUR trainer and wait until all its processes run: (the job's PIDs, the decoys' PIDs now)."""
    started = lab_support.trainer(behaviour)
    job = set(started["pids"]["workers"]) | {started["pids"]["launcher"]}
    wait_for(lambda: len(ct200.trainer_pids(lab)) == len(job) and ct200.trainer_pids(lab), 60, "the trainer")
    return job, ct200.decoy_pids(lab)


def ladder_running(lab: dict, since: float) -> dict:
    """The record of the ladder started at or after SINCE, once it says it is running."""
    return wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 60,
                    "the ladder to start")


def rung_start(record: dict, rung: int, steps: list) -> float:
    """When RUNG of the ladder RECORD describes starts (wall clock), its earlier rungs running their full timeouts."""
    return record["started"] + sum(s["timeout"] for s in steps[:rung])


def wait_for_cut_moment(lab: dict, record: dict, rung: int, steps: list, watch: list) -> None:
    """Sleep until the point's cut moment: CUT_INTO_S into a catchable rung, or the SIGKILL rung's signal landed."""
    start = rung_start(record, rung, steps)
    if RUNGS[rung] != "SIGKILL":
        time.sleep(max(0.0, start + CUT_INTO_S - time.time()))
        return
    time.sleep(max(0.0, start - 0.5 - time.time()))
    wait_for(lambda: any(gone(pid) for pid in watch), 10, "the SIGKILL rung's signal to land", interval=0.01)


def cut_link(lab: dict, cut: str, control_dir: str, frozen: list) -> int:
    """Cut the link one way; the control master's PID. Frozen sshd processes are added to FROZEN (the caller
    ends them)."""
    _client, pid = master_pid(control_dir)
    if cut == "master_killed":
        os.kill(pid, signal.SIGKILL)
        return pid
    for victim in serving_sshd(lab, pid):
        if cut == FROZEN:
            frozen.append(victim)
        os.kill(victim, signal.SIGSTOP if cut == FROZEN else signal.SIGKILL)
    return pid


def end_frozen(frozen: list) -> None:
    """The frozen sshd processes of a point, killed: SIGKILL ends a stopped process too, and nothing more may
    be sent after it (a SIGCONT once was, and failed when the process had been reaped in between)."""
    for victim in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def sshd_serves(lab: dict, control_dir: str, sshd_pid: int) -> list:
    """The processes of the lab sshd SSHD_PID serving CONTROL_DIR's control master (asserts there are some)."""
    _client, pid = master_pid(control_dir)
    return serving_sshd(lab, pid, sshd_pid)


def restart_during_run(lab: dict, run: subprocess.Popen, control_dir: str, left_s: float) -> tuple:
    """Restart the host's sshd now (the run's connection established): (the run's output, seconds from the restart to
    the run's end, the restart's facts, the master and the sshd processes serving it before the restart)."""
    _client, master = master_pid(control_dir)
    serving = serving_sshd(lab, master)
    restarted = lab_support.sshd_restart()
    lab["sshd"]["pid"] = restarted["new_pid"]  # this module's lab facts follow the host
    out, _err = run.communicate(timeout=left_s)
    return out, time.time() - restarted["stopped_at"], restarted, master, serving


def down_and_master_killed(lab: dict, run: subprocess.Popen, control_dir: str, steps: list, record: dict, rung: int,
                           watch: list) -> tuple:
    """Stop the host's sshd from DOWN_LEAD_S s before the point's cut moment until DOWN_S s after it, and at the cut
    moment, nothing listening, SIGKILL the control master; while the daemon is still down, try a new connection.
    (When the master died, the killed run's output, seconds to its end, the new connection's output and seconds,
    the restart's facts, the master's PID.)"""
    lead = max(0.0, rung_start(record, rung, steps) - DOWN_LEAD_S - time.time())
    time.sleep(lead)
    restarting = lab_support.start_sshd_restart(DOWN_LEAD_S + DOWN_S)
    try:
        wait_for(lambda: not listening(lab["port"]), 10, "the lab sshd's listener to close", interval=0.01)
        wait_for_cut_moment(lab, record, rung, steps, watch)
        _client, master = master_pid(control_dir)
        os.kill(master, signal.SIGKILL)
        cut_wall, cut_at = time.time(), time.monotonic()
        out, _err = run.communicate(timeout=DETECT_BOUND_S + SLACK_S)
        detected_in = time.monotonic() - cut_at
        fresh = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir + "3")  # short: a socket path's limit
        tried_at = time.monotonic()
        probe = adhoc(fresh, args(steps))
        probe_out, _err = probe.communicate(timeout=CONNECT_BOUND_S + SLACK_S)
        probe_s = time.monotonic() - tried_at
        # the point is void unless the attempt met no listener: DOWN_S too short for this machine's load
        assert not listening(lab["port"]), "sshd came back before the new connection was tried; raise DOWN_S"
    finally:
        restarted = lab_support.sshd_restart_result(restarting, DOWN_LEAD_S + DOWN_S)
    lab["sshd"]["pid"] = restarted["new_pid"]
    return cut_wall, out, detected_in, probe_out, probe_s, restarted, master


@dataclass
class Link:
    """A point's context: the ansible run of ``training_stop`` under way (its ladder running), what the point cuts
    and when, and what was there before it."""

    lab: dict
    figures: Figures
    cut: str
    rung: int
    behaviour: str
    steps: list
    control_dir: str
    env: dict
    job: set
    decoys_before: set
    watch: list
    lock_before: object = None
    since: float = 0.0
    run: Optional[subprocess.Popen] = None
    record: dict = field(default_factory=dict)
    frozen: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return "%s (%s) during the %s rung, %s trainer" % (
            "host sshd restarted" if self.cut == RESTARTED else "link cut", self.cut, RUNGS[self.rung], self.behaviour)

    @property
    def ladder_s(self) -> float:
        return sum(s["timeout"] for s in self.steps)


@dataclass
class Landed:
    """What a point's injector saw: the run's output, the cut moment, the control master, and per kind the
    detection time, the restart's facts, the sshd processes serving the master, the new connection's attempt."""

    out: str
    cut_wall: float
    master: int
    detected_in: float = 0.0
    finished_in: float = 0.0
    restarted: dict = field(default_factory=dict)
    serving: list = field(default_factory=list)
    probe_out: str = ""
    probe_s: float = 0.0


def end_run(ctx: Link) -> None:
    """After the injection: the ansible run ended (killed if it still runs), the point's frozen sshd processes
    killed (once: a PID may be reused after its process is reaped)."""
    if ctx.run is not None and ctx.run.poll() is None:
        ctx.run.kill()
        ctx.run.wait()
    end_frozen(ctx.frozen)
    ctx.frozen.clear()


def link_cut(ctx: Link) -> Landed:
    """The injector of the cuts (the master killed, the sshd child killed or frozen) at the point's cut moment."""
    try:
        wait_for_cut_moment(ctx.lab, ctx.record, ctx.rung, ctx.steps, ctx.watch)
        cut_wall = time.time()
        master = cut_link(ctx.lab, ctx.cut, ctx.control_dir, ctx.frozen)
        cut_at = time.monotonic()
        out, _err = ctx.run.communicate(timeout=DETECT_BOUND_S + SLACK_S)
        return Landed(out, cut_wall, master, detected_in=time.monotonic() - cut_at)
    finally:
        end_run(ctx)


def sshd_restarted(ctx: Link) -> Landed:
    """The injector of the restart: the host's sshd restarted (KillMode=process) at the point's cut moment."""
    try:
        wait_for_cut_moment(ctx.lab, ctx.record, ctx.rung, ctx.steps, ctx.watch)
        cut_wall = time.time()
        out, finished_in, restarted, master, serving = restart_during_run(
            ctx.lab, ctx.run, ctx.control_dir, ctx.ladder_s + SLACK_S)
        return Landed(out, cut_wall, master, finished_in=finished_in, restarted=restarted, serving=serving)
    finally:
        end_run(ctx)


def sshd_down_master_killed(ctx: Link) -> Landed:
    """The injector of the down point: the daemon goes down ahead of the cut moment, the master dies at it."""
    try:
        cut_wall, out, detected_in, probe_out, probe_s, restarted, master = down_and_master_killed(
            ctx.lab, ctx.run, ctx.control_dir, ctx.steps, ctx.record, ctx.rung, ctx.watch)
        return Landed(out, cut_wall, master, detected_in=detected_in, restarted=restarted, probe_out=probe_out,
                      probe_s=probe_s)
    finally:
        end_run(ctx)


def run_outcome(ctx: Link, landed: Landed) -> None:
    """The ansible run's own end: after a restart the ladder's real result through the connection that outlived it;
    after a cut a fast UNREACHABLE naming the dead connection; with the daemon down a new connection refused."""
    figures, out, cut = ctx.figures, landed.out, ctx.cut
    state, result = result_of(out)
    if cut == RESTARTED:
        # the established connection carries the run to its end: the ladder's real result, in its bound
        figures.wait("run ended after the host's sshd restart (the ladder's own end)", landed.finished_in,
                     ctx.ladder_s + SLACK_S)
        assert state == "CHANGED" and ctx.run.returncode == 0, out
        assert result["stopped_by"] == "SIGKILL", result
        assert [r["signal"] for r in result["rungs"]] == list(RUNGS), result
        # the same master, on the same session processes, which outlived their listener
        assert master_pid(ctx.control_dir)[1] == landed.master
        assert not [p for p in landed.serving if gone(p)], (landed.serving, landed.restarted)
    else:
        figures.wait("dead link detected (ansible run ended after the cut)", landed.detected_in,
                     DETECT_BOUND_S + SLACK_S)
        # the play fails fast, naming the dead connection
        assert state == "UNREACHABLE!" and ctx.run.returncode != 0, out
        if cut in ("master_killed", DOWN_KILLED):
            assert "control master" in result["msg"] and "went away" in result["msg"], result
        else:
            assert "the SSH connection died" in result["msg"], result
        if cut == FROZEN:
            assert "answered no keepalive" in result["msg"], result
    if cut == DOWN_KILLED:
        # a new connection while nobody listens: pct_ssh's unreachable message, at once
        figures.wait("new connection refused while the host's sshd was down", landed.probe_s,
                     CONNECT_BOUND_S + SLACK_S)
        probe_state, probe_result = result_of(landed.probe_out)
        assert probe_state == "UNREACHABLE!", landed.probe_out
        assert "pct_ssh: cannot reach the Proxmox VE host 127.0.0.1:%d" % ctx.lab["port"] in probe_result["msg"]
        assert "that sshd listens there" in probe_result["msg"], probe_result
        assert landed.restarted["down_s"] >= DOWN_S - 0.5, landed.restarted


def ladder_finished_on_its_own(ctx: Link, landed: Landed) -> dict:
    """The ladder finishes on its own, in the rung the point names, and leaves its result; its record."""
    lab, cut, rung = ctx.lab, ctx.cut, ctx.rung
    left_s = ctx.ladder_s + 30
    wait_for(lambda: not ct200.trainer_pids(lab), left_s, "the ladder to finish the job on its own")
    record = wait_for(lambda: my_record(lab, ctx.since).get("state") in ("done", "failed")
                      and my_record(lab, ctx.since), 30, "the ladder's record")
    if cut != RESTARTED:  # the down point looks only after the gap: its record says when the ladder ended
        ended = record["finished"] if cut == DOWN_KILLED else time.time()
        ctx.figures.wait("ladder finished after the cut (%s trainer)" % ctx.behaviour, ended - landed.cut_wall,
                         left_s)
    assert record["state"] == "done", record
    climbed = [r["signal"] for r in record["rungs"]]
    if ctx.behaviour != "stubborn":
        assert record["stopped_by"].startswith("SIGINT") and climbed == ["SIGINT"], record
    else:
        assert record["stopped_by"] == "SIGKILL" and climbed == list(RUNGS), record
    # the cut landed in the rung this point names (rung times from the record: sent_at is per ladder)
    sent = [record["started"] + r["sent_at"] - record["rungs"][0]["sent_at"] for r in record["rungs"]]
    assert landed.cut_wall >= sent[rung] - 0.25, (landed.cut_wall, sent, record)
    if rung + 1 < len(sent):
        assert landed.cut_wall < sent[rung + 1], (landed.cut_wall, sent, record)
    assert record["stopped_count"] >= len(ctx.job)
    assert not stopped_states(lab, ct200.trainer_pids(lab))
    if cut in ("sshd_child_killed", FROZEN):  # the master stays behind its dead connection at most DEAD_DRAIN_S
        wait_for(lambda: gone(landed.master), _pct_ssh.DEAD_DRAIN_S + 5, "the control master to exit")
    return record


def reruns_report_the_ladder(ctx: Link, landed: Landed, record: dict) -> None:
    """The plain re-run reports what the (detached) ladder did; a second one changes nothing."""
    lab, cut, control_dir, steps = ctx.lab, ctx.cut, ctx.control_dir, ctx.steps
    rerun = adhoc(ctx.env, args(steps))
    out, _err = rerun.communicate(timeout=300)
    state, result = result_of(out)
    assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
    assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == record["stopped_by"]
    note = [n for n in result["notes"] if n.startswith("nothing selected now; ")]
    assert note and "stopped the job with %s" % record["stopped_by"] in note[0], result
    assert "training_stop pid %d" % record["pid"] in note[0], result
    if cut == RESTARTED:  # through the connection that outlived the restart
        assert master_pid(control_dir)[1] == landed.master and not [p for p in landed.serving if gone(p)]
    elif cut == DOWN_KILLED:  # a new master, through the listener that came back
        assert sshd_serves(lab, control_dir, landed.restarted["new_pid"])
    # the second re-run: with a fresh master after a restart, so through the new listener
    second_dir = control_dir + "2" if cut == RESTARTED else control_dir
    again = adhoc(ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=second_dir), args(steps))
    out, _err = again.communicate(timeout=300)
    state, result = result_of(out)
    assert state == "SUCCESS" and not result["changed"] and result["selected"] == [] and result["rungs"] == [], out
    if cut == RESTARTED:
        assert sshd_serves(lab, second_dir, landed.restarted["new_pid"])
    for each in (control_dir, second_dir, control_dir + "3"):
        stop_masters(each)


def the_link_point_holds(ctx: Link, landed: Landed) -> dict:
    """The check of every point (what tests/faults/README.md says must happen); the decoys wrongly signalled."""
    lab = ctx.lab
    run_outcome(ctx, landed)
    reruns_report_the_ladder(ctx, landed, ladder_finished_on_its_own(ctx, landed))
    # nothing outside the job signalled; the job only by the rungs, each at most once
    wrong = wrongly_signalled(lab, ctx.decoys_before)
    assert wrong == 0, "%s: decoys signalled, gone or stopped (before: %s)" % (ctx.name, sorted(ctx.decoys_before))
    for pid, (role, signals) in job_signals(lab, ctx.job).items():
        assert set(signals) <= RUNG_SIGNALS, "%s: %s %d got %s" % (ctx.name, role, pid, signals)
        forward = 1 if role.startswith("worker") else 0  # the launcher's SIGTERM to its workers
        assert signals.count("SIGINT") <= 1 and signals.count("SIGTERM") <= 1 + forward, (role, signals)
    assert checkpoint_ok(lab), "%s: a checkpoint does not verify" % ctx.name
    assert not [a for a in ct200.ct_processes(lab).values() if "training_stop" in a or "AnsiballZ" in a]
    assert ct200.lock_holder(lab) in (None, ctx.lock_before)
    return {"wrongly_signalled": wrong}


INJECTORS = {"master_killed": link_cut, "sshd_child_killed": link_cut, FROZEN: link_cut,
             RESTARTED: sshd_restarted, DOWN_KILLED: sshd_down_master_killed}
FAULTS = [Fault(cut, "%s rung, %s trainer" % (RUNGS[rung], behaviour), INJECTORS[cut], the_link_point_holds,
                at={"cut": cut, "rung": rung, "behaviour": behaviour}, ci=point_id in CI_POINTS)
          for cut, rung, behaviour, point_id in POINTS]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_link_cut_during_each_rung(lab, figures, tmp_path, row):
    cut, rung, behaviour = row.at["cut"], row.at["rung"], row.at["behaviour"]
    catchable = behaviour != "stubborn"
    control_dir = str(cp_dir(tmp_path))
    job, decoys_before = trainer_up(lab, behaviour)
    ctx = Link(lab, figures, cut, rung, behaviour, ladder(SAVE_S + 10 if catchable else RUNG_S),  # the save fits
               control_dir, ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir), job, decoys_before,
               host_trainer_pids(lab))
    assert ctx.watch, "no trainer process seen on the host"
    with lab_support.lab_lock(lab):
        # the role's run lock: these ad-hoc runs never take it; one left by another suite's killed play is not ours
        ctx.lock_before = ct200.lock_holder(lab)
        ctx.since = time.time() - 1
        ctx.run = adhoc(ctx.env, args(ctx.steps))
        try:
            ctx.record = ladder_running(lab, ctx.since)
            faults.run(figures, row, ctx)
        finally:
            end_run(ctx)


# ---------------------------------------------------------------- the controller dies, its worker must follow

def group_killed_in_the_sigterm_rung(ctx: Link) -> tuple:
    """The injector: ``ansible``'s process group SIGKILLed CUT_INTO_S into the SIGTERM rung, while its worker waits
    on the ladder; (the workers it had then, when the kill landed)."""
    run = ctx.run
    try:
        time.sleep(max(0.0, ctx.record["started"] + ctx.steps[0]["timeout"] + CUT_INTO_S - time.time()))
        workers = controller_tree(run.pid)
        assert workers, "no worker under ansible (pid %d) while its task runs" % run.pid
        os.killpg(run.pid, signal.SIGKILL)  # the group only: the setsid'd workers are not in it
        killed_at = time.monotonic()
        run.wait(30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    return workers, killed_at


def workers_follow_their_controller(ctx: Link, landed: tuple) -> dict:
    """No worker of the run survives past the bound; the ladder finishes on its own and the re-run reports it;
    nothing outside the run signalled."""
    lab, steps, (workers, killed_at) = ctx.lab, ctx.steps, landed
    workers_gone_within_bound(workers)
    ctx.figures.wait("worker gone after its controller was killed", time.monotonic() - killed_at, WORKER_EXIT_BOUND_S)
    wait_for(lambda: not ct200.trainer_pids(lab), sum(s["timeout"] for s in steps) + 30,
             "the ladder to finish the job on its own")
    record = wait_for(lambda: my_record(lab, ctx.since).get("state") in ("done", "failed") and my_record(lab, ctx.since),
                      30, "the ladder's record")
    assert record["state"] == "done" and record["stopped_by"] == "SIGKILL", record
    rerun = adhoc(ctx.env, args(steps))
    out, _err = rerun.communicate(timeout=300)
    state, result = result_of(out)
    assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
    assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == "SIGKILL", result
    stop_masters(ctx.control_dir)
    wrong = wrongly_signalled(lab, ctx.decoys_before)
    assert wrong == 0
    for pid, (role, signals) in job_signals(lab, ctx.job).items():
        assert set(signals) <= RUNG_SIGNALS, (role, pid, signals)
    assert checkpoint_ok(lab)
    assert ct200.lock_holder(lab) is None
    return {"wrongly_signalled": wrong}


CONTROLLER = [Fault("ansible SIGKILLed (process group only)", "SIGTERM rung, stubborn trainer",
                    group_killed_in_the_sigterm_rung, workers_follow_their_controller)]


@pytest.mark.parametrize("row", faults.table(CONTROLLER))
def test_controller_process_group_killed_during_the_sigterm_rung(lab, figures, tmp_path, row):
    """``ansible`` SIGKILLed (its process group only, as ``kill -9 -PGID`` or a cancelled job does) while its
    worker waits on the ladder: ansible-core 2.19's workers setsid out of that group, so only the kernel's
    parent-death signal (pct_ssh asks for it in the worker) ends them."""
    # a long SIGTERM rung: the task goes on ORPHAN_RUNG_S - CUT_INTO_S after the kill, longer than the bound, so
    # a worker that merely finishes its task (as an untied one does, then fails to report) does not pass
    steps = ladder()
    steps[1] = dict(steps[1], timeout=ORPHAN_RUNG_S)
    assert ORPHAN_RUNG_S - CUT_INTO_S > WORKER_EXIT_BOUND_S + 3
    control_dir = str(cp_dir(tmp_path))
    job, decoys_before = trainer_up(lab, "stubborn")
    ctx = Link(lab, figures, "process group", 1, "stubborn", steps, control_dir,
               ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir), job, decoys_before, [])
    with lab_support.lab_lock(lab):
        ctx.since = time.time() - 1
        ctx.run = start_adhoc_in_group(ctx.env, args(steps))
        try:
            ctx.record = ladder_running(lab, ctx.since)
            faults.run(figures, row, ctx)
        finally:
            end_run(ctx)
