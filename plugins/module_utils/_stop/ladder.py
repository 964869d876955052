# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop-verify-kill ladder: its rungs, and the climb (each rung: signal, then wait).

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9). It never touches
AnsibleModule; bad input raises :class:`LadderError` naming the option.

The processes are held by :mod:`.process_set` (pidfds, no reused PID is ever
signalled); a rung's grace for a checkpoint save is judged by
:mod:`.save_watch`.
"""

from __future__ import annotations

import math
import signal
import typing as t
from dataclasses import dataclass, field

from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.process_set import ProcessSet, launcher_targets
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.save_watch import NO_GRACE, Grace, SaveWatch
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
TARGETS = ("launcher", "all")


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


# ---------------------------------------------------------------- the climb

def run_ladder(
    rungs: t.Sequence[Rung],
    procs: ProcessSet,
    *,
    root_pgids: t.Iterable[int],
    send_keys: t.Callable[[], tuple[list[str], list[str]]] | None = None,
    grace: Grace = NO_GRACE,
    find_children: t.Callable[[t.Collection[int]], list[tuple[int, int, int]]] | None = None,
    started: float | None = None,
) -> LadderResult:
    """Climb the ladder until every held process is gone or the rungs run out.

    Each rung signals what is left (:func:`signal_rung`), then waits for it
    until the rung's timeout, and past it only while :class:`SaveWatch` sees a
    save the job began after the signal (:func:`wait_rung`; SIGKILL rungs never
    extend). Before each later rung, processes born to members since the
    snapshot join: ``find_children(live_pids)`` returns their (pid, starttime,
    pgid). ``send_keys`` types Ctrl-C into the job's tmux pane and returns
    (panes, errors). ``started`` is when the caller started (monotonic).
    """
    t0 = procs.clock() if started is None else started
    reports: list[RungReport] = []
    late: list[int] = []
    stopped_by = None
    for index, rung in enumerate(rungs):
        if not procs.live():
            break
        if index > 0 and find_children is not None:
            late.extend(adopt_children(procs, find_children))
        watch = SaveWatch(procs.write_holds, grace) if rung.signal not in UNCATCHABLE and grace.watches else None
        report = RungReport(rung.name, rung.via, rung.to, rung.timeout, sent_at=procs.clock() - t0)
        reports.append(report)
        signal_rung(rung, procs, set(root_pgids), send_keys, report)
        wait_rung(rung, procs, watch, report)
        report.ended_at = procs.clock() - t0
        if not procs.live():
            stopped_by = index
            break
    return LadderResult(reports, stopped_by, [h.pid for h in procs.live()], late, any(r.targets for r in reports),
                        {h.pid: h.denied for h in procs.live() if h.denied})


def adopt_children(procs: ProcessSet, find_children: t.Callable[[t.Collection[int]], list[tuple[int, int, int]]]) -> list[int]:
    """Hold the processes born to live members since the snapshot, one level below the deepest; their pids."""
    adopted = []
    for pid, starttime, pgid in find_children([h.pid for h in procs.live()]):
        if procs.add(pid, starttime, max(h.depth for h in procs.handles.values()) + 1, pgid):
            adopted.append(pid)
    return adopted


def signal_rung(rung: Rung, procs: ProcessSet, root_pgids: set[int],
                send_keys: t.Callable[[], tuple[list[str], list[str]]] | None, report: RungReport) -> None:
    """Send the rung's signal: Ctrl-C into the pane, else the signal to its targets; then SIGCONT to all."""
    panes: list[str] = []
    if rung.via == "tmux" and send_keys is not None:
        panes, errors = send_keys()
        report.targets = panes
        report.errors.extend(errors)
        if not panes:
            # No pane to type Ctrl-C into (it closed with its launcher, killed -9): what is left (the
            # orphaned ranks) gets the signal torchrun would have forwarded, SIGINT to each process group.
            report.via = None
            report.errors.append("no tmux pane to send Ctrl-C to: SIGINT sent to the launchers instead")
    elif rung.via == "tmux":
        report.via = None  # the caller found the job in no pane (send_keys None): same fallback
        report.errors.append("the job runs in no tmux pane: SIGINT sent to the launchers instead")
    if not panes:
        live = procs.live()
        for handle in launcher_targets(live, root_pgids) if rung.to == "launcher" else live:
            # depth order: the launcher before (or with) its workers
            if procs.send(handle, rung.signal):
                report.targets.append(handle.pid)
            elif handle.denied:
                report.errors.append("pid %d: %s" % (handle.pid, handle.denied))
            else:
                report.already_gone.append(handle.pid)
    if rung.signal not in UNCATCHABLE:
        # a stopped process cannot act on a signal: neither on ours nor on the SIGTERM its
        # launcher forwards, so every member is continued, not only this rung's targets
        for handle in procs.live():
            procs.send(handle, signal.SIGCONT)


def wait_rung(rung: Rung, procs: ProcessSet, watch: SaveWatch | None, report: RungReport) -> None:
    """Wait for the members to exit: until the rung's timeout, and past it while ``watch`` sees a save."""
    clock = procs.clock
    rung_start = clock()
    deadline = Deadline(rung.timeout, clock=clock)
    if watch is not None:
        watch.start(rung_start)
    while procs.live():
        now = clock()
        if watch is not None and (watch.due(now) or deadline.expired()):
            watch.sample(now)  # on schedule, and again right when the timeout is reached, before deciding
        if deadline.expired():
            grace_end = watch.grace_end(rung_start, rung.timeout) if watch is not None else None
            if grace_end is None or now >= grace_end:
                break
            deadline.extend_to(grace_end)  # a save begun after the signal is still being written
        wait = deadline.remaining()
        if watch is not None:
            wait = min(wait, max(0.0, watch.next_sample - now))
        report.exited.extend(procs.reap_ready(wait))
    report.waited = clock() - rung_start
    report.extended_by = max(0.0, deadline.timeout - rung.timeout)
    report.remaining = len(procs.live())
    if watch is not None:
        report.save_seen, report.training, report.held_open = watch.save_seen, watch.training, watch.held_open
        report.steps = list(watch.steps)
