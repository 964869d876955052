# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Everything ``training_stop`` asks of tmux: a session's panes, Ctrl-C to them, the last step line shown.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). The argv builders and parsers
are pure; :func:`tmux_panes`, :func:`send_ctrl_c` and :func:`tmux_step` run
``tmux``, each call bounded by a timeout. A missing tmux, server or session is
"no panes", never an error: the job is then found (or not) by the other selectors.
"""

from __future__ import annotations

import re
import subprocess
import typing as t
from dataclasses import dataclass


class TmuxError(Exception):
    """tmux did not answer in time; the message names the option (tmux_session) and what to check."""


@dataclass(frozen=True)
class Pane:
    pane_id: str
    pid: int


def tmux_list_panes_argv(socket: str | None = None, tmux: str = "tmux") -> list[str]:
    # every pane of the server, filtered by exact session name in Python: tmux's own target
    # lookup is fuzzy ("list-panes -s -t =dflash" resolves to a session "dflash-eval" in tmux 3.3)
    argv = [tmux]
    if socket:
        argv += ["-S", socket]
    # pane_dead: a pane kept after its process exited (remain-on-exit) still shows that process's PID, which the
    # kernel may have given to an unrelated process since
    return argv + ["list-panes", "-a", "-F", "#{pane_id}\t#{pane_pid}\t#{pane_dead}\t#{session_name}"]


def tmux_send_keys_argv(pane_id: str, keys: str = "C-c", socket: str | None = None, tmux: str = "tmux") -> list[str]:
    argv = [tmux]
    if socket:
        argv += ["-S", socket]
    return argv + ["send-keys", "-t", pane_id, keys]


def tmux_capture_argv(pane_id: str, lines: int = 50, socket: str | None = None, tmux: str = "tmux") -> list[str]:
    argv = [tmux]
    if socket:
        argv += ["-S", socket]
    return argv + ["capture-pane", "-p", "-J", "-t", pane_id, "-S", "-%d" % lines]


def last_step(text: str, step_regex: t.Pattern[str]) -> int | None:
    """The step number of the last line ``step_regex`` finds in ``text`` (its first group, else the first number)."""
    found = None
    for hit in step_regex.finditer(text):
        digits = re.search(r"\d+", hit.group(1) if hit.groups() and hit.group(1) else hit.group(0))
        if digits:
            found = int(digits.group(0))
    return found


def pane_text(pane: Pane, socket: str | None = None, lines: int = 50, timeout: float = 5.0) -> str | None:
    """The last ``lines`` lines of ``pane`` (None when the pane is gone or tmux does not answer)."""
    try:
        done = subprocess.run(tmux_capture_argv(pane.pane_id, lines, socket=socket), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def last_step_line(text: str, step_regex: t.Pattern[str]) -> str:
    """The last line of ``text`` in which ``step_regex`` finds a step ('' without one)."""
    hits = [line for line in text.splitlines() if step_regex.search(line)]
    return hits[-1].strip() if hits else ""


def tmux_step(panes: t.Sequence[Pane], step_regex: t.Pattern[str], socket: str | None = None, timeout: float = 5.0) -> int | None:
    """The highest last step line shown in ``panes`` (None without one, or when the panes are gone)."""
    steps = []
    for pane in panes:
        text = pane_text(pane, socket, timeout=timeout)
        step = last_step(text, step_regex) if text is not None else None
        if step is not None:
            steps.append(step)
    return max(steps) if steps else None


def pane_window(pane: Pane, socket: str | None = None, timeout: float = 5.0) -> str:
    """The name of the window ``pane`` is in ('' when tmux does not say)."""
    argv = ["tmux"] + (["-S", socket] if socket else []) + ["display-message", "-p", "-t", pane.pane_id, "#{window_name}"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""


def parse_panes(text: str, session: str) -> list[Pane]:
    """Live panes of exactly ``session`` from ``list-panes -a`` output (``%id<TAB>pid<TAB>dead<TAB>session``); a dead
    pane's PID is no process of the session any more."""
    panes = []
    for line in text.splitlines():
        words = line.split("\t", 3)
        if len(words) == 4 and words[3] == session and words[0].startswith("%") and words[1].isdigit() \
                and words[2] != "1":
            panes.append(Pane(words[0], int(words[1])))
    return panes


def tmux_panes(session: str, socket: str | None = None, timeout: float = 10.0) -> tuple[list[Pane], str]:
    """The panes of ``session`` and a note; a missing tmux, server or session is no panes, not an error."""
    argv = tmux_list_panes_argv(socket)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return [], "tmux is not installed: no session %r" % session
    except subprocess.TimeoutExpired:
        raise TmuxError("tmux_session: 'tmux list-panes' did not answer within %ss; check the tmux server" % timeout) from None
    if done.returncode != 0:
        return [], "no tmux server (%s): no session %r" % (done.stderr.decode(errors="replace").strip(), session)
    panes = parse_panes(done.stdout.decode(errors="replace"), session)
    return panes, "" if panes else "no tmux session %r" % session


def send_ctrl_c(session: str, socket: str | None = None, timeout: float = 10.0) -> tuple[list[str], list[str]]:
    """Ctrl-C to every pane of ``session``: (pane ids it reached, errors). Panes are listed again, not taken
    from the snapshot: a pane may have closed since."""
    panes, note = tmux_panes(session, socket)
    sent, errors = [], [note] if note else []
    for pane in panes:
        argv = tmux_send_keys_argv(pane.pane_id, "C-c", socket)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append("%s: %s" % (pane.pane_id, exc))
            continue
        if done.returncode == 0:
            sent.append(pane.pane_id)
        else:
            errors.append("%s: %s" % (pane.pane_id, done.stderr.decode(errors="replace").strip()))
    return sent, errors
