# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the lab does on this machine: commands, files, recorded processes, mounts, its one lock, preflight.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import time

from .facts import LAB_DIR, LOCK_FILE, STATE_FILE, Deadline, LabError, _proc


def run(cmd: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=timeout, input=input, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise LabError("timed out after %ss: %s" % (timeout, shlex.join(cmd))) from None
    except FileNotFoundError:
        raise LabError("command not found: %s (run scripts/setup)" % cmd[0]) from None
    if check and res.returncode != 0:
        raise LabError("failed (rc %d): %s\n%s%s" % (
            res.returncode, shlex.join(cmd), res.stdout.decode(errors="replace")[-2000:],
            res.stderr.decode(errors="replace")[-2000:]))
    return res


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_if_changed(path: str, text: str, mode: int = 0o644) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text and (os.stat(path).st_mode & 0o7777) == mode:
                return False
    except OSError:
        pass
    atomic_write(path, text, mode)
    return True


def load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def save_state(state: dict) -> None:
    atomic_write(STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def proc_ref(pid: int) -> dict | None:
    start = _proc.read_starttime(pid)
    return None if start is None else {"pid": pid, "starttime": start}


def ref_alive(ref: dict | None) -> bool:
    """The recorded process still runs (same PID *and* start time; a zombie is gone)."""
    if not ref:
        return False
    info = _proc.read_process(int(ref["pid"]))
    return info is not None and info.starttime == ref["starttime"] and info.state not in ("Z", "X")


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for info in _proc.iter_processes():
        kids.setdefault(info.ppid, []).append(info.pid)
    return kids


def descendants(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo.extend(kids.get(cur, []))
    return out


def kill_refs(refs: list[dict], timeout: float = 15.0, with_descendants: bool = True) -> list[int]:
    """SIGKILL the recorded processes that are still the same processes, and their trees.

    Descendants are found again on every pass (a respawning launcher can
    fork while we work). Returns what is left alive at the deadline.
    """
    deadline = Deadline(timeout)
    targets = [r for r in refs if ref_alive(r)]
    while True:
        pids = {int(r["pid"]) for r in targets if ref_alive(r)}
        if with_descendants and pids:
            kids = children_map()
            for pid in list(pids):
                pids.update(descendants(pid, kids))
        alive = []
        for pid in pids:
            info = _proc.read_process(pid)
            if info is None or info.state in ("Z", "X"):
                continue
            alive.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not alive or deadline.expired():
            return alive
        time.sleep(0.05)


def reap_children_nohang() -> None:
    while True:
        try:
            pid = os.waitpid(-1, os.WNOHANG)[0]
        except ChildProcessError:
            return
        if pid == 0:
            return


def mountinfo_under(path: str) -> list[str]:
    """Mount points at or below path in this mount namespace, deepest first."""
    path = path.rstrip("/")
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == path or mnt.startswith(path + "/"):
                out.append(mnt)
    return sorted(out, key=len, reverse=True)


def umount_under(path: str) -> None:
    for mnt in mountinfo_under(path):
        run(["umount", "-l", mnt], timeout=30, check=False)


class Lock:
    """One lab operation at a time (up/down/trainer); status never waits for it."""

    def __init__(self, timeout: float = 1800) -> None:
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> Lock:
        self.fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = Deadline(self.timeout)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if deadline.expired():
                raise LabError("another lab operation holds %s for more than %ss" % (LOCK_FILE, self.timeout))
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


NEEDED = {
    "debootstrap": "debootstrap", "lxc-start": "lxc", "lxc-attach": "lxc", "lxc-info": "lxc",
    "lxc-stop": "lxc", "lxc-wait": "lxc", "unshare": "util-linux", "mount": "mount",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "sudo": "sudo", "visudo": "sudo",
    "useradd": "passwd", "userdel": "passwd", "usermod": "passwd", "cp": "coreutils",
}


def preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (LXC, sshd, users): run it as root")
    missing = sorted({pkg for tool, pkg in NEEDED.items() if shutil.which(tool) is None})
    if not os.path.exists("/usr/sbin/sshd"):
        missing.append("openssh-server")
    if missing:
        raise LabError("missing packages %s: run scripts/setup" % ", ".join(missing))
    if LAB_DIR in ("/", "") or not os.path.basename(LAB_DIR).startswith("gpuops-lab"):
        raise LabError("GPUOPS_LAB_DIR=%s: its last component must start with 'gpuops-lab'" % LAB_DIR)
