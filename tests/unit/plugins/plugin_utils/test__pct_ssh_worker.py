# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A worker tied to its controller ends when the controller is SIGKILLed, with real processes.

The "controller" is a Python process that forks a "worker"; the worker calls ``os.setsid()`` as
ansible-core's ``WorkerProcess._detach`` does, so a kill of the controller's process group misses it.
Only the PIDs these tests started are signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh_worker
from tests.support.paths import COLLECTIONS, ROOT
from tests.support.procfs import exited
from tests.support.wait import wait_for

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
              pytest.mark.processes]

CONTROLLER = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [sys.argv[1]]
    from ansible_collections.gpuops.repurpose.plugins.plugin_utils._pct_ssh_worker import die_with_parent
    report, mode = sys.argv[2], sys.argv[3]
    controller = os.getpid()
    if os.fork() == 0:
        os.setsid()  # as ansible-core's worker
        if mode == "late":  # the controller is gone before the worker asks
            while os.getppid() == controller:
                time.sleep(0.01)
        with open(report + ".tmp", "w") as fh:
            fh.write("%d\\n" % os.getpid())
        os.rename(report + ".tmp", report)
        tied = die_with_parent(controller)
        with open(report + ".after.tmp", "w") as fh:  # renamed: the test reads it as soon as it exists
            fh.write("%s\\n" % tied)
        os.rename(report + ".after.tmp", report + ".after")
        time.sleep(60)
        os._exit(0)
    if mode == "late":
        os._exit(0)
    time.sleep(60)
""")


def start(tmp_path, mode: str):
    report = str(tmp_path / "worker")
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(COLLECTIONS), report, mode],
                                  cwd=str(ROOT), start_new_session=True)
    wait_for(lambda: os.path.exists(report), 30, "the worker to report", interval=0.02)
    with open(report) as fh:
        return controller, int(fh.read())


def test_worker_ends_when_its_controller_is_sigkilled(tmp_path):
    controller, worker = start(tmp_path, "tied")
    try:
        wait_for(lambda: os.path.exists(str(tmp_path / "worker.after")), 10, "the worker's request", interval=0.02)
        assert (tmp_path / "worker.after").read_text().strip() == "True"
        assert not exited(worker)
        os.killpg(controller.pid, signal.SIGKILL)  # the group only: the worker setsid'd out of it
        controller.wait(10)
        wait_for(lambda: exited(worker), 5, "the worker to end with its controller", interval=0.02)
    finally:
        if not exited(worker):
            os.kill(worker, signal.SIGKILL)
        if controller.poll() is None:
            controller.kill()
            controller.wait()


def test_worker_whose_controller_died_before_it_asked_ends_at_once(tmp_path):
    controller, worker = start(tmp_path, "late")
    try:
        controller.wait(10)
        wait_for(lambda: exited(worker), 5, "the orphaned worker to end", interval=0.02)
        assert not (tmp_path / "worker.after").exists()  # it never returned from the request
    finally:
        if not exited(worker):
            os.kill(worker, signal.SIGKILL)


def test_not_a_worker_is_left_alone():
    """In the controller (or this test process) there is no worker to tie: nothing is requested."""
    assert _pct_ssh_worker.controller_pid() is None
    assert _pct_ssh_worker.tie_worker_to_controller() is False
