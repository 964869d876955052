# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the run of ``training_stop`` reads about the job and the host before and after it climbs.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets): the signal order of the
snapshot, the process groups a Ctrl-C reaches, the GPU holders in scope and
whether another ladder holds the run lock.
"""

from __future__ import annotations

import fcntl
import os
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu_holders import classify_holders, scan_holders
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu_judge import DEFAULT_IGNORE_PROCESSES
from ansible_collections.gpuops.repurpose.plugins.module_utils._runlock import RunLock
from ansible_collections.gpuops.repurpose.plugins.module_utils._select import Member, Selection, read_tpgid


def launchers_first(selection: Selection) -> list[Member]:
    """The snapshot in signal order: roots (depth 0) first, then by depth and PID."""
    return sorted(selection.members.values(), key=lambda m: (m.depth, m.pid))


def root_groups(members: t.Sequence[Member], tpgid: t.Callable[[int], int] = read_tpgid) -> set[int]:
    """The process groups a Ctrl-C in the launchers' terminal reaches: the roots' own groups, and the terminal's
    foreground group where it is one of the job's (a shell running the launcher puts it in a group of its own)."""
    groups = {m.info.pgid for m in members if m.depth == 0}
    for m in members:
        if m.depth == 0:
            foreground = tpgid(m.pid)
            if foreground > 0 and any(o.info.pgid == foreground for o in members):
                groups.add(foreground)
    return groups


def gpu_holders(params: t.Mapping[str, t.Any], ignore_pids: t.Collection[int] = ()) -> list[dict[str, t.Any]]:
    """Processes holding params['gpu_devices'] in scope, one dict per pid (driver tools and ``ignore_pids`` left out)."""
    if not params["gpu_devices"]:
        return []
    found = scan_holders(params["gpu_devices"], exclude_pids={os.getpid()})
    counted, _ignored = classify_holders(found, None, DEFAULT_IGNORE_PROCESSES, params["container"])
    by_pid: dict[int, dict[str, t.Any]] = {}
    for holder in counted:
        if holder.pid not in ignore_pids:
            by_pid.setdefault(holder.pid, {"pid": holder.pid, "name": holder.name, "cmdline": holder.cmdline,
                                           "gpu": holder.gpu, "device": holder.device})
    return [by_pid[pid] for pid in sorted(by_pid)]


def locked_elsewhere(lock: RunLock) -> bool:
    """Check mode's peek: is a ladder holding the lock now? (never waits, never takes it for long)"""
    try:
        fd = os.open(lock.lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
