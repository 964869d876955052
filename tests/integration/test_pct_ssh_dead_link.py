# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The SSH link to the PVE host dies during the role's SIGTERM rung: the play fails within the bound, the
re-run's summary reports what the unwatched ladder did.

On the lab: CT200 runs the ``stubborn`` trainer (it ignores SIGINT and SIGTERM, only SIGKILL ends it);
playbooks/repurpose_ct200.yml runs the role through real ``gpuops.repurpose.pct_ssh``, and during its
SIGTERM rung the PVE host's sshd processes serving that connection are killed (the issue's hang). The
module-level cuts (control master killed, sshd child killed or frozen, at every rung) are the fault
suite's: tests/faults/test_dead_link_faults.py.

The CT200 trainer is restarted with its earlier behaviour afterwards. Only processes this test identified
by their PIDs are signalled. Skipped when the lab is not up.
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
from tests.support.playbook import ansible_env, control_dir, recap
from tests.support.stop_faults import master_pid, my_record, serving_sshd, stop_masters
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

# rung 1 (Ctrl-C) 2 s, rung 2 (SIGTERM) 10 s: the cut lands 4 s after the ladder started, inside SIGTERM
LADDER = [{"signal": "SIGINT", "via": "tmux", "timeout": 2}, {"signal": "SIGTERM", "timeout": 10},
          {"signal": "SIGKILL", "timeout": 5}]
CUT_AFTER_S = 4.0
# the connection's defaults (server_alive_interval 5, server_alive_count_max 3) and what a task adds around them
BOUND_S = _pct_ssh.dead_after(_pct_ssh.Settings(host="pve1.example.internal")) + 1.0
SLACK_S = 15.0  # ansible's own start and end on a loaded 2-core machine


@pytest.fixture
def stubborn(lab):
    before = lab.get("trainer", {}).get("behaviour") or "graceful"
    trainer("stubborn")
    yield
    lab_cli("trainer", before)  # best effort at teardown, as restore_trainer


# ---------------------------------------------------------------- the role, as the issue saw it

ROLE_VARS = dict(stop.FAST, stop_training_ladder=LADDER)


def playbook(env: dict) -> subprocess.Popen:
    """playbooks/repurpose_ct200.yml on the lab with ``ROLE_VARS``, in its own process group."""
    return stop.start(ROLE_VARS, env=env)


def test_role_rerun_reports_the_ladder_its_dead_link_left_running(lab, stubborn, tmp_path):
    """The issue's hang: the host's sshd child killed during SIGTERM. The play fails within the bound; the
    re-run's summary says what the unwatched ladder did; a second re-run changes nothing."""
    env = ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(control_dir(tmp_path)))
    with lab_lock(lab):
        wait_for(lambda: len(trainer_pids(lab)) == 9, 60, "the stubborn trainer (9 processes)")
        since = time.time() - 1
        play = playbook(env)
        try:
            record = wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 300,
                              "the role's ladder to start")
            time.sleep(max(0.0, record["started"] + CUT_AFTER_S - time.time()))
            _client, pid = master_pid(str(control_dir(tmp_path)))
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
        stop_masters(str(control_dir(tmp_path)))
