# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The worker's side of the control master: ``MasterClient``, and finding or starting the master.

The master is this package run as a program (``python -m _pct_ssh --serve PATH PERSIST``, see
``__main__``), with the directory above the package first on its PYTHONPATH, so it imports the
package's own modules and nothing from Ansible or the collection, wherever the collection lies.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import select
import socket
import stat
import subprocess
import sys
import time
import typing as t

from . import wire
from .errors import ExecResult, SessionError
from .known_hosts import flock_within
from .settings import Settings, frame_timeout

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def control_path(settings: Settings, directory: str) -> str:
    return os.path.join(os.path.expanduser(directory), settings.cache_key() + ".sock")


def private_dir(directory: str) -> str:
    """Create DIRECTORY (mode 0700) or check that it is this user's own and private; return its path.

    The sockets in it are as good as the logins behind them, so the directory
    must be a real directory owned by the user running Ansible and closed to
    everyone else; a foreign or symlinked one is refused rather than used.
    """
    directory = os.path.expanduser(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    hint = "set ansible_pct_ssh_control_path_dir (control_path_dir) to a private directory of your own"
    if not stat.S_ISDIR(st.st_mode):
        raise SessionError("config", "control_path_dir %s is not a directory (a symlink?): %s" % (directory, hint))
    if st.st_uid != os.geteuid():
        raise SessionError("config", "control_path_dir %s belongs to uid %d, not to this user (uid %d): %s" % (directory, st.st_uid, os.geteuid(), hint))
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


class MasterClient:
    """The session interface, answered by a control master over a unix socket.

    Every read on the socket is bounded by FRAME_TIMEOUT: while a request runs
    the master sends a heartbeat frame every few seconds, so a master that
    froze or vanished is given up on within seconds, not at the command's
    own timeout (an hour by default).
    """

    def __init__(self, path: str, request_timeout_margin: float = 30.0, frame_timeout: float = 30.0) -> None:
        self.path = path
        self.margin = request_timeout_margin
        self.frame_timeout = frame_timeout

    def _exchange(self, sock: socket.socket, header: t.Dict[str, t.Any], blobs: t.Sequence[bytes], timeout: float) -> wire.Frame:
        """Send one request on SOCK; its reply, the master's heartbeats skipped."""
        deadline = time.monotonic() + timeout + self.margin  # the master bounds the request itself; this is the backstop
        wire.send(sock, header, *blobs)
        while True:
            sock.settimeout(max(0.1, min(deadline - time.monotonic(), self.frame_timeout)))
            reply, data = wire.recv(sock)
            if "heartbeat" not in reply:
                return reply, data
            if time.monotonic() >= deadline:
                raise socket.timeout("no reply within %gs" % (timeout + self.margin))

    def _call(self, header: t.Dict[str, t.Any], *blobs: bytes, timeout: float = 60.0) -> wire.Frame:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        op = header.get("op")
        try:
            sock.settimeout(min(timeout + self.margin, self.frame_timeout))
            try:
                sock.connect(self.path)
            except OSError as e:
                raise SessionError("gone", "control master %s is not answering: %s" % (self.path, e)) from None
            try:
                reply, data = self._exchange(sock, header, blobs, timeout)
            except socket.timeout:
                raise SessionError(
                    "master",
                    "the control master %s sent nothing for %gs during %s (frozen or overloaded); the request may have run in "
                    "part and was not retried" % (self.path, self.frame_timeout, op),
                ) from None
            except (OSError, EOFError, ValueError) as e:
                raise SessionError(
                    "master",
                    "the control master %s went away during %s (%s); the request may have run in part and was not retried"
                    % (self.path, op, e or type(e).__name__),
                ) from None
        finally:
            sock.close()
        if "error" in reply:
            raise SessionError(reply["error"]["kind"], reply["error"]["msg"])
        return reply, data

    def ping(self) -> bool:
        try:
            self._call({"op": "ping"}, timeout=5)
            return True
        except SessionError:
            return False

    def exec(self, command, stdin=None, timeout=3600.0, pty=False, stdin_path=None, stdout_path=None) -> ExecResult:
        header = {
            "op": "exec",
            "command": command,
            "has_stdin": stdin is not None,
            "timeout": timeout,
            "pty": pty,
            "stdin_path": stdin_path,
            "stdout_path": stdout_path,
        }
        reply, data = self._call(header, stdin or b"", timeout=timeout)
        return ExecResult(reply["rc"], data[0], data[1], timed_out=reply["timed_out"], signalled=reply["signalled"])

    def mkdtemp(self) -> str:
        return self._call({"op": "mkdtemp"})[0]["path"]

    def put(self, local: str, remote: str) -> None:
        self._call({"op": "put", "local": os.path.abspath(local), "remote": remote}, timeout=24 * 3600)

    def get(self, remote: str, local: str) -> None:
        self._call({"op": "get", "remote": remote, "local": os.path.abspath(local)}, timeout=24 * 3600)

    def rmtree(self, path: str) -> None:
        self._call({"op": "rmtree", "path": path})

    def stop(self) -> None:
        try:
            self._call({"op": "stop"}, timeout=5)
        except SessionError:
            pass

    def close(self) -> None:
        """Nothing to do: the master outlives the task on purpose."""


def master_argv(path: str, persist: int) -> t.List[str]:
    """The command line of a control master serving PATH (see ``__main__``)."""
    return [sys.executable, "-m", os.path.basename(PACKAGE_DIR), "--serve", path, str(persist)]


def master_env(environ: t.Optional[t.Mapping[str, str]] = None) -> t.Dict[str, str]:
    """ENVIRON (default os.environ) with the directory above this package first on PYTHONPATH."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(PACKAGE_DIR), env.get("PYTHONPATH")) if p)
    return env


def _read_report(proc: subprocess.Popen, deadline: float, start_timeout: float) -> t.Dict[str, t.Any]:
    """The one JSON line a starting master writes on stdout (bounded by DEADLINE)."""
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
            proc.kill()
            raise SessionError("master", "the control master did not report within %ss" % start_timeout)
        block = os.read(proc.stdout.fileno(), 65536)
        if not block:
            break
        line += block
    proc.stdout.close()
    try:
        return json.loads(line.decode("utf-8"))
    except ValueError:
        proc.wait(5)
        raise SessionError("master", "the control master exited with %s before reporting" % proc.returncode) from None


def start_master(settings: Settings, path: str, persist: int, deadline: float, start_timeout: float) -> None:
    """Start a control master for SETTINGS on PATH and wait for its report; SessionError when it fails."""
    try:
        os.unlink(path)  # a stale socket of a master that is gone
    except FileNotFoundError:
        pass
    proc = subprocess.Popen(
        master_argv(path, persist),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=master_env(),
        start_new_session=True,  # a Ctrl-C of the playbook must not kill a master in use by others
        close_fds=True,
    )
    if proc.stdin is None or proc.stdout is None:  # for the type checker: both are PIPEs
        raise SessionError("master", "could not start the control master")
    proc.stdin.write(json.dumps(dataclasses.asdict(settings)).encode("utf-8") + b"\n")
    proc.stdin.close()
    reply = _read_report(proc, deadline, start_timeout)
    if not reply.get("ok"):
        proc.wait(5)
        raise SessionError(reply["kind"], reply["msg"])


def open_master(settings: Settings, directory: str, persist: int, start_timeout: float) -> MasterClient:
    """Reach the control master for SETTINGS, starting it if none answers.

    A lock file serialises the start, so parallel workers for the same host
    share one master instead of racing to create several.
    """
    directory = private_dir(directory)
    path = control_path(settings, directory)
    client = MasterClient(path, frame_timeout=frame_timeout(settings))
    if client.ping():
        return client
    with open(path + ".lock", "a") as lock:
        deadline = time.monotonic() + start_timeout  # one bound for the lock wait and the start
        if not flock_within(lock, start_timeout, interval=0.02):
            raise SessionError("master", "timed out waiting for another worker starting the control master %s" % path)
        try:
            if not client.ping():
                start_master(settings, path, persist, deadline, start_timeout)
            return client
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
