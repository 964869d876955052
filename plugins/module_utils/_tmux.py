# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Everything the collection asks of tmux.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). The argv builders and parsers
are pure; every call of ``tmux`` is bounded by a timeout.

``training_stop`` reads a session's panes, sends them Ctrl-C and reads the last
step line shown (:func:`tmux_panes`, :func:`send_ctrl_c`, :func:`tmux_step`): a
missing tmux, server or session is "no panes", never an error, and the job is
then found (or not) by the other selectors. ``training_start`` drives tmux as
the job's user through :class:`Tmux`, whose panes keep their exit status
(:class:`Pane`), and escapes what it hands tmux (:func:`tmux_arg`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import typing as t
from dataclasses import dataclass

TMUX_TIMEOUT = 10.0
# session_name last: it is the one field that could hold a tab
PANES_FORMAT = ("#{pane_id}\t#{pane_pid}\t#{pane_dead}\t#{pane_dead_status}\t#{pane_dead_signal}\t#{window_id}\t"
                "#{window_index}\t#{window_name}\t#{session_name}")


class TmuxError(Exception):
    """tmux is missing or did not answer in time; the message says what to check."""


@dataclass(frozen=True)
class Pane:
    """One pane of a session, as ``list-panes -F PANES_FORMAT`` shows it."""

    pane_id: str
    pid: int
    # a pane kept after its process exited (remain-on-exit) still shows that process's PID, which the kernel
    # may have given to an unrelated process since
    dead: bool = False
    exit_status: int | None = None  # negative: killed by that signal (as Python's returncode)
    window_id: str = ""
    window_index: int = 0
    window_name: str = ""


def parse_panes(text: str, session: str) -> list[Pane]:
    """The panes of exactly ``session`` from ``list-panes -a -F PANES_FORMAT`` output (tmux's own target lookup is
    fuzzy: ``-t =name`` may still resolve to a session with a longer name)."""
    panes = []
    for line in text.splitlines():
        words = line.split("\t", 8)
        if len(words) != 9 or words[8] != session or not words[0].startswith("%") or not words[1].isdigit():
            continue
        status = int(words[3]) if words[3].lstrip("-").isdigit() else None
        if status is None and words[4].isdigit() and int(words[4]):
            status = -int(words[4])
        panes.append(Pane(words[0], int(words[1]), words[2] == "1", status, words[5],
                          int(words[6]) if words[6].isdigit() else 0, words[7]))
    return panes


def tmux_prefix(run_as: str | None = None, socket: str | None = None) -> list[str]:
    """``tmux [-S SOCKET]``, behind ``runuser -u USER --`` to reach USER's tmux server (and start the job as USER)."""
    argv = ["runuser", "-u", run_as, "--"] if run_as else []
    return argv + ["tmux"] + (["-S", socket] if socket else [])


def tmux_list_panes_argv(socket: str | None = None) -> list[str]:
    # every pane of the server, filtered by exact session name in Python: tmux's own target
    # lookup is fuzzy ("list-panes -s -t =dflash" resolves to a session "dflash-eval" in tmux 3.3)
    return tmux_prefix(socket=socket) + ["list-panes", "-a", "-F", PANES_FORMAT]


def tmux_send_keys_argv(pane_id: str, keys: str = "C-c", socket: str | None = None) -> list[str]:
    return tmux_prefix(socket=socket) + ["send-keys", "-t", pane_id, keys]


def tmux_capture_argv(pane_id: str, lines: int = 50, socket: str | None = None, run_as: str | None = None) -> list[str]:
    return tmux_prefix(run_as, socket) + ["capture-pane", "-p", "-J", "-t", pane_id, "-S", "-%d" % lines]


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
    # a dead pane's PID is no process of the session any more
    panes = [pane for pane in parse_panes(done.stdout.decode(errors="replace"), session) if not pane.dead]
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


# ---------------------------------------------------------------- tmux as training_start drives it

def parse_tmux_version(text: str) -> tuple[int, int] | None:
    """``tmux 3.3a`` -> (3, 3); ``tmux next-3.4`` -> (3, 4); None when there is no number (``tmux master``)."""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def tmux_arg(arg: str) -> str:
    """An argument tmux passes on unchanged: tmux splits its command line at any argument ending in ';' (the
    command separator), unless the ';' is escaped with a backslash, which it then drops."""
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


def format_escape(text: str) -> str:
    """tmux expands -c (and -n, -s) as a format: '##' is a literal '#'."""
    return text.replace("#", "##")


def tmux_env() -> dict[str, str]:
    # $TMUX would point the client at the server this module runs under (a local connection from inside tmux),
    # whatever user it is meant to reach
    return {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}


class Tmux:
    """tmux as the job's user (through runuser when that is not this module's), on its server (or ``socket``)."""

    def __init__(self, run_as: str | None = None, socket: str | None = None, timeout: float = TMUX_TIMEOUT) -> None:
        self.run_as, self.socket, self.timeout = run_as, socket, timeout

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return self.run_argv(tmux_prefix(self.run_as, self.socket) + list(args))

    def run_argv(self, argv: t.Sequence[str]) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=self.timeout,
                                  check=False, env=tmux_env(), text=True, errors="replace")
        except FileNotFoundError:
            raise TmuxError("%s is not installed on the target" % argv[0]) from None
        except subprocess.TimeoutExpired:
            raise TmuxError("'%s' did not answer within %g s; check the tmux server" % (
                shlex.join(argv[:6]), self.timeout)) from None

    def version(self) -> tuple[int, int] | None:
        done = self.run("-V")
        return parse_tmux_version(done.stdout) if done.returncode == 0 else None

    def panes(self, session: str) -> list[Pane]:
        """The panes of ``session``; none when there is no server or session (not an error)."""
        done = self.run("list-panes", "-a", "-F", PANES_FORMAT)
        return parse_panes(done.stdout, session) if done.returncode == 0 else []

    def capture(self, pane_id: str, lines: int) -> str | None:
        """The last ``lines`` lines of the pane (joined where they wrapped); None when tmux cannot say."""
        done = self.run_argv(tmux_capture_argv(pane_id, lines, self.socket, self.run_as))
        return done.stdout if done.returncode == 0 else None
