# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The SSH link to the PVE host dies during the SIGTERM rung: the task fails within the bound, the ladder finishes.

On the lab: CT200 runs the ``stubborn`` trainer (it ignores SIGINT and SIGTERM,
only SIGKILL ends it); ``training_stop`` runs inside CT200 through real
``ansible`` and ``gpuops.repurpose.pct_ssh``. During its SIGTERM rung the link
is cut three ways: the pct_ssh control master killed, the PVE host's sshd
processes serving that connection killed, and the same frozen (SIGSTOP: a
silent host). Each time:

- the ``ansible`` run fails (unreachable, saying the connection died) within the
  documented detection bound, never at ``command_timeout``;
- the ladder inside CT200 still climbs to SIGKILL: no process of the job is
  left, none stopped (state T);
- the record it left says so, and the re-run (a fresh connection) reports it:
  what was stopped, by which rung, when; a second re-run changes nothing.

The CT200 trainer is restarted with its earlier behaviour afterwards. Only
processes this test identified by their PIDs are signalled. Skipped when the
lab is not up.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from tests.support import stop_training as stop
from tests.support.ct200 import trainer_pids
from tests.support.lab import lab_cli, lab_lock, trainer
from tests.support.playbook import ansible_env, recap, start_adhoc
from tests.support.stop_faults import master_pid, my_record, result_of, serving_sshd, stop_masters
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

# rung 1 (Ctrl-C) 2 s, rung 2 (SIGTERM) 10 s: the cut lands 4 s after the ladder started, inside SIGTERM
LADDER = [{"signal": "SIGINT", "via": "tmux", "timeout": 2}, {"signal": "SIGTERM", "timeout": 10},
          {"signal": "SIGKILL", "timeout": 5}]
CUT_AFTER_S = 4.0
ARGS = {"tmux_session": "dflash", "ladder": LADDER, "lock_timeout": 60}
# the connection's defaults (server_alive_interval 5, server_alive_count_max 3) and what a task adds around them
BOUND_S = _pct_ssh.dead_after(_pct_ssh.Settings(host="pve1.example.internal")) + 1.0
SLACK_S = 15.0  # ansible's own start and end on a loaded 2-core machine


def adhoc(env: dict, args: dict) -> subprocess.Popen:
    """training_stop on ct200 through real ``ansible`` (one-line output)."""
    return start_adhoc("ct200", "gpuops.repurpose.training_stop", args, options=["-o"], env=env)


@pytest.fixture
def stubborn(lab):
    before = lab.get("trainer", {}).get("behaviour") or "graceful"
    trainer("stubborn")
    yield
    lab_cli("trainer", before)  # best effort at teardown, as restore_trainer


@pytest.mark.parametrize("cut", ["master_killed", "sshd_child_killed", "sshd_child_frozen"])
def test_link_cut_during_sigterm_rung(lab, stubborn, tmp_path, cut):
    control_dir = str(tmp_path / "cp")
    env = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir)
    frozen: list[int] = []
    with lab_lock(lab):
        job = wait_for(lambda: len(trainer_pids(lab)) == 9 and trainer_pids(lab), 60, "the stubborn trainer (9 processes)")
        since = time.time() - 1
        run = adhoc(env, ARGS)
        try:
            record = wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 60,
                              "the ladder to start")
            time.sleep(max(0.0, record["started"] + CUT_AFTER_S - time.time()))
            client, pid = master_pid(control_dir)
            if cut == "master_killed":
                os.kill(pid, signal.SIGKILL)
            else:
                victims = serving_sshd(lab, pid)
                for victim in victims:
                    os.kill(victim, signal.SIGSTOP if cut == "sshd_child_frozen" else signal.SIGKILL)
                if cut == "sshd_child_frozen":
                    frozen = victims
            cut_at = time.monotonic()
            out, _err = run.communicate(timeout=BOUND_S + SLACK_S)
            detected_in = time.monotonic() - cut_at
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        try:
            state, result = result_of(out)
            assert state == "UNREACHABLE!" and run.returncode != 0, out
            if cut == "master_killed":
                assert "control master" in result["msg"] and "went away" in result["msg"], result
            else:
                assert "the SSH connection died" in result["msg"], result
                if cut == "sshd_child_frozen":
                    assert "answered no keepalive" in result["msg"], result
            assert detected_in <= BOUND_S + SLACK_S
            # the ladder goes on without its caller: SIGTERM's 10 s, then SIGKILL
            wait_for(lambda: not trainer_pids(lab), 10 + 5 + 30, "the ladder to finish the job on its own")
            record = wait_for(lambda: my_record(lab, since).get("state") in ("done", "failed") and my_record(lab, since),
                              30, "the ladder's record")
            assert record["state"] == "done" and record["stopped_by"] == "SIGKILL", record
            assert [r["signal"] for r in record["rungs"]] == ["SIGINT", "SIGTERM", "SIGKILL"], record
            assert record["stopped_count"] >= len(job)
            if cut != "master_killed":  # the master stays behind its dead connection at most DEAD_DRAIN_S
                wait_for(lambda: not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ")[1][0] == "Z",
                         _pct_ssh.DEAD_DRAIN_S + 5, "the control master to exit")
        finally:
            for victim in frozen:
                os.kill(victim, signal.SIGKILL)
                os.kill(victim, signal.SIGCONT)

        rerun = adhoc(env, ARGS)
        out, _err = rerun.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
        assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == "SIGKILL"
        note = [n for n in result["notes"] if n.startswith("nothing selected now; ")]
        assert note and "stopped the job with SIGKILL" in note[0] and "training_stop pid %d" % record["pid"] in note[0], result
        again = adhoc(env, ARGS)
        out, _err = again.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [] and result["rungs"] == [], out
        stop_masters(control_dir)


