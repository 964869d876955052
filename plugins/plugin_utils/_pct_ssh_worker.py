# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""An Ansible worker process that ends when its controller dies (Linux).

ansible-core 2.19 forks each task's worker from the ``ansible-playbook`` (or ``ansible``)
process itself (``multiprocessing`` ``fork`` context, started from the main thread in
``StrategyBase._queue_task``), and the worker calls ``os.setsid()`` first thing
(``WorkerProcess._detach`` in lib/ansible/executor/process/worker.py). So a
``kill -9`` of the controller's process group, as a cancelled job runner does, misses
the workers: they go on, each holding its connection and its request open, and nobody
is left to read their results. A signal handler cannot help (SIGKILL has none).

The kernel can: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` in the worker makes the death of the
thread that forked it (the controller's main thread) deliver SIGTERM to the worker, whose
own handler (``WorkerProcess._term``) then ends its process group and itself. The pct_ssh
control master is started with a new session and has no such request (it is meant to
outlive a run, like OpenSSH's ControlPersist): a request of a dead worker ends there when
its heartbeat to the worker fails.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import typing as t

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WORKER_MODULE = "ansible.executor.process.worker"

_TIED: t.Set[int] = set()  # the PIDs (this process after forks) that have asked already


def controller_pid() -> t.Optional[int]:
    """The PID of the controller that forked this process, when this process is an Ansible task worker;
    None in the controller itself (``meta: reset_connection`` runs a connection there) or elsewhere."""
    worker = sys.modules.get(WORKER_MODULE)
    if worker is None or getattr(worker, "current_worker", None) is None:
        return None
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def die_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send SIGNUM to this process when PARENT_PID, its parent, dies.

    If the parent died before the request was in place (this process was already reparented), the
    signal is sent at once, as the kernel would have. False where the kernel offers no such request
    (not Linux, no libc ``prctl``, refused): the worker then behaves as ansible-core's own.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)
    return True


def tie_worker_to_controller() -> bool:
    """In an Ansible task worker: end it (SIGTERM) when its controller dies. Once per process; True when in place."""
    pid = os.getpid()
    if pid in _TIED:
        return True
    parent = controller_pid()
    if parent is None or not die_with_parent(parent):
        return False
    _TIED.add(pid)
    return True
