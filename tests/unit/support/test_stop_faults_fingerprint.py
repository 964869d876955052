"""The stop-half kill loop's fingerprint of what a killed run left in CT200 (tests/support/stop_faults.py)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_stat
from tests.support.ct200 import ps_table
from tests.support.stop_faults import (
    LOCK_DEAD_HOLDER,
    LOCK_FREE,
    LOCK_LIVE_HOLDER,
    controller_running,
    left_behind,
)

pytestmark = pytest.mark.processes

JOB = {100, 101, 102}
PS = """\
    1 Ss   /sbin/init
  100 Sl   python3 /opt/lab/trainer/fake_trainer.py --behaviour stubborn
  101 Rl   /usr/bin/python3 /opt/lab/trainer/fake_trainer.py --worker --rank 0
  102 Tl   /usr/bin/python3 /opt/lab/trainer/fake_trainer.py --worker --rank 1
  300 S    /usr/bin/python3 -c training_stop
"""
GPUS = {"0": 90004, "1": 4, "2": 0}


def record(state, started, pid=300, stopped_by=None, rungs=()):
    return {"selection": "tmux_session=dflash", "state": state, "started": started, "pid": pid,
            "stopped_by": stopped_by, "rungs": [{"signal": s, "sent_at": 1.0 + n} for n, s in enumerate(rungs)]}


def test_ps_table_reads_pid_state_and_command_line():
    states = ps_table(PS)
    assert states[102] == ("Tl", "/usr/bin/python3 /opt/lab/trainer/fake_trainer.py --worker --rank 1")
    assert states[1][0] == "Ss" and len(states) == 5


def test_the_job_running_and_stopped_the_lock_and_a_running_ladder():
    left = left_behind(ps_table(PS), JOB, {"run_id": "r"}, False, [record("running", 50.0)], since=40.0,
                       gpu_used=GPUS)
    assert (left.job_running, left.job_stopped) == (3, 1)
    assert left.lock == LOCK_DEAD_HOLDER and left.ladder_running
    assert left.ladder == ("running", "stopped by none")
    assert left.gpus_held == ("0", "1")


def test_pids_and_times_do_not_count_but_states_do():
    done = record("done", 60.0, pid=301, stopped_by="SIGKILL", rungs=("SIGINT", "SIGTERM", "SIGKILL"))
    one = left_behind({}, JOB, None, False, [done], since=55.0, gpu_used=GPUS)
    other_pids = left_behind({7: ("S", "bash")}, {200, 201}, None, False,
                             [dict(done, pid=999, started=80.0, finished=90.0)], since=70.0, gpu_used=GPUS)
    assert one == other_pids and one.lock == LOCK_FREE and not one.ladder_running
    assert one.ladder == ("done", "stopped by SIGKILL", "rung SIGINT", "rung SIGTERM", "rung SIGKILL")
    # what a re-run treats differently stays apart: another rung, a held lock, a live holder, a process left
    assert one != left_behind({}, JOB, None, False, [dict(done, stopped_by="SIGINT", rungs=[])], 55.0, GPUS)
    assert one != left_behind({}, JOB, {"run_id": "r"}, False, [done], 55.0, GPUS)
    assert left_behind({}, JOB, {"run_id": "r"}, True, [done], 55.0, GPUS).lock == LOCK_LIVE_HOLDER
    assert one != left_behind({100: ("S", "x")}, JOB, None, False, [done], 55.0, GPUS)


def test_an_older_record_is_not_the_killed_runs_and_a_zombie_is_gone():
    older = record("done", 10.0, stopped_by="SIGKILL", rungs=("SIGKILL",))
    left = left_behind({100: ("Z", "[python3] <defunct>")}, JOB, None, False, [older], since=20.0, gpu_used={})
    assert left.ladder == () and left.job_running == 0 and not left.ladder_running
    # a ladder still running counts whoever started it, while its process lives
    live = left_behind({300: ("S", "python3")}, JOB, None, False, [record("running", 10.0)], since=20.0, gpu_used={})
    dead = left_behind({}, JOB, None, False, [record("running", 10.0)], since=20.0, gpu_used={})
    assert live.ladder_running and not dead.ladder_running


def test_a_lock_holders_controller_runs_while_its_pid_and_start_time_do_and_not_as_a_zombie():
    """Real processes: the holder's recorded PID and start time, on this machine and on another one."""
    here = os.uname().nodename
    child = subprocess.Popen(["sleep", "30"])
    try:
        started = read_stat(child.pid).starttime
        holder = {"controller": here, "controller_pid": child.pid, "controller_started": started}
        assert controller_running(holder)
        assert controller_running({"controller": here, "controller_pid": child.pid})  # no start time recorded
        assert not controller_running(dict(holder, controller_started=started + 1))  # the PID reused
        assert controller_running(dict(holder, controller="ctl2.example.internal", controller_pid=0))
        assert not controller_running(dict(holder, controller_pid=0))
        child.kill()
        deadline = time.monotonic() + 10
        while read_stat(child.pid).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not controller_running(holder), "a zombie (killed, not yet reaped) is not a running controller"
    finally:
        child.kill()
        child.wait()
    assert not controller_running(holder), "reaped"