# ---------------------------------------------------------------- the role, as the issue saw it

ROLE_VARS = dict(stop.FAST, stop_training_ladder=LADDER)


def playbook(env: dict) -> subprocess.Popen:
    """playbooks/repurpose_ct200.yml on the lab with ``ROLE_VARS``, in its own process group."""
    return stop.start(ROLE_VARS, env=env)


def test_role_rerun_reports_the_ladder_its_dead_link_left_running(lab, stubborn, tmp_path):
    """The issue's hang: the host's sshd child killed during SIGTERM. The play fails within the bound; the
    re-run's summary says what the unwatched ladder did; a second re-run changes nothing."""
    env = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    with lab_lock(lab):
        wait_for(lambda: len(trainer_pids(lab)) == 9, 60, "the stubborn trainer (9 processes)")
        since = time.time() - 1
        play = playbook(env)
        try:
            record = wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 300,
                              "the role's ladder to start")
            time.sleep(max(0.0, record["started"] + CUT_AFTER_S - time.time()))
            _client, pid = master_pid(str(tmp_path / "cp"))
            for victim in serving_sshd(lab, pid):
                os.kill(victim, signal.SIGKILL)
            out, _err = play.communicate(timeout=BOUND_S + SLACK_S + 60)  # + the role's own end tasks
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
                play.wait()
        assert play.returncode != 0 and "the SSH connection died" in out, out[-3000:]
        wait_for(lambda: not trainer_pids(lab), 10 + 5 + 30, "the ladder to finish the job on its own")
        record = wait_for(lambda: my_record(lab, since).get("state") == "done" and my_record(lab, since), 30,
                          "the ladder's record")
        assert record["stopped_by"] == "SIGKILL", record

        rerun = playbook(env)
        out, _err = rerun.communicate(timeout=600)
        assert rerun.returncode == 0, out[-4000:]
        assert "Stopped: nothing, no process was selected" in out
        flat = re.sub(r"\s+", " ", out)  # the yaml callback wraps long summary lines
        summary = re.search(r"The last ladder for this selection \(training_stop pid (\d+), started [^)]*\) stopped the job "
                            r"with SIGKILL at \S+, (\d+) process\(es\)", flat)
        assert summary and int(summary.group(1)) == record["pid"], out[-4000:]
        assert int(summary.group(2)) == record["stopped_count"]
        again = playbook(env)
        out2, _err = again.communicate(timeout=600)
        assert again.returncode == 0 and recap(out2)["changed"] == 0, out2[-4000:]
        assert "stopped the job with SIGKILL" in re.sub(r"\s+", " ", out2)  # the same earlier run, reported again
        stop_masters(str(tmp_path / "cp"))
