# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which processes are "the job": selection, tree snapshot, never-select rules, broad-match refusal.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9). It never signals
anything. The decisions are pure functions over a process table (a dict
``pid -> ProcessInfo`` from ``_proc``); only :func:`read_table`,
:func:`read_pid_file` (and ``_tmux.tmux_panes``) touch the system. Bad input
raises :class:`SelectError` whose message names the option and the fix.

The tree rule (``closure``)
    From the roots, a process belongs to the job when its parent does (ppid
    link), or when it sits in a process group or session *led* by a job
    process (pgid or sid equal to a job PID). The second link keeps
    descendants whose parent died and who were reparented (they keep their
    group and session), while never pulling in the shell or login session a
    job merely runs *inside* (that session is led by a process outside the
    job). torchrun's workers, each in its own session, are reached by ppid.

The broad-match rule (``job_groups`` / ``broad_match_reason``)
    The processes ``match`` hits are joined into groups: a hit joins the
    group of its nearest hit ancestor, and of any hit that leads its process
    group or session. One group is one job. Several groups are still one job
    only when every group's top process runs the same program (interpreter
    scripts are compared by script, ``python -m X`` by module) as the same
    user *and* has the same parent: that is what the workers of one dead
    launcher look like after being reparented to one reaper. Anything else
    (a ``python`` regex that also hits a networkd-dispatcher-like daemon, or
    an editor with the training script in its arguments) is refused, with
    the list of groups, unless ``allow_broad_match``.

