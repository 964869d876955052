# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the run of ``training_stop`` reads about the job and the host before and after it climbs.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets): the signal order of the
snapshot, the process groups a Ctrl-C reaches, the GPU holders in scope and
whether another ladder holds the run lock, and what the launch record needs.
"""

from __future__ import annotations

import fcntl
import os
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.holders import classify_holders, scan_holders
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import DEFAULT_IGNORE_PROCESSES
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import allowed_env
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ancestors_of, read_environ, read_tpgid
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder_lock import RunLock
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.report import user_name
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import Member, Selection
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import (
    Pane,
    last_step_line,
    pane_text,
)


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


def tmux_launcher(members: t.Sequence[Member]) -> Member | None:
    """The job's launcher as the operator started it in the session: the first root found through its panes."""
    return next((m for m in members if m.depth == 0 and m.how == "tmux_session"), None)


def launch_facts(launcher: Member, panes: t.Sequence[Pane], socket: str | None,
                 extra_env: t.Sequence[str]) -> dict[str, t.Any]:
    """What starts ``launcher`` again, read before the first signal: argv, cwd, user, allow-listed env, window."""
    lineage = {launcher.pid, *ancestors_of(launcher.pid)}
    pane = next((p for p in panes if p.pid in lineage), panes[0] if panes else None)
    try:
        cwd = os.readlink("/proc/%d/cwd" % launcher.pid)
    except OSError:
        cwd = ""
    return {"argv": list(launcher.info.cmdline), "cwd": cwd, "uid": launcher.info.uid,
            "user": user_name(launcher.info.uid) or "", "window": pane.window_name if pane else "",
            "env": allowed_env(read_environ(launcher.pid) or {}, extra_env)}


def step_line_now(panes: t.Sequence[Pane], step_regex: t.Pattern[str] | None, socket: str | None) -> str:
    """The last step line the panes show (the first pane that has one), '' without a step regex or line."""
    if step_regex is None:
        return ""
    for pane in panes:
        line = last_step_line(pane_text(pane, socket) or "", step_regex)
        if line:
            return line
    return ""
