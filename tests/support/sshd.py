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
from dataclasses import dataclass

import pytest

from tests.support.net import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    key: str
    known_hosts: str
    dir: str
    proc: subprocess.Popen


def start_sshd(tmp: str, sftp: bool = True, max_sessions: int = 50) -> Sshd:
    """A throwaway sshd under TMP (its own host key, client key, known_hosts), serving once it accepts
    connections (bounded wait); the calling test is skipped with sshd's log when it cannot start."""
    os.makedirs(tmp, exist_ok=True)
    hostkey = os.path.join(tmp, "host_ed25519")
    key = os.path.join(tmp, "id_ed25519")
    for path in (hostkey, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    shutil.copy(key + ".pub", os.path.join(tmp, "authorized_keys"))
    port = free_port()
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


def stop_sshd(server: Sshd) -> None:
    """End the server by its own PID (bounded wait)."""
    server.proc.terminate()
    server.proc.wait(10)


def sshd_usable() -> bool:
    """A throwaway sshd needs root (it binds and switches users) and OpenSSH's sshd."""
    return os.geteuid() == 0 and os.path.exists(SSHD)
