# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The processes a ladder holds: signalled and awaited by pidfd, never a reused PID.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9).

How a process is held: before the first signal every snapshot member gets a
pidfd (``os.pidfd_open``) and its start time is read *after* opening; a
mismatch means the PID was reused, so that pidfd is dropped and the member is
counted as gone. From then on signals go through ``signal.pidfd_send_signal``
(the kernel refuses to signal anything else, so PID reuse cannot hit a
stranger) and exits are awaited with ``select.poll`` on the pidfds: the kernel
wakes us the moment a thread group has exited (a zombie counts as gone; a
zombie *leader* with live threads does not, and neither does the kernel). Where
pidfds are missing (kernel < 5.3, python < 3.9, seccomp) the fallback re-checks
the start time before each ``kill`` and polls ``/proc`` every 20 ms.
"""

from __future__ import annotations

import os
import select
import signal
import time
import typing as t
from dataclasses import dataclass

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    files_open_for_writing,
    has_live_thread,
    read_starttime,
    read_stat,
)

FALLBACK_POLL = 0.02


def pidfd_supported() -> bool:
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    os.close(fd)
    return True


def _thread_group_gone(pid: int, starttime: int, proc_root: str) -> bool:
    """Polling view of 'exited': gone, reused, or a zombie with no live thread."""
    try:
        stat = read_stat(pid, proc_root)
    except OSError:
        return True
    if stat is None or stat.starttime != starttime:
        return True
    if stat.state not in ("Z", "X"):
        return False
    return not has_live_thread(pid, proc_root)


@dataclass
class Handle:
    """One snapshot member held for signalling and waiting."""

    pid: int
    starttime: int
    depth: int
    pgid: int
    fd: int | None = None
    exited_at: float | None = None
    denied: str = ""  # why the kernel refused to signal it (EPERM: another user's process)


class ProcessSet:
    """The held snapshot: signal members and wait for them, by pidfd when possible."""

    def __init__(self, use_pidfd: bool | None = None, proc_root: str = "/proc", clock: t.Callable[[], float] = time.monotonic) -> None:
        self.use_pidfd = pidfd_supported() if use_pidfd is None else use_pidfd
        self.proc_root = proc_root
        self.clock = clock
        self.handles: dict[int, Handle] = {}
        self._poller = select.poll() if self.use_pidfd else None
        self._by_fd: dict[int, Handle] = {}

    def add(self, pid: int, starttime: int, depth: int, pgid: int) -> bool:
        """Hold ``pid`` if it is still the process seen in the snapshot; False when it is gone or reused."""
        if pid in self.handles:
            return True
        handle = Handle(pid, starttime, depth, pgid)
        if self.use_pidfd:
            try:
                handle.fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            # read the start time only after the pidfd exists: the fd now pins *this* process
            if _thread_group_gone(pid, starttime, self.proc_root):
                os.close(handle.fd)
                return False
            self._poller.register(handle.fd, select.POLLIN)
            self._by_fd[handle.fd] = handle
        elif _thread_group_gone(pid, starttime, self.proc_root):
            return False
        self.handles[pid] = handle
        return True

    def live(self) -> list[Handle]:
        return sorted((h for h in self.handles.values() if h.exited_at is None), key=lambda h: (h.depth, h.pid))

    def _release(self, handle: Handle) -> None:
        """Stop polling and close the member's pidfd (if it has one)."""
        if handle.fd is not None:
            self._poller.unregister(handle.fd)
            del self._by_fd[handle.fd]
            os.close(handle.fd)
            handle.fd = None

    def _mark_gone(self, handle: Handle) -> None:
        if handle.exited_at is None:
            handle.exited_at = self.clock()
        self._release(handle)

    def send(self, handle: Handle, signum: int) -> bool:
        """Signal one member; False when it had already exited (never an error) or may not be signalled.

        A refusal (EPERM: another user's process, the module not run as root) is kept in
        ``handle.denied``: the process stays held, is waited for like the rest, and ends up
        among the survivors with the reason.
        """
        if handle.exited_at is not None:
            return False
        try:
            if handle.fd is not None:
                signal.pidfd_send_signal(handle.fd, signum)
            else:
                if read_starttime(handle.pid, self.proc_root) != handle.starttime:
                    self._mark_gone(handle)
                    return False
                os.kill(handle.pid, signum)
        except ProcessLookupError:
            self._mark_gone(handle)
            return False
        except PermissionError as exc:
            handle.denied = "%s %s: %s" % (signal.Signals(signum).name, "not permitted", exc.strerror or exc)
            return False
        return True

    def reap_ready(self, timeout: float) -> list[int]:
        """Wait up to ``timeout`` seconds for any exit; return the pids that exited."""
        gone = []
        if self.use_pidfd:
            if not self._by_fd:
                return gone
            events = self._poller.poll(max(0, int(timeout * 1000 + 0.999)))
            for fd, _mask in events:
                handle = self._by_fd.get(fd)
                if handle is not None:
                    self._mark_gone(handle)
                    gone.append(handle.pid)
            return gone
        for handle in self.live():
            if _thread_group_gone(handle.pid, handle.starttime, self.proc_root):
                self._mark_gone(handle)
                gone.append(handle.pid)
        if not gone and self.live() and timeout > 0:
            time.sleep(min(timeout, FALLBACK_POLL))
        return gone

    def write_holds(self) -> set[tuple[int, int, int]]:
        """(pid, st_dev, st_ino) of every regular file a live member holds open for writing."""
        return {(h.pid,) + ident for h in self.live() for ident in files_open_for_writing(h.pid, self.proc_root)}

    def close(self) -> None:
        for handle in self.handles.values():
            self._release(handle)


def launcher_targets(handles: t.Sequence[Handle], root_pgids: t.Iterable[int]) -> list[Handle]:
    """What Ctrl-C in the job's terminal would reach: the roots and their (foreground) process groups."""
    groups = set(root_pgids)
    return [h for h in handles if h.depth == 0 or h.pgid in groups]
