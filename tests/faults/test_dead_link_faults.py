"""The SSH link to the PVE host cut while ``training_stop`` runs inside CT200, during each rung of its ladder.

On the lab: ``training_stop`` runs inside CT200 through real ``ansible`` and ``gpuops.repurpose.pct_ssh``
(its own control directory per point), against the ``stubborn`` trainer (workers ignore SIGINT and SIGTERM:
every rung runs) with short rungs. The link is cut two ways, each during each rung:

- ``master_killed``: the pct_ssh control master SIGKILLed (the controller side dies);
- ``sshd_child_killed``: the lab PVE host's sshd processes serving that connection SIGKILLed (the host
  side dies; found by the TCP socket they hold, only among the lab sshd's own descendants).

A catchable rung (SIGINT via tmux, SIGTERM) is cut 1 s after it began (its timeout is 3 s); the SIGKILL
rung, which the stubborn trainer ends at once, is cut the moment its signal has landed (a trainer process
seen gone on the host), while the rung waits to confirm the job is gone. One more point runs the
``slow_checkpoint`` trainer (a 20 s shutdown save after Ctrl-C) with the link cut mid-save, and one
``sshd_child_frozen`` (the same sshd processes SIGSTOPped: a silent host that only the keepalives notice)
during the SIGTERM rung.

At each point (what tests/faults/README.md says must happen):

- the ``ansible`` run fails fast, unreachable, naming the dead connection, within the documented
  worst-case detection time (``dead_after`` of the connection's defaults, + ansible's own start/end);
- the ladder inside CT200 finishes on its own (no job process left, none stopped) and leaves its result:
  state ``done``, stopped by the rung the trainer obeys, the rungs it climbed;
- the plain re-run reports what the detached ladder did (its pid, the rung) instead of "nothing to do";
  a second re-run changes nothing and climbs no rung;
- no decoy was signalled (the lab's signal audit), each job process got only the ladder's rungs, at most once;
- every checkpoint verifies; no training_stop is left running in CT200 and the run lock is free.

Marked ``lab`` (and ``faults``): skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from tests.support import ct200
from tests.support import lab as lab_support
from tests.support.paths import ROOT
from tests.support.playbook import adhoc_argv, ansible_env, start_adhoc
from tests.support.procfs import descendants
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
FROZEN = "sshd_child_frozen"  # SIGSTOP: a silent host, noticed only by keepalives (one point: the SIGTERM rung)
# the connection's defaults (server_alive_interval 5, server_alive_count_max 3): the documented worst case
DETECT_BOUND_S = _pct_ssh.dead_after(_pct_ssh.Settings(host="pve1.example.internal"))
SLACK_S = 15.0  # ansible's own start and end on a loaded 2-core machine


ORPHAN_RUNG_S = 12.0  # the SIGTERM rung when the controller is killed in it (see the test)


def ladder(first_rung_s: float = RUNG_S) -> list:
    return [{"signal": "SIGINT", "via": "tmux", "timeout": first_rung_s}, {"signal": "SIGTERM", "timeout": RUNG_S},
            {"signal": "SIGKILL", "timeout": KILL_RUNG_S}]


def args(steps: list) -> dict:
    return {"tmux_session": "dflash", "ladder": steps, "lock_timeout": 30}


POINTS = [pytest.param(cut, rung, "stubborn", id="%s-%s" % (cut, RUNGS[rung])) for cut in CUTS for rung in range(3)]
POINTS.append(pytest.param("sshd_child_killed", 0, "slow_checkpoint", id="sshd_child_killed-SIGINT-slow_checkpoint"))
POINTS.append(pytest.param(FROZEN, 1, "stubborn", id="%s-SIGTERM" % FROZEN))


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


def wait_for_cut_moment(lab: dict, record: dict, rung: int, steps: list, watch: list) -> None:
    """Sleep until the point's cut moment: CUT_INTO_S into a catchable rung, or the SIGKILL rung's signal landed."""
    rung_start = record["started"] + sum(s["timeout"] for s in steps[:rung])
    if RUNGS[rung] != "SIGKILL":
        time.sleep(max(0.0, rung_start + CUT_INTO_S - time.time()))
        return
    time.sleep(max(0.0, rung_start - 0.5 - time.time()))
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
    """The frozen sshd processes of a point: killed, then continued so the kill lands."""
    for victim in frozen:
        os.kill(victim, signal.SIGKILL)
        os.kill(victim, signal.SIGCONT)


@pytest.mark.parametrize("cut, rung, behaviour", POINTS)
def test_link_cut_during_each_rung(lab, figures, tmp_path, cut, rung, behaviour):
    name = "link cut (%s) during the %s rung, %s trainer" % (cut, RUNGS[rung], behaviour)
    catchable = behaviour != "stubborn"
    steps = ladder(SAVE_S + 10 if catchable else RUNG_S)  # the save fits in the first rung
    control_dir = str(tmp_path / "cp")
    env = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir)
    frozen: list = []
    job, decoys_before = trainer_up(lab, behaviour)
    watch = host_trainer_pids(lab)
    assert watch, "no trainer process seen on the host"
    with lab_support.lab_lock(lab):
        since = time.time() - 1
        run = adhoc(env, args(steps))
        try:
            record = ladder_running(lab, since)
            wait_for_cut_moment(lab, record, rung, steps, watch)
            cut_wall = time.time()
            master = cut_link(lab, cut, control_dir, frozen)
            figures.injected(name)
            cut_at = time.monotonic()
            out, _err = run.communicate(timeout=DETECT_BOUND_S + SLACK_S)
            detected_in = time.monotonic() - cut_at
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
            end_frozen(frozen)
        figures.wait("dead link detected (ansible run ended after the cut)", detected_in, DETECT_BOUND_S + SLACK_S)

        # the play fails fast, naming the dead connection
        state, result = result_of(out)
        assert state == "UNREACHABLE!" and run.returncode != 0, out
        if cut == "master_killed":
            assert "control master" in result["msg"] and "went away" in result["msg"], result
        else:
            assert "the SSH connection died" in result["msg"], result
        if cut == FROZEN:
            assert "answered no keepalive" in result["msg"], result

        # the ladder finishes on its own and leaves its result
        left_s = sum(s["timeout"] for s in steps) + 30
        wait_for(lambda: not ct200.trainer_pids(lab), left_s, "the ladder to finish the job on its own")
        record = wait_for(lambda: my_record(lab, since).get("state") in ("done", "failed") and my_record(lab, since),
                          30, "the ladder's record")
        figures.wait("ladder finished after the cut (%s trainer)" % behaviour, time.time() - cut_wall, left_s)
        assert record["state"] == "done", record
        climbed = [r["signal"] for r in record["rungs"]]
        if catchable:
            assert record["stopped_by"].startswith("SIGINT") and climbed == ["SIGINT"], record
        else:
            assert record["stopped_by"] == "SIGKILL" and climbed == list(RUNGS), record
        # the cut landed in the rung this point names (rung times from the record: sent_at is per ladder)
        sent = [record["started"] + r["sent_at"] - record["rungs"][0]["sent_at"] for r in record["rungs"]]
        assert cut_wall >= sent[rung] - 0.25, (cut_wall, sent, record)
        if rung + 1 < len(sent):
            assert cut_wall < sent[rung + 1], (cut_wall, sent, record)
        assert record["stopped_count"] >= len(job)
        assert not stopped_states(lab, ct200.trainer_pids(lab))
        if cut != "master_killed":  # the master stays behind its dead connection at most DEAD_DRAIN_S
            wait_for(lambda: gone(master), _pct_ssh.DEAD_DRAIN_S + 5, "the control master to exit")

        # the plain re-run reports what the detached ladder did; a second one changes nothing
        rerun = adhoc(env, args(steps))
        out, _err = rerun.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
        assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == record["stopped_by"]
        note = [n for n in result["notes"] if n.startswith("nothing selected now; ")]
        assert note and "stopped the job with %s" % record["stopped_by"] in note[0], result
        assert "training_stop pid %d" % record["pid"] in note[0], result
        again = adhoc(env, args(steps))
        out, _err = again.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [] and result["rungs"] == [], out
        stop_masters(control_dir)

    # nothing outside the job signalled; the job only by the rungs, each at most once
    wrong = wrongly_signalled(lab, decoys_before)
    assert wrong == 0, "%s: decoys signalled, gone or stopped (before: %s)" % (name, sorted(decoys_before))
    for pid, (role, signals) in job_signals(lab, job).items():
        assert set(signals) <= RUNG_SIGNALS, "%s: %s %d got %s" % (name, role, pid, signals)
        forward = 1 if role.startswith("worker") else 0  # the launcher's SIGTERM to its workers
        assert signals.count("SIGINT") <= 1 and signals.count("SIGTERM") <= 1 + forward, (role, signals)
    assert checkpoint_ok(lab), "%s: a checkpoint does not verify" % name
    assert not [a for a in ct200.ct_processes(lab).values() if "training_stop" in a or "AnsiballZ" in a]
    assert ct200.lock_holder(lab) is None
    figures.survived(name, wrongly_signalled=wrong)


# ---------------------------------------------------------------- the controller dies, its worker must follow

def test_controller_process_group_killed_during_the_sigterm_rung(lab, figures, tmp_path):
    """``ansible`` SIGKILLed (its process group only, as ``kill -9 -PGID`` or a cancelled job does) while its
    worker waits on the ladder: ansible-core 2.19's workers setsid out of that group, so only the kernel's
    parent-death signal (pct_ssh asks for it in the worker) ends them. No worker of the run survives past
    the bound; the ladder finishes on its own and the re-run reports it; nothing outside the run signalled."""
    name = "ansible SIGKILLed (process group only) during the SIGTERM rung, stubborn trainer"
    # a long SIGTERM rung: the task goes on ORPHAN_RUNG_S - CUT_INTO_S after the kill, longer than the bound, so
    # a worker that merely finishes its task (as an untied one does, then fails to report) does not pass
    steps = ladder()
    steps[1] = dict(steps[1], timeout=ORPHAN_RUNG_S)
    assert ORPHAN_RUNG_S - CUT_INTO_S > WORKER_EXIT_BOUND_S + 3
    control_dir = str(tmp_path / "cp")
    env = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir)
    job, decoys_before = trainer_up(lab, "stubborn")
    with lab_support.lab_lock(lab):
        since = time.time() - 1
        run = start_adhoc_in_group(env, args(steps))
        try:
            record = ladder_running(lab, since)
            time.sleep(max(0.0, record["started"] + steps[0]["timeout"] + CUT_INTO_S - time.time()))
            workers = controller_tree(run.pid)
            assert workers, "no worker under ansible (pid %d) while its task runs" % run.pid
            os.killpg(run.pid, signal.SIGKILL)  # the group only: the setsid'd workers are not in it
            figures.injected(name)
            killed_at = time.monotonic()
            run.wait(30)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        workers_gone_within_bound(workers)
        figures.wait("worker gone after its controller was killed", time.monotonic() - killed_at, WORKER_EXIT_BOUND_S)

        wait_for(lambda: not ct200.trainer_pids(lab), sum(s["timeout"] for s in steps) + 30,
                 "the ladder to finish the job on its own")
        record = wait_for(lambda: my_record(lab, since).get("state") in ("done", "failed") and my_record(lab, since),
                          30, "the ladder's record")
        assert record["state"] == "done" and record["stopped_by"] == "SIGKILL", record
        rerun = adhoc(env, args(steps))
        out, _err = rerun.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
        assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == "SIGKILL", result
        stop_masters(control_dir)
    wrong = wrongly_signalled(lab, decoys_before)
    assert wrong == 0
    for pid, (role, signals) in job_signals(lab, job).items():
        assert set(signals) <= RUNG_SIGNALS, (role, pid, signals)
    assert checkpoint_ok(lab)
    assert ct200.lock_holder(lab) is None
    figures.survived(name, wrongly_signalled=wrong)
