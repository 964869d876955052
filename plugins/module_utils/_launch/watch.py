# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Watching a started job until it proves it trains: its processes in the tmux panes, the GPUs they hold, the
first step line past the checkpoint's, and the exit status and last lines of a job that died.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). Every wait here is bounded;
nothing here starts or signals a process.
"""

from __future__ import annotations

import os
import time
import typing as t
from dataclasses import dataclass, field

from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.gpus import GpuWatch
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ProcessInfo, read_table
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import closure
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import Pane, Tmux, last_step
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

TAIL_LINES = 30
STEP_LINES = 2000  # the pane history searched for the first step line (tmux keeps 2000 lines by default)
DEAD_STATUS_WAIT = 3.0  # tmux can mark a pane dead (pty EOF) a moment before it has reaped the exit status


# ---------------------------------------------------------------- panes and processes

def same_argv(cmdline: t.Sequence[str], wanted: t.Sequence[str]) -> bool:
    """The same command: equal arguments, and the same program (equal argv[0], or equal base names: a
    ``python3`` started through a pyenv or venv shim shows its interpreter's full path)."""
    if not cmdline or len(cmdline) != len(wanted) or tuple(cmdline[1:]) != tuple(wanted[1:]):
        return False
    return cmdline[0] == wanted[0] or os.path.basename(cmdline[0]) == os.path.basename(wanted[0])


def running_in_panes(panes: t.Sequence[Pane], table: t.Mapping[int, ProcessInfo],
                     argv: t.Sequence[str]) -> list[tuple[Pane, ProcessInfo]]:
    """The processes running ``argv`` in the live panes (any window), each with its pane: the pane's process or
    one below it (a job typed at the pane's shell). A dead pane's PID is not looked at: it may be reused."""
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    found = []
    for pane in panes:
        if pane.dead:
            continue
        frontier, seen = [pane.pid], {pane.pid}
        while frontier:  # bounded: each pid once
            pid = frontier.pop(0)
            info = table.get(pid)
            if info is None:
                continue
            if same_argv(info.cmdline, argv):
                found.append((pane, info))
                continue  # its own children (workers) are the job, not another copy
            for kid in sorted(children.get(pid, ())):
                if kid not in seen:
                    seen.add(kid)
                    frontier.append(kid)
    return found


def job_tree(root: int, table: t.Mapping[int, ProcessInfo]) -> list[dict[str, t.Any]]:
    """The job: the root, its descendants, and its process group and session when it leads them (workers a
    launcher double-forked stay in its session), launchers first."""
    members = closure({root: "job"}, table, lambda info: True)
    ordered = sorted(members.values(), key=lambda m: (m.depth, m.pid))
    return [{"pid": m.pid, "ppid": m.info.ppid, "cmdline": m.info.command} for m in ordered]


# ---------------------------------------------------------------- the wait

def first_step_after(text: str, step_regex: t.Pattern[str], min_step: int | None) -> tuple[str, int] | None:
    """The first line of ``text`` whose step (``step_regex``'s first group, else the first number of the hit) is
    above ``min_step`` (any step when None), with that step."""
    for line in text.splitlines():
        step = last_step(line, step_regex)
        if step is not None and (min_step is None or step > min_step):
            return line.strip(), step
    return None


def _strip_blank_end(lines: list[str]) -> list[str]:
    while lines and not lines[-1]:
        lines.pop()
    return lines


def tail_lines(text: str, count: int = TAIL_LINES) -> list[str]:
    """The last ``count`` lines of a capture, without the empty screen rows below them (nor those between the job's
    last line and the line tmux writes at the bottom of a dead pane)."""
    lines = _strip_blank_end([line.rstrip() for line in text.splitlines()])
    footer = [lines.pop()] if lines and lines[-1].startswith("Pane is dead") else []
    return (_strip_blank_end(lines) + footer)[-count:]


def last_output(tail: t.Sequence[str], count: int = 3) -> str:
    """The job's own last lines, for a message (tmux's dead-pane line says nothing the exit status does not)."""
    lines = [line for line in tail if line and not line.startswith("Pane is dead")]
    return " | ".join(lines[-count:]) or "no output"


@dataclass
class Watched:
    """What the wait saw; ``state`` is proven, died, timed_out or sampled (check mode: one look)."""

    state: str = ""
    tree: list[dict[str, t.Any]] = field(default_factory=list)
    held: list[dict[str, t.Any]] = field(default_factory=list)
    step: tuple[str, int] | None = None
    last_step: int | None = None
    exit_status: int | None = None
    tail: list[str] = field(default_factory=list)
    pane_gone: bool = False


def dead_pane(tmux: Tmux, session: str, pane_id: str, clock: t.Callable[[], float] = time.monotonic,
              sleep: t.Callable[[float], None] = time.sleep) -> Pane | None:
    """The pane once tmux has its exit status (bounded by DEAD_STATUS_WAIT); None when the pane is gone.

    tmux (3.3a, measured: about one launch in ten of a job that exits at once) can miss the SIGCHLD of a pane's
    process: the pane shows dead (its pty closed) but the process stays an unreaped zombie and the status never
    comes. The next exit of any child of the server makes tmux reap them all, so while the status is missing a
    ``run-shell true`` (a child of the server's, a fixed command) is started every half second.
    """
    end = clock() + DEAD_STATUS_WAIT
    nudge_at = clock() + 0.2
    while True:
        pane = next((p for p in tmux.panes(session) if p.pane_id == pane_id), None)
        if pane is None or (pane.dead and pane.exit_status is not None) or clock() >= end:
            return pane
        if pane.dead and clock() >= nudge_at:
            tmux.run("run-shell", "true")
            nudge_at = clock() + 0.5
        sleep(0.05)


def watch(tmux: Tmux, session: str, pane_id: str, root: tuple[int, int], gpus: GpuWatch,
          step_regex: t.Pattern[str] | None, min_step: int | None, timeout: float, interval: float,
          one_look: bool = False, sleep: t.Callable[[float], None] = time.sleep) -> Watched:
    """Until the job proves it trains (its processes hold every expected GPU, and the pane shows a step above
    ``min_step``), it exits, or ``timeout`` passes. Bounded; it never starts anything."""
    deadline = gpus.deadline = Deadline(timeout)
    seen = Watched()
    while True:
        table = read_table(light=True)
        info = table.get(root[0])
        pane = next((p for p in tmux.panes(session) if p.pane_id == pane_id), None)
        if info is None or info.starttime != root[1] or pane is None or (pane.dead and pane.pid == root[0]):
            seen.state = "died"
            return seen
        seen.tree = job_tree(root[0], table)
        seen.held = gpus.held({entry["pid"] for entry in seen.tree}) if gpus.targets else []
        if step_regex is not None and seen.step is None:
            text = tmux.capture(pane_id, STEP_LINES) or ""
            seen.step = first_step_after(text, step_regex, min_step)
            seen.last_step = last_step(text, step_regex)
        if (seen.step is not None or step_regex is None) and len(seen.held) == len(gpus.targets):
            seen.state = "proven"
            return seen
        if one_look or deadline.expired():
            seen.state = "sampled" if one_look else "timed_out"
            return seen
        sleep(min(interval, deadline.remaining()))


def read_death(tmux: Tmux, session: str, pane_id: str, seen: Watched) -> Pane | None:
    """The exit status and the last lines of a job that died (its pane kept by remain-on-exit)."""
    pane = dead_pane(tmux, session, pane_id)
    if pane is None:
        seen.pane_gone = True
        return None
    seen.exit_status = pane.exit_status if pane.dead else None
    seen.tail = tail_lines(tmux.capture(pane_id, TAIL_LINES + 200) or "")
    return pane
