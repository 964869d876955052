# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop-verify-kill ladder: rungs, pidfd signalling, bounded exit waits, progress grace.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9). It never touches
AnsibleModule; bad input raises :class:`LadderError` naming the option.

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

import math
import os
import select
import signal
import stat
import time
import typing as t
from dataclasses import dataclass, field

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    files_open_for_writing,
    has_live_thread,
    list_pids,
    read_process,
    read_starttime,
    read_stat,
    read_wchan,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
TARGETS = ("launcher", "all")
FALLBACK_POLL = 0.02
PROGRESS_SAMPLE = 0.5
PROGRESS_MAX_FILES = 10000
# The step line a rank prints for the step in flight when the signal lands is not "still training";
# more than this many steps past the one seen at the signal is.
STEP_SLACK = 1
# File timestamps come from the kernel's coarse clock (up to a tick behind time.time()).
MTIME_SLACK_NS = 50_000_000


class LadderError(Exception):
    """Bad ladder input; the message names the option and the fix."""


@dataclass(frozen=True)
class Rung:
    signal: int
    timeout: float
    via: str | None = None  # "tmux": the keystroke rung
    to: str = "all"  # "launcher": the roots' process groups and terminal foreground group; "all": every member

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name

    def describe(self) -> str:
        how = "Ctrl-C via tmux" if self.via == "tmux" else "%s to %s" % (self.name, "the launcher" if self.to == "launcher" else "every process")
        return "%s, wait %gs" % (how, self.timeout)