What ``match`` never selects (``match_left_out``)
    A tmux server keeps the command line of the ``tmux new-session ...
    "torchrun ..."`` that started it, so a regex for the job hits it too; and
    being an ancestor of the job, it would become the job's root, and SIGTERM
    would end every session on the node. So a hit is left out (with the
    reason, in the plan) when it is a terminal multiplexer (tmux/screen
    server or client), an interactive shell (a terminal's prompt), or an
    ancestor of a pane process (a child of a tmux server, or a pane of
    ``tmux_session``). The job in the pane is still a hit of its own.
"""

from __future__ import annotations

import os
import re
import typing as t
from dataclasses import dataclass, field, replace

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    ProcError,
    ProcessInfo,
    ancestors_of,
    boot_time,
    container_vmid_from_cgroup,
    enrich,
    read_process,
    read_table,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import Pane, TmuxError, tmux_panes

INTERPRETERS = re.compile(r"^(?:python[0-9.]*|pypy[0-9.]*|bash|sh|dash|zsh|perl|ruby|node|env|uv|conda)$")
# interpreter options that consume the next argument (python -W x, -X y; bash -o x)
_OPTS_WITH_ARG = frozenset(("-W", "-X", "-o", "-O", "--rcfile", "--init-file"))


class SelectError(Exception):
    """Bad selection input (names the option and the fix), or a refused selection."""


@dataclass(frozen=True)
class Member:
    """One process of the job snapshot."""

    info: ProcessInfo
    how: str  # pids | pid_file | match | tmux_session | container | child | group | session | late_child
    depth: int  # 0 for a root; a launcher is always signalled before deeper members

    @property
    def pid(self) -> int:
        return self.info.pid


# ---------------------------------------------------------------- system readers

def read_pid_file(path: str) -> tuple[int | None, float | None]:
    """(pid, mtime) from a pid file; (None, None) when it does not exist.

    A file that exists but cannot be read or does not hold one positive
    integer is bad input.
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(4096)
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise SelectError("pid_file: cannot read %s (%s); give a readable file or use pids" % (path, exc.strerror or exc)) from exc
    return parse_pid_file(text, path), mtime


def parse_pid_file(text: str, path: str = "pid file") -> int:
    words = text.split()
    if len(words) != 1 or not words[0].isdigit() or int(words[0]) <= 0:
        raise SelectError("pid_file: %s must hold one positive PID, found %r; fix the file or use pids" % (path, text[:40]))
    return int(words[0])


def started_after(info: ProcessInfo, wall_time: float, proc_root: str = "/proc", slack: float = 1.0) -> bool:
    """Did ``info`` start after ``wall_time``? (Then it cannot have written a pid file then: PID reuse.)"""
    ticks = os.sysconf("SC_CLK_TCK")
    try:
        booted = boot_time(proc_root)
    except ProcError as exc:
        raise SelectError(str(exc)) from None
    return booted + info.starttime / ticks > wall_time + slack


# ---------------------------------------------------------------- pure rules

def compile_regex(option: str, pattern: str) -> t.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectError("%s: %r is not a valid regular expression (%s); fix the pattern (Python re syntax)" % (option, pattern, exc)) from None


def command_of(info: ProcessInfo) -> str:
    return " ".join(info.cmdline)


def program_of(cmdline: t.Sequence[str]) -> str:
    """What a command line runs: the script for interpreters, ``-m`` module names, else argv[0]'s name."""
    if not cmdline:
        return ""
    name = os.path.basename(cmdline[0])
    if not INTERPRETERS.match(name):
        return name
    args = list(cmdline[1:])
    while args:
        word = args.pop(0)
        if word in ("-m", "-c"):
            return "%s %s" % (word, args[0] if args and word == "-m" else "")
        if word in _OPTS_WITH_ARG:
            if args:
                args.pop(0)
            continue
        if word.startswith("-") or (name == "env" and "=" in word):
            continue
        if name in ("env", "uv", "conda"):
            return program_of([word] + args)
        return word
    return name


_MULTIPLEXERS = frozenset(("tmux", "screen", "SCREEN", "zellij", "dtach", "abduco"))


def is_multiplexer(info: ProcessInfo) -> bool:
    """A tmux/screen server or client (``comm`` is ``tmux: server`` for tmux's server)."""
    if info.comm.split(":")[0] in _MULTIPLEXERS:
        return True
    return bool(info.cmdline) and os.path.basename(info.cmdline[0]) in _MULTIPLEXERS


def is_tmux_server(info: ProcessInfo) -> bool:
    # tmux names its server process "tmux: server" (comm, 15 bytes) but leaves its argv alone
    return info.comm.startswith("tmux: serv")


TORCHRUN_PROGRAMS = frozenset(("torchrun", "-m torch.distributed.run", "-m torch.distributed.launch"))
TORCHRUN_SHUTDOWN_DEFAULT = 30.0  # torch/distributed/launcher/api.py: LaunchConfig.shutdown_timeout


def torchrun_shutdown_timeout(cmdline: t.Sequence[str], environ: t.Mapping[str, str] | None) -> float | None:
    """How long a torchrun agent waits for its ranks after a signal before SIGKILLing them; None if not torchrun.

    As torch/distributed/run.py and launcher/api.py decide it: ``--shutdown-timeout``/``--shutdown_timeout``
    (or its ``PET_SHUTDOWN_TIMEOUT`` environment twin), else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s.
    An unreadable environment (another user's process) gives the default.
    """
    if os.path.basename(program_of(cmdline)) not in TORCHRUN_PROGRAMS and program_of(cmdline) not in TORCHRUN_PROGRAMS:
        return None
    env = environ or {}
    value: str | None = None
    args = list(cmdline)
    for index, arg in enumerate(args):
        for flag in ("--shutdown-timeout", "--shutdown_timeout"):
            if arg == flag and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
        if arg in ("--", "-m") or (not arg.startswith("-") and arg.endswith(".py")):
            break  # the training script's own arguments start here
    for candidate in (value, env.get("PET_SHUTDOWN_TIMEOUT"), env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")):
        if candidate is not None:
            try:
                return max(0.0, float(candidate))
            except ValueError:
                continue
    return TORCHRUN_SHUTDOWN_DEFAULT


_SHELLS = frozenset(("sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "tcsh", "csh", "yash"))


def is_interactive_shell(cmdline: t.Sequence[str]) -> bool:
    """``bash``, ``-bash``, ``zsh -l``: a shell with no script or ``-c`` command (a terminal's prompt)."""
    if not cmdline:
        return False
    if os.path.basename(cmdline[0]).lstrip("-") not in _SHELLS:
        return False
    return all(arg.startswith("--") or (arg.startswith("-") and "c" not in arg[1:]) for arg in cmdline[1:])


def pane_roots(panes: t.Sequence[Pane], table: t.Mapping[int, ProcessInfo]) -> tuple[list[int], list[str]]:
    """The job's roots in each pane: the pane's process, or what runs in it when it is an interactive shell.

    The shell at the prompt is the terminal's, not the job's: it ignores SIGINT
    and SIGTERM (so it would hold every rung to its timeout) and killing it
    closes the pane and its scrollback. Interactive shells started at that
    prompt (``bash`` typed in the pane, then the job) are the terminal's too,
    so the search goes on through them.
    """
    children: dict[int, list[int]] = {}
    for pid, other in table.items():
        children.setdefault(other.ppid, []).append(pid)
    roots: list[int] = []
    notes: list[str] = []
    for pane in panes:
        info = table.get(pane.pid)
        if info is None:
            continue
        if not is_interactive_shell(info.cmdline):
            roots.append(pane.pid)
            continue
        shells, kids = [pane.pid], []
        frontier, seen = [pane.pid], {pane.pid}
        while frontier:  # bounded: every pid is visited at most once
            for kid in sorted(children.get(frontier.pop(0), ())):
                if kid in seen:
                    continue
                seen.add(kid)
                if is_interactive_shell(table[kid].cmdline):
                    shells.append(kid)
                    frontier.append(kid)
                else:
                    kids.append(kid)
        roots.extend(kids)
        notes.append("tmux pane %s: %s left running; %s" % (
            pane.pane_id, "its shell (pid %d) is" % shells[0] if len(shells) == 1 else
            "its shells (pids %s) are" % ", ".join(str(pid) for pid in shells),
            "what runs in it is the job" if kids else "nothing runs in it"))
    return roots, notes


def match_left_out(
    hits: t.Iterable[int], table: t.Mapping[int, ProcessInfo], panes: t.Sequence[Pane] = (),
) -> dict[int, str]:
    """Of the ``match`` hits, those never selected through ``match``, with the reason (pure).

    See the module docstring: tmux/screen servers and clients, interactive shells, and ancestors
    of a pane process (a child of a tmux server, or a pane of ``tmux_session``).
    """
    pane_pids = {pane.pid for pane in panes if pane.pid in table}
    pane_pids.update(pid for pid, info in table.items() if info.ppid in table and is_tmux_server(table[info.ppid]))
    above_panes: set[int] = set()
    for pid in pane_pids:
        seen = {pid}
        current = table[pid].ppid
        while current in table and current not in seen:  # bounded: each pid once
            above_panes.add(current)
            seen.add(current)
            current = table[current].ppid
    left_out: dict[int, str] = {}
    for pid in sorted(set(hits)):
        info = table[pid]
        if is_multiplexer(info):
            left_out[pid] = ("a tmux server, which runs every session on the node" if is_tmux_server(info)
                             else "a terminal multiplexer (%s), not the job" % (info.comm or "?"))
        elif is_interactive_shell(info.cmdline):
            left_out[pid] = "an interactive shell (a terminal's prompt), not the job"
        elif pid in above_panes:
            left_out[pid] = "an ancestor of a tmux pane's process, not the job"
    return left_out


def protected_pids(table: t.Mapping[int, ProcessInfo], self_pid: int, ancestors: t.Iterable[int]) -> set[int]:
    """PID 1, the caller and its ancestors, and every container's init (PID 1 in its namespace)."""
    protected = {1, self_pid}
    protected.update(ancestors)
    protected.update(pid for pid, info in table.items() if info.nspid and info.nspid[-1] == 1)
    return protected


def eligible(info: ProcessInfo, protected: t.Container[int], excludes: t.Sequence[t.Pattern[str]], container: int | None) -> bool:
    """The never-select rules, and the ``container`` scope."""
    if info.pid in protected or info.is_kernel_thread or info.pid <= 0:
        return False
    command = command_of(info)
    if any(regex.search(command) for regex in excludes):
        return False
    if container is not None and container_vmid_from_cgroup(info.cgroup) != container:
        return False
    return True


def closure(roots: t.Mapping[int, str], table: t.Mapping[int, ProcessInfo], allowed: t.Callable[[ProcessInfo], bool]) -> dict[int, Member]:
    """The roots and everything that belongs to them (see the module docstring), breadth first."""
    children: dict[int, list[int]] = {}
    by_pgid: dict[int, list[int]] = {}
    by_sid: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
        by_pgid.setdefault(info.pgid, []).append(pid)
        by_sid.setdefault(info.sid, []).append(pid)
    members: dict[int, Member] = {}
    queue: list[int] = []
    for pid, how in roots.items():
        info = table.get(pid)
        if info is not None and allowed(info):
            members[pid] = Member(info, how, 0)
            queue.append(pid)
    while queue:
        parent = members[queue.pop(0)]
        linked = [(pid, "child") for pid in children.get(parent.pid, ())]
        if parent.info.pgid == parent.pid:
            linked += [(pid, "group") for pid in by_pgid.get(parent.pid, ())]
        if parent.info.sid == parent.pid:
            linked += [(pid, "session") for pid in by_sid.get(parent.pid, ())]
        for pid, how in linked:
            if pid in members:
                continue
            info = table[pid]
            if allowed(info):
                members[pid] = Member(info, how, parent.depth + 1)
                queue.append(pid)
    return members


def top_of(pids: t.Iterable[int], table: t.Mapping[int, ProcessInfo]) -> list[int]:
    """The pids that have no ancestor in ``pids`` (the launchers of a set of hits)."""
    chosen = set(pids)
    tops = []
    for pid in sorted(chosen):
        seen = {pid}
        current = table[pid].ppid
        while current in table and current not in seen:
            if current in chosen:
                break
            seen.add(current)
            current = table[current].ppid
        else:
            tops.append(pid)
    return tops


def job_groups(hits: t.Iterable[int], table: t.Mapping[int, ProcessInfo]) -> list[list[int]]:
    """Split ``hits`` into connected groups (ancestry, or a hit leading another's group/session)."""
    hits = sorted(set(hits))
    parent = {pid: pid for pid in hits}

    def find(pid: int) -> int:
        while parent[pid] != pid:
            parent[pid] = parent[parent[pid]]
            pid = parent[pid]
        return pid

    def union(a: int, b: int) -> None:
        parent[find(a)] = find(b)

    for pid in hits:
        info = table[pid]
        for leader in (info.pgid, info.sid):
            if leader in parent and leader != pid:
                union(pid, leader)
        seen = {pid}
        current = info.ppid
        while current in table and current not in seen:
            if current in parent:
                union(pid, current)
                break
            seen.add(current)
            current = table[current].ppid
    groups: dict[int, list[int]] = {}
    for pid in hits:
        groups.setdefault(find(pid), []).append(pid)
    return sorted(groups.values())


def broad_match_reason(groups: t.Sequence[t.Sequence[int]], table: t.Mapping[int, ProcessInfo]) -> str:
    """'' when the groups are one job, else a message that lists what the match would hit."""
    if len(groups) <= 1:
        return ""
    tops = [top_of(group, table)[0] for group in groups]
    keys = {(program_of(table[pid].cmdline), table[pid].uid, table[pid].ppid) for pid in tops}
    if len(keys) == 1:
        return ""
    lines = []
    for top, group in zip(tops, groups):
        info = table[top]
        lines.append("pid %d (%d process%s, program %s, uid %s, parent %d): %s" % (
            top, len(group), "" if len(group) == 1 else "es", program_of(info.cmdline) or "?", info.uid, info.ppid,
            command_of(info)[:200]))
    return ("match hits %d unrelated process groups, not one job:\n  %s\n"
            "Make the regex specific to the job (e.g. the script path and a unique argument), add 'exclude' "
            "patterns, select with pids/pid_file/tmux_session, or set allow_broad_match: true if all of these "
            "must stop." % (len(groups), "\n  ".join(lines)))


@dataclass
class Selection:
    members: dict[int, Member]
    panes: list[Pane]
    notes: list[str]
    refused: str = ""
    seen: frozenset = frozenset()  # (pid, starttime) of every process in the table the selection was made from
    left_out: dict = field(default_factory=dict)  # pid -> (why, command line): matched but never selected


def late_children(
    found: t.Iterable[tuple[int, int, int]],
    seen: t.Container[tuple[int, int]],
    excludes: t.Sequence[t.Pattern[str]] = (),
    proc_root: str = "/proc",
) -> list[tuple[int, int, int]]:
    """Of ``found`` (pid, starttime, pgid) children, those born after the snapshot and not excluded.

    A process that existed at snapshot time and was left out (``exclude``, another container) stays out.
    """
    late = []
    for pid, start, pgid in found:
        if (pid, start) in seen:
            continue
        info = read_process(pid, proc_root)
        if info is None or info.starttime != start or info.is_kernel_thread:
            continue
        if any(regex.search(command_of(info)) for regex in excludes):
            continue
        late.append((pid, start, pgid))
    return late


def select(
    *,
    table: t.Mapping[int, ProcessInfo],
    self_pid: int,
    ancestors: t.Iterable[int],
    pids: t.Sequence[int] = (),
    pid_file_pid: int | None = None,
    match: t.Pattern[str] | None = None,
    panes: t.Sequence[Pane] = (),
    container: int | None = None,
    excludes: t.Sequence[t.Pattern[str]] = (),
    allow_broad_match: bool = False,
    gpu_holders: t.Sequence[int] = (),
) -> Selection:
    """Pure: roots from every selector, the tree closure, the never-select rules and the broad-match rule.

    ``container`` alone (no other selector) selects everything in the
    container except its init, which the broad-match rule refuses unless
    allowed.
    """
    protected = protected_pids(table, self_pid, ancestors)
    notes: list[str] = []
    for option, values in (("pids", list(pids)), ("pid_file", [pid_file_pid] if pid_file_pid else [])):
        for pid in values:
            if pid in protected:
                raise SelectError("%s: %d is %s and is never signalled; remove it" % (
                    option, pid, "PID 1" if pid == 1 else "this module's own process or one of its ancestors"
                    if pid not in table or not table[pid].nspid or table[pid].nspid[-1] != 1 else "a container's init"))

    def allowed(info: ProcessInfo) -> bool:
        return eligible(info, protected, excludes, container)

    roots: dict[int, str] = {}
    for pid in pids:
        if pid in table:
            roots.setdefault(pid, "pids")
        else:
            notes.append("pids: %d is not running" % pid)
    if pid_file_pid is not None:
        if pid_file_pid in table:
            roots.setdefault(pid_file_pid, "pid_file")
        else:
            notes.append("pid_file: pid %d is not running" % pid_file_pid)
    for pid in gpu_holders:
        # a process holding a GPU device file: with no launcher left (killed -9, OOM) these are the job's ranks
        if pid in table:
            roots.setdefault(pid, "gpu_holder")
    roots_in_panes, pane_notes = pane_roots(panes, table)
    notes.extend(pane_notes)
    for pid in roots_in_panes:
        roots.setdefault(pid, "tmux_session")
    refused = ""
    hits: list[int] = []
    left_out: dict[int, tuple[str, str]] = {}
    if match is not None or (container is not None and not (pids or pid_file_pid or panes)):
        hits = [pid for pid, info in table.items() if allowed(info) and (match is None or match.search(command_of(info)))]
        if match is not None:
            for pid, why in match_left_out(hits, table, panes).items():
                left_out[pid] = (why, command_of(table[pid])[:200])
                notes.append("match: pid %d left out, %s: %s" % (pid, why, command_of(table[pid])[:200]))
            hits = [pid for pid in hits if pid not in left_out]
        groups = job_groups(hits, table)
        if not allow_broad_match:
            refused = broad_match_reason(groups, table)
        how = "match" if match is not None else "container"
        for pid in top_of(hits, table):
            roots.setdefault(pid, how)
    members = closure(roots, table, allowed)
    for pid in hits:
        if pid in members and members[pid].how in ("child", "group", "session"):
            members[pid] = replace(members[pid], how="match" if match is not None else "container")
    return Selection(members, list(panes), notes, refused, left_out=left_out)


def snapshot(
    *,
    pids: t.Sequence[int] = (),
    pid_file: str | None = None,
    match: str | None = None,
    tmux_session: str | None = None,
    tmux_socket: str | None = None,
    container: int | None = None,
    exclude: t.Sequence[str] = (),
    allow_broad_match: bool = False,
    gpu_holders: t.Sequence[int] = (),
    proc_root: str = "/proc",
) -> Selection:
    """Read the system and select (the only impure entry point besides the readers)."""
    regex = compile_regex("match", match) if match is not None else None
    excludes = [compile_regex("exclude", pattern) for pattern in exclude]
    notes: list[str] = []
    pid_file_pid = None
    file_mtime = None
    if pid_file:
        pid_file_pid, file_mtime = read_pid_file(pid_file)
        if pid_file_pid is None:
            notes.append("pid_file: %s does not exist: nothing selected from it" % pid_file)
    panes: list[Pane] = []
    if tmux_session:
        try:
            panes, note = tmux_panes(tmux_session, tmux_socket)
        except TmuxError as exc:
            raise SelectError(str(exc)) from None
        if note:
            notes.append(note)
    self_pid = os.getpid()
    # Two passes: stat + cmdline for everyone, the rest only for what could be selected
    # (on a PVE host with thousands of processes this is most of the time before the first signal).
    table = read_table(proc_root, light=True)
    if container is not None and not (pids or pid_file_pid or panes or regex):
        candidates: t.Iterable[int] = list(table)
    else:
        seeds = {pid for pid in list(pids) + [pid_file_pid or 0] + list(gpu_holders) if pid in table}
        seeds.update(pane_roots(panes, table)[0])
        seeds.update(pane.pid for pane in panes if pane.pid in table)
        if regex is not None:
            seeds.update(pid for pid, info in table.items() if regex.search(command_of(info)))
        candidates = list(closure(dict.fromkeys(seeds, ""), table, lambda info: True))
    enrich(table, candidates, proc_root)
    if pid_file_pid is not None and pid_file_pid in table and file_mtime is not None \
            and started_after(table[pid_file_pid], file_mtime, proc_root):
        notes.append("pid_file: pid %d started after %s was written: PID reused, not selected" % (pid_file_pid, pid_file))
        pid_file_pid = None
    selection = select(
        table=table, self_pid=self_pid, ancestors=ancestors_of(self_pid, proc_root), pids=pids,
        pid_file_pid=pid_file_pid, match=regex, panes=panes, container=container, excludes=excludes,
        allow_broad_match=allow_broad_match, gpu_holders=gpu_holders,
    )
    selection.notes[:0] = notes
    selection.seen = frozenset(info.identity for info in table.values())
    return selection
