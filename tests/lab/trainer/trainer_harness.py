# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Test harness for the fake trainer and ``training_stop`` (used by tests and tests/bench).

Starts real process trees, real decoys and real tmux servers (each on its own
socket; tests/support/module.py runs the real module), and cleans up only what it
started: every process it kills carries the test's unique directory in its
command line or was started by it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import fake_trainer  # next to this file: on sys.path as the script directory, or via tests/support/paths.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TRAINER = os.path.join(HERE, "fake_trainer.py")
PYTHON = sys.executable


verify_checkpoint = fake_trainer.verify_checkpoint
latest_checkpoint = fake_trainer.latest_checkpoint


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Bounded wait: the predicate's truthy value, or AssertionError naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(interval)


def wait_exec(pid: int, marker: str, timeout: float = 10.0) -> None:
    """Until ``pid``'s command line holds ``marker``: before its exec a child shows its parent's."""
    wait_for(lambda: marker in cmdline(pid), timeout, 0.01, what="pid %d to exec (%s)" % (pid, marker))


def read_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open("/proc/%d/stat" % pid) as handle:
            text = handle.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[19])


def alive(pid: int, starttime: int | None = None) -> bool:
    """Running (not a zombie) and, when given, still the same process."""
    stat = read_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime is None or stat[1] == starttime


def pids_with(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (the test's unique directory)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and alive(int(name)):
            found.append(int(name))
    return sorted(found)


def kill_all_with(text: str) -> None:
    for pid in pids_with(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Trainer:
    """One fake training job, started as if from a terminal (its own session)."""

    def __init__(self, workdir: str, behaviour: str = "graceful", nproc: int = 2, step_seconds: float = 0.2,
                 extra: list[str] | None = None, gpu: bool = False) -> None:
        self.workdir = workdir
        self.ckpt_dir = os.path.join(workdir, "ckpt")
        self.log_path = os.path.join(workdir, "trainer.log")
        self.nproc = nproc
        self.argv = [PYTHON, TRAINER, "--behaviour", behaviour, "--nproc", str(nproc), "--ckpt-dir", self.ckpt_dir,
                     "--step-seconds", str(step_seconds)] + (extra or []) + ([] if gpu else ["--no-gpu"])
        self.proc: subprocess.Popen | None = None

    @property
    def regex(self) -> str:
        return "fake_trainer\\.py .*--ckpt-dir %s( |$)" % self.ckpt_dir.replace(".", "\\.")

    def start(self) -> Trainer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        wait_for(lambda: len(self.workers()) == self.nproc and "step " in self.log(), 20, what="trainer up")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def workers(self) -> list[int]:
        return [pid for pid in pids_with(self.ckpt_dir) if "--worker" in cmdline(pid)]

    def worker_of_rank(self, rank: int) -> int:
        found = [pid for pid in self.workers() if "--rank %d " % rank in cmdline(pid)]
        assert len(found) == 1, "rank %d: %s" % (rank, found)
        return found[0]

    def launcher(self) -> int | None:
        found = [pid for pid in pids_with(self.ckpt_dir) if "--worker" not in cmdline(pid)]
        return found[0] if found else None

    def identities(self) -> list[tuple[int, int]]:
        return [(pid, read_stat(pid)[1]) for pid in pids_with(self.ckpt_dir) if read_stat(pid)]

    def restarts(self) -> list[str]:
        try:
            with open(os.path.join(self.ckpt_dir, "restarts.log")) as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []

    def cleanup(self) -> None:
        kill_all_with(self.ckpt_dir)
        if self.proc is not None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


DECOY = r'''
import os, signal, sys, time
record = sys.argv[-1]
def note(signum, frame):
    with open(record, "a") as handle:
        handle.write("%s\n" % signal.Signals(signum).name)
for s in signal.valid_signals():
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
        try:
            signal.signal(s, note)
        except (OSError, ValueError):
            pass
with open(record, "a") as handle:
    handle.write("up\n")
while True:
    time.sleep(3600)
'''


# A process whose leader thread exits alone (SYS_exit, not exit_group, x86_64 only): /proc shows the
# leader as Z while a thread keeps the process alive. Prints "ready" before that.
ZOMBIE_LEADER = """
import ctypes, threading, time
def spin():
    while True:
        time.sleep(0.05)
threading.Thread(target=spin).start()
print("ready", flush=True)
time.sleep(0.1)
ctypes.CDLL(None).syscall(60, 0)
"""


class Decoy:
    """A process that records every signal it gets; its command line is chosen by the test.

    ``argv_tail`` follows the script: e.g. a networkd-dispatcher-like daemon is
    ``python3 DIR/networkd-dispatcher --run-startup-triggers``, an editor is
    ``python3 DIR/vim /path/to/fake_trainer.py``.
    """

    def __init__(self, workdir: str, name: str, argv_tail: list[str]) -> None:
        self.script = os.path.join(workdir, name)
        with open(self.script, "w") as handle:
            handle.write(DECOY)
        self.record = os.path.join(workdir, name + ".signals")
        self.proc = subprocess.Popen([PYTHON, self.script] + argv_tail + ["--record", self.record],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: os.path.exists(self.record), 10, what="decoy %s up" % name)

    def signals(self) -> list[str]:
        with open(self.record) as handle:
            return [line for line in handle.read().split() if line != "up"]

    def untouched(self) -> bool:
        return self.proc.poll() is None and self.signals() == []

    def cleanup(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)


class Tmux:
    """A private tmux server (its own socket), so tests never touch anyone else's sessions."""

    def __init__(self, workdir: str) -> None:
        self.socket = os.path.join(workdir, "tmux.sock")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.socket] + list(args), capture_output=True, text=True,
                              timeout=10, check=check, stdin=subprocess.DEVNULL)

    def new_session(self, name: str, command: str) -> None:
        self.run("new-session", "-d", "-s", name, "-x", "200", "-y", "50", command)

    def pane_pids(self, name: str) -> list[int]:
        out = self.run("list-panes", "-s", "-t", "=" + name, "-F", "#{pane_pid}").stdout
        return [int(x) for x in out.split()]

    def capture(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", "=" + name, check=False).stdout

    def kill_server(self) -> None:
        pid = self.run("display-message", "-p", "#{pid}", check=False).stdout.strip()
        self.run("kill-server", check=False)
        if pid.isdigit():
            wait_for(lambda: not alive(int(pid)), 5, what="tmux server exit")


def have_tmux() -> bool:
    return shutil.which("tmux") is not None