def parse_signal(value: t.Any, option: str = "ladder") -> int:
    """SIGINT, INT, sigint, 2 and "2" all name signal 2."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        number = int(value)
        try:
            signal.Signals(number)
        except ValueError:
            raise LadderError("%s: %r is not a signal number on this system; use a name like SIGINT, SIGTERM or SIGKILL" % (option, value)) from None
    elif isinstance(value, str) and value.strip():
        name = value.strip().upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            number = int(getattr(signal.Signals, name))
        except AttributeError:
            raise LadderError("%s: unknown signal %r; use a name like SIGINT, SIGTERM or SIGKILL (or INT, 2)" % (option, value)) from None
    else:
        raise LadderError("%s: signal must be a name like SIGINT or a number, got %r" % (option, value))
    if number in (signal.SIGSTOP, signal.SIGCONT, signal.SIGTSTP):
        raise LadderError("%s: %s does not stop a process; use SIGINT, SIGTERM or SIGKILL" % (option, signal.Signals(number).name))
    return number


def _timeout(value: t.Any, option: str) -> float:
    if isinstance(value, bool):
        raise LadderError("%s: timeout must be a number of seconds, got %r" % (option, value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LadderError("%s: timeout must be a number of seconds, got %r" % (option, value)) from None
    if not math.isfinite(number) or number < 0:
        raise LadderError("%s: timeout must be a finite number of seconds >= 0, got %r" % (option, value))
    return number


def ctrl_c_wait(shutdown_timeout: float) -> float:
    """The shortest Ctrl-C rung for a torchrun agent that waits ``shutdown_timeout`` for its ranks.

    The agent forwards the signal to every rank's process group, waits that long, SIGKILLs what is left and
    exits; the rung must outlast it, or the next rung's signal (the agent's second) restarts that wait and its
    SIGTERM kills the DataLoader workers, aborting a save in progress. Half again as long, at least 5 s more.
    """
    return shutdown_timeout + max(5.0, shutdown_timeout / 2)


def default_ladder(tmux: bool, kill_timeout: float, shutdown_timeout: float = 30.0) -> list[Rung]:
    """Ctrl-C (tmux) or SIGINT to the launcher, outlasting torchrun's own teardown (45 s for its 30 s), SIGTERM all
    30 s, SIGKILL."""
    return [
        Rung(signal.SIGINT, ctrl_c_wait(shutdown_timeout), via="tmux" if tmux else None, to="launcher"),
        Rung(signal.SIGTERM, 30.0, to="all"),
        Rung(signal.SIGKILL, kill_timeout, to="all"),
    ]


def parse_ladder(raw: t.Any, *, tmux: bool, kill_timeout: float) -> list[Rung]:
    """Validate the ``ladder`` option; None gives :func:`default_ladder`."""
    if raw is None:
        return default_ladder(tmux, kill_timeout)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise LadderError("ladder: must be a non-empty list of rungs like {signal: SIGTERM, timeout: 30}; omit it for the default ladder")
    rungs = []
    for index, item in enumerate(raw):
        where = "ladder[%d]" % index
        if not isinstance(item, dict):
            raise LadderError("%s: each rung must be a dict like {signal: SIGTERM, timeout: 30}, got %r" % (where, item))
        # the module's suboptions fill the keys a rung leaves out with None: absent, as when called directly
        item = {key: value for key, value in item.items() if value is not None}
        unknown = sorted(set(item) - {"signal", "timeout", "via", "to"})
        if unknown:
            raise LadderError("%s: unknown key(s) %s; a rung has signal, timeout, and optionally via (tmux) and to "
                              "(launcher|all)" % (where, ", ".join(unknown)))
        if "signal" not in item or "timeout" not in item:
            raise LadderError("%s: a rung needs both signal and timeout, got %r" % (where, item))
        sig = parse_signal(item["signal"], where + ".signal")
        timeout = _timeout(item["timeout"], where + ".timeout")
        via = item.get("via")
        if via not in (None, "tmux"):
            raise LadderError("%s.via: only 'tmux' is supported, got %r" % (where, via))
        if via == "tmux":
            if not tmux:
                raise LadderError("%s.via: tmux needs tmux_session to be set; set it or drop 'via'" % where)
            if sig != signal.SIGINT:
                raise LadderError("%s.via: tmux sends Ctrl-C, so its signal must be SIGINT, got %s" % (where, signal.Signals(sig).name))
        to = item.get("to")
        if to is None:
            # Ctrl-C semantics for SIGINT (torchrun passes it on itself), everything for the rest
            to = "launcher" if sig == signal.SIGINT else "all"
        if to not in TARGETS:
            raise LadderError("%s.to: must be 'launcher' or 'all', got %r" % (where, to))
        if sig == signal.SIGKILL:
            timeout = min(timeout, kill_timeout)
        if sig == signal.SIGINT and any(rung.signal == signal.SIGINT for rung in rungs):
            raise LadderError("%s: a second SIGINT (Ctrl-C) rung; torchrun restarts its shutdown on a second signal and "
                              "exits at once on a third, orphaning its ranks: use one longer SIGINT rung, then SIGTERM "
                              "and SIGKILL" % where)
        rungs.append(Rung(sig, timeout, via, to))
    return rungs


def fit_to_torchrun(rungs: t.Sequence[Rung], shutdown_timeout: float | None) -> tuple[list[Rung], list[str]]:
    """Lengthen a SIGINT rung shorter than :func:`ctrl_c_wait` of the job's torchrun (None: not torchrun)."""
    if shutdown_timeout is None:
        return list(rungs), []
    wanted = ctrl_c_wait(shutdown_timeout)
    fitted, notes = [], []
    for index, rung in enumerate(rungs):
        if rung.signal == signal.SIGINT and rung.timeout < wanted:
            notes.append("ladder[%d]: SIGINT rung lengthened from %gs to %gs: the job's torchrun waits %gs "
                         "(TORCH_ELASTIC_SHUTDOWN_TIMEOUT) for its ranks before killing them" % (
                             index, rung.timeout, wanted, shutdown_timeout))
            rung = Rung(rung.signal, wanted, rung.via, rung.to)
        fitted.append(rung)
    return fitted, notes


# ---------------------------------------------------------------- progress

@dataclass(frozen=True)
class ProgressScan:
    """One look at ``progress_paths``: what changed-or-not is judged on, and the files' identities."""

    signature: frozenset  # (path, inode, size, mtime_ns) of every entry seen
    files: frozenset  # (st_dev, st_ino) of the regular files seen
    file_mtimes: frozenset = frozenset()  # ((st_dev, st_ino), mtime_ns) of the regular files seen

    def modified_since(self, wall_ns: int) -> set[tuple[int, int]]:
        """The regular files written (or created) at or after ``wall_ns`` (ns since the epoch)."""
        return {ident for ident, mtime_ns in self.file_mtimes if mtime_ns >= wall_ns}


