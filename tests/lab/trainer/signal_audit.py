# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab's signal audit: every catchable signal a lab process receives, appended to a file of its own.

Standard library only (copied into the lab containers with the trainer). Off unless the
environment names a directory in ``GPUOPS_LAB_SIGNAL_AUDIT`` (the lab sets it for the fake
trainer's tmux session and the networkd-dispatcher decoy's unit; host-side tests leave it unset).

Each audited process writes ``DIR/ROLE.PID.jsonl``: a header line
``{"role", "pid", "start", "boot_id", "argv"}`` (``start`` is the process start time in clock
ticks, field 22 of ``/proc/self/stat``, so a reused PID is told apart), then one line
``{"signal": "SIGTERM", "time": ...}`` per signal received, written before the process acts
on it. Behaviour is unchanged: a handler the program installs runs after the record, an ignored
signal stays ignored (it is recorded, then nothing happens), a default action is carried out
(recorded, default restored, the signal raised again).

SIGKILL and SIGSTOP cannot be caught: a SIGKILLed process is seen by its absence, a stopped one
by its state (``T``); SIGCHLD, SIGWINCH (tmux resizes a pane) and SIGPIPE are not audited.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable, Union

ENV = "GPUOPS_LAB_SIGNAL_AUDIT"
AUDITED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
           signal.SIGTERM, signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
Action = Union[Callable[[int, Any], Any], int, None]


def _start_ticks() -> int:
    with open("/proc/self/stat", encoding="ascii") as handle:
        stat = handle.read()
    return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22: starttime


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class SignalAudit:
    """Wraps the process's signal actions so each delivery is recorded first (see the module doc)."""

    def __init__(self, role: str, directory: str | None = None) -> None:
        self.directory = directory if directory is not None else os.environ.get(ENV, "")
        self.actions: dict[int, Action] = {}
        self.fd = -1
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, "%s.%d.jsonl" % (role.replace(" ", "-"), os.getpid()))
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._write({"role": role, "pid": os.getpid(), "start": _start_ticks(), "boot_id": _boot_id(),
                         "argv": list(sys.argv)})

    @property
    def enabled(self) -> bool:
        return self.fd >= 0

    def _write(self, record: dict) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())  # one write: one whole line

    def handle(self, signum: int, action: Action) -> None:
        """``signal.signal(signum, action)``, audited when the audit is on."""
        if not self.enabled or signum not in AUDITED:
            signal.signal(signum, action)
            return
        self.actions[signum] = action
        signal.signal(signum, self._deliver)

    def install(self) -> None:
        """Audit every signal in :data:`AUDITED` not set through :meth:`handle`, keeping its current action."""
        if not self.enabled:
            return
        for signum in AUDITED:
            if signum not in self.actions:
                self.handle(signum, signal.getsignal(signum))

    def _deliver(self, signum: int, frame: Any) -> None:
        self._write({"signal": signal.Signals(signum).name, "time": time.time()})
        action = self.actions.get(signum)
        if callable(action):
            action(signum, frame)
        elif action == signal.SIG_IGN or signum == signal.SIGCONT:
            return  # ignored stays ignored; SIGCONT's default (continue) already happened
        else:  # the default action: terminate or stop, as without the audit
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            if signum in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):  # continued: audit the next one too
                signal.signal(signum, self._deliver)


def read_audit(directory: str) -> list[dict]:
    """Every audited process in ``directory``: its header plus ``signals`` (names, in order)."""
    out = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            lines = [json.loads(line) for line in handle if line.strip()]
        if not lines:
            continue
        head = dict(lines[0], file=name)
        head["signals"] = [rec["signal"] for rec in lines[1:] if "signal" in rec]
        out.append(head)
    return out
