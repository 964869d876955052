"""A throwaway OpenSSH server on 127.0.0.1 for the session tests (a real sshd, no lab needed).

Each server runs as a child of the test process, on a free port, with its own
host key, client key and known_hosts; it is stopped by its own PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import typing as t
from dataclasses import dataclass

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    key: str
    known_hosts: str
    dir: str
    proc: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp: str, sftp: bool, max_sessions: int = 50) -> Sshd:
    os.makedirs(tmp, exist_ok=True)
    hostkey = os.path.join(tmp, "host_ed25519")
    key = os.path.join(tmp, "id_ed25519")
    for path in (hostkey, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    shutil.copy(key + ".pub", os.path.join(tmp, "authorized_keys"))
    port = _free_port()
    cfg = os.path.join(tmp, "sshd_config")
    lines = [
        "Port %d" % port,
        "ListenAddress 127.0.0.1",
        "HostKey %s" % hostkey,
        "AuthorizedKeysFile %s" % os.path.join(tmp, "authorized_keys"),
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PidFile %s" % os.path.join(tmp, "sshd.pid"),
        "MaxSessions %d" % max_sessions,
        "MaxStartups 50",
    ]
    if sftp:
        lines.append("Subsystem sftp /usr/lib/openssh/sftp-server")
    with open(cfg, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", cfg], stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "sshd.log"), "w"))
    pub = open(hostkey + ".pub").read().split()
    known = os.path.join(tmp, "known_hosts")
    with open(known, "w") as fh:
        fh.write("[127.0.0.1]:%d %s %s\n" % (port, pub[0], pub[1]))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Sshd(port, key, known, tmp, proc)
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    pytest.skip("could not start a throwaway sshd: %s" % open(os.path.join(tmp, "sshd.log")).read())


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> t.Iterator[Sshd]:
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        pytest.skip("needs root and OpenSSH's sshd for a throwaway server")
    server = _start(str(tmp_path_factory.mktemp("sshd")), sftp=True)
    yield server
    server.proc.terminate()
    server.proc.wait(10)


@pytest.fixture(scope="session")
def sshd_nosftp(tmp_path_factory) -> t.Iterator[Sshd]:
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        pytest.skip("needs root and OpenSSH's sshd for a throwaway server")
    server = _start(str(tmp_path_factory.mktemp("sshd_nosftp")), sftp=False)
    yield server
    server.proc.terminate()
    server.proc.wait(10)


@pytest.fixture(scope="session")
def sshd_two_sessions(tmp_path_factory) -> t.Iterator[Sshd]:
    """An sshd that allows only two sessions per connection (MaxSessions 2)."""
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        pytest.skip("needs root and OpenSSH's sshd for a throwaway server")
    server = _start(str(tmp_path_factory.mktemp("sshd_two")), sftp=True, max_sessions=2)
    yield server
    server.proc.terminate()
    server.proc.wait(10)