def progress_scan(paths: t.Sequence[str], limit: int = PROGRESS_MAX_FILES) -> ProgressScan:
    """Every file and directory under ``paths`` (bounded by ``limit`` entries).

    Symlinks are followed (a checkpoint directory is often a link to the run's
    storage) with each directory walked once, so a link cycle ends. Within a
    directory the newest entries are walked first: when ``limit`` cuts the walk
    short it leaves out old checkpoints, never the one being written.
    """
    seen: set[tuple[str, int, int, int]] = set()
    files: dict[tuple[int, int], int] = {}
    walked: set[tuple[int, int]] = set()
    stack: list[tuple[str, os.stat_result]] = []
    stats_left = 4 * limit  # listing a huge directory costs stats too; bounded all the same
    for path in reversed(list(paths)):
        try:
            stack.append((path, os.stat(path)))
        except OSError:
            continue
    while stack and len(seen) < limit:
        path, st = stack.pop()
        seen.add((path, st.st_ino, st.st_size, st.st_mtime_ns))
        if stat.S_ISREG(st.st_mode):
            files[(st.st_dev, st.st_ino)] = st.st_mtime_ns
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in walked:
            continue
        walked.add((st.st_dev, st.st_ino))
        try:
            names = os.listdir(path)
        except OSError:
            continue
        entries = []
        for name in names[:stats_left]:
            child = os.path.join(path, name)
            try:
                entries.append((child, os.stat(child)))
            except OSError:  # gone meanwhile, or a dangling link
                continue
        stats_left -= min(len(names), stats_left)
        # oldest first on the stack, so the newest is popped (walked) first
        entries.sort(key=lambda entry: (entry[1].st_mtime_ns, entry[0]))
        stack.extend(entries)
    return ProgressScan(frozenset(seen), frozenset(files), frozenset(files.items()))


# ---------------------------------------------------------------- process handles

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


# ---------------------------------------------------------------- the ladder

@dataclass
class RungReport:
    signal: str
    via: str | None
    to: str
    timeout: float
    targets: list[t.Any] = field(default_factory=list)
    sent_at: float = 0.0
    ended_at: float = 0.0
    waited: float = 0.0
    extended_by: float = 0.0
    exited: list[int] = field(default_factory=list)
    already_gone: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    remaining: int = 0
    held_open: bool = False  # extended because the job kept a file under progress_paths open for writing
    save_seen: bool = False  # a member wrote a file under progress_paths that it opened after this signal
    training: bool = False  # the step counter kept advancing after this signal: no grace for this rung
    steps: list[t.Any] = field(default_factory=list)  # [step at the signal, last step seen] from step_probe

    def as_dict(self) -> dict[str, t.Any]:
        return {
            "signal": self.signal, "via": self.via, "to": self.to, "timeout": self.timeout,
            "targets": self.targets, "sent_at": round(self.sent_at, 4), "ended_at": round(self.ended_at, 4),
            "waited": round(self.waited, 4),
            "extended_by": round(self.extended_by, 4), "exited": self.exited, "already_gone": self.already_gone,
            "errors": self.errors, "remaining": self.remaining, "held_open": self.held_open,
            "save_seen": self.save_seen, "training": self.training, "steps": self.steps,
        }


@dataclass
class LadderResult:
    rungs: list[RungReport]
    stopped_by: int | None  # index of the rung after which nothing was left
    survivors: list[int]
    late_children: list[int]
    signalled: bool
    denied: dict[int, str] = field(default_factory=dict)  # survivors the kernel would not let us signal


def launcher_targets(handles: t.Sequence[Handle], root_pgids: t.Iterable[int]) -> list[Handle]:
    """What Ctrl-C in the job's terminal would reach: the roots and their (foreground) process groups."""
    groups = set(root_pgids)
    return [h for h in handles if h.depth == 0 or h.pgid in groups]


def run_ladder(
    rungs: t.Sequence[Rung],
    procs: ProcessSet,
    *,
    root_pgids: t.Iterable[int],
    send_keys: t.Callable[[], tuple[list[str], list[str]]] | None = None,
    progress_paths: t.Sequence[str] = (),
    progress_stall: float = 10.0,
    max_grace: float = 600.0,
    find_children: t.Callable[[t.Collection[int]], list[tuple[int, int, int]]] | None = None,
    started: float | None = None,
    step_probe: t.Callable[[], int | None] | None = None,
    wall: t.Callable[[], float] = time.time,
) -> LadderResult:
    """Climb the ladder until every held process is gone or the rungs run out.

    ``send_keys`` performs the tmux keystroke and returns (panes, errors).
    ``find_children(live_pids)`` returns (pid, starttime, pgid) of processes
    born to live members since the snapshot; they join before each later rung.
    Each rung waits until its timeout, and past it only for a save that
    started after the rung's signal: a live member writing a file under
    ``progress_paths`` that it opened after the signal, with that file's
    mtime after the signal. Once such a save was seen in the rung, the rung
    keeps waiting while files there change within ``progress_stall`` seconds
    or a member still holds a file it opened after the signal (a save pausing
    between writes). Files that merely change (a job ignoring the signal that
    keeps writing its log or its periodic checkpoints into files it already
    had open) never extend a rung. ``step_probe`` returns the job's current
    step (from the tmux pane) or None: a job whose step counter advances more
    than ``STEP_SLACK`` past the step seen at the signal is still training,
    not shutting down, and gets no grace at all in that rung (a periodic
    checkpoint it writes meanwhile is not a shutdown save). Never past
    ``max_grace`` from the rung's start (SIGKILL rungs never extend).
    """
    clock = procs.clock
    t0 = clock() if started is None else started
    root_pgids = set(root_pgids)
    reports: list[RungReport] = []
    late: list[int] = []
    stopped_by = None
    signalled = False
    for index, rung in enumerate(rungs):
        if not procs.live():
            break
        if index > 0 and find_children is not None:
            for pid, starttime, pgid in find_children([h.pid for h in procs.live()]):
                if procs.add(pid, starttime, max(h.depth for h in procs.handles.values()) + 1, pgid):
                    late.append(pid)
        report = RungReport(rung.name, rung.via, rung.to, rung.timeout)
        reports.append(report)
        watching = rung.signal not in UNCATCHABLE and bool(progress_paths or step_probe)
        baseline = progress_scan(progress_paths).signature if watching and progress_paths else None
        held_before = procs.write_holds() if baseline is not None else set()
        inodes_before = {ino for _pid, _dev, ino in held_before}
        step_at_signal = step_probe() if watching and step_probe is not None else None
        if step_probe is not None and watching:
            report.steps = [step_at_signal, step_at_signal]
        signal_wall_ns = int(wall() * 1e9) - MTIME_SLACK_NS
        report.sent_at = clock() - t0
        panes: list[str] = []
        if rung.via == "tmux" and send_keys is not None:
            panes, errors = send_keys()
            report.targets = panes
            report.errors.extend(errors)
            signalled = signalled or bool(panes)
            if not panes:
                # No pane to type Ctrl-C into (it closed with its launcher, killed -9): what is left (the
                # orphaned ranks) gets the signal torchrun would have forwarded, SIGINT to each process group.
                report.via = None
                report.errors.append("no tmux pane to send Ctrl-C to: SIGINT sent to the launchers instead")
        elif rung.via == "tmux":
            report.via = None  # the caller found the job in no pane (send_keys None): same fallback
            report.errors.append("the job runs in no tmux pane: SIGINT sent to the launchers instead")
        if rung.via != "tmux" or send_keys is None or not panes:
            live = procs.live()
            targets = launcher_targets(live, root_pgids) if rung.to == "launcher" else live
            for handle in targets:  # depth order: the launcher before (or with) its workers
                if procs.send(handle, rung.signal):
                    report.targets.append(handle.pid)
                    signalled = True
                elif handle.denied:
                    report.errors.append("pid %d: %s" % (handle.pid, handle.denied))
                else:
                    report.already_gone.append(handle.pid)
        if rung.signal not in UNCATCHABLE:
            # a stopped process cannot act on a signal: neither on ours nor on the SIGTERM its
            # launcher forwards, so every member is continued, not only this rung's targets
            for handle in procs.live():
                procs.send(handle, signal.SIGCONT)
        rung_start = clock()
        deadline = Deadline(rung.timeout, clock=clock)
        cap = rung_start + max(max_grace, rung.timeout)
        last_change = None
        sample_every = min(PROGRESS_SAMPLE, max(0.05, progress_stall / 2))
        next_sample = rung_start + sample_every
        while procs.live():
            now = clock()
            if watching and (now >= next_sample or deadline.expired()):
                # sampled on schedule, and again right when the timeout is reached, before deciding
                step = step_probe() if step_probe is not None else None
                if step is not None:
                    if step_at_signal is None:
                        step_at_signal = step
                    report.steps = [step_at_signal, step]
                    if step - step_at_signal > STEP_SLACK:
                        report.training = True
                if baseline is not None:
                    scan = progress_scan(progress_paths)
                    fresh = scan.modified_since(signal_wall_ns)
                    opened_after = {(pid, dev, ino) for pid, dev, ino in procs.write_holds() - held_before
                                    if (dev, ino) in scan.files}
                    if any((dev, ino) in fresh for _pid, dev, ino in opened_after):
                        report.save_seen = True
                    # a file the job already held open for writing at the signal (its log) changing is not a save
                    changed = any(entry[1] not in inodes_before for entry in scan.signature - baseline)
                    if report.training:
                        last_change = None  # still training: whatever it writes is not a shutdown save
                    elif report.save_seen and changed:
                        last_change = now
                    elif report.save_seen and opened_after:
                        # The save still holds a file it opened after the signal: pausing longer than
                        # progress_stall between writes (the next shard serialized, an fsync under I/O
                        # load) is still a save in progress. max_grace (cap) bounds this like any progress.
                        last_change = now
                        report.held_open = True
                    baseline = scan.signature
                next_sample = now + sample_every
            if deadline.expired():
                if last_change is None or now - last_change > progress_stall or now >= cap:
                    break
                # a save started after the signal is still being written, so this rung keeps waiting
                deadline.extend_to(min(cap, last_change + progress_stall))
            wait = deadline.remaining()
            if watching:
                wait = min(wait, max(0.0, next_sample - now))
            report.exited.extend(procs.reap_ready(wait))
        report.waited = clock() - rung_start
        report.ended_at = clock() - t0
        report.extended_by = max(0.0, deadline.timeout - rung.timeout)
        report.remaining = len(procs.live())
        if not procs.live():
            stopped_by = index
            break
    return LadderResult(reports, stopped_by, [h.pid for h in procs.live()], late, signalled,
                        {h.pid: h.denied for h in procs.live() if h.denied})


def describe_process(pid: int, proc_root: str = "/proc") -> dict[str, t.Any]:
    """State, wchan and command line of a survivor (for the 'unkillable' report)."""
    info = read_process(pid, proc_root)
    if info is None:
        return {"pid": pid, "state": "gone", "wchan": "", "cmdline": ""}
    return {"pid": pid, "ppid": info.ppid, "state": info.state, "wchan": read_wchan(pid, proc_root),
            "cmdline": info.command, "uid": info.uid}


def stat_children(parents: t.Collection[int], proc_root: str = "/proc") -> list[tuple[int, int, int]]:
    """(pid, starttime, pgid) of every process whose parent is in ``parents`` (a light /proc scan)."""
    wanted = set(parents)
    found: list[tuple[int, int, int]] = []
    frontier = True
    while frontier:
        frontier = False
        for pid in list_pids(proc_root):
            if pid in wanted:
                continue
            try:
                stat = read_stat(pid, proc_root)
            except OSError:
                continue
            if stat is not None and stat.ppid in wanted and stat.state not in ("Z", "X"):
                wanted.add(stat.pid)
                found.append((stat.pid, stat.starttime, stat.pgid))
                frontier = True
    return found
