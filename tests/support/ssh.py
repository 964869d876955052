"""Commands on the lab's PVE host (OpenSSH with the lab's key) and inside its containers.

The way an operator does it, and independent of the code under test: ``ssh`` to the
PVE host, then ``pct exec VMID -- ARGV`` there; or ``lxc-attach`` on this machine,
the lab's own path into a container, for checks that must not go through pct at all.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import List, Union

SSH_OPTIONS = ("-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", "ConnectTimeout=10")


def ssh_argv(status: dict, user: str = "root") -> List[str]:
    """OpenSSH's argv up to and including USER@HOST for the lab's PVE host; append one remote command string.

    No ssh_config is read (``-F /dev/null``): the lab's key and known_hosts only, never the caller's.
    """
    return ["ssh", "-F", "/dev/null", "-i", status["key"], "-o", "UserKnownHostsFile=" + status["known_hosts"],
            *SSH_OPTIONS, "-p", str(status["port"]), "%s@%s" % (user, status["host"])]


def _remote(command: Union[str, List[str], tuple]) -> str:
    # ssh hands the remote shell one string: an argv is quoted once for it, a string is shell text as is
    return command if isinstance(command, str) else shlex.join(command)


def on_host(status: dict, command: Union[str, List[str], tuple], user: str = "root", timeout: float = 60,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run COMMAND (shell text, or an argv quoted once) on the PVE host as USER; with CHECK, rc 0 is asserted."""
    done = subprocess.run(ssh_argv(status, user) + [_remote(command)], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check:
        assert done.returncode == 0, "%s on the PVE host: rc %s %s%s" % (command, done.returncode, done.stdout,
                                                                      done.stderr)
    return done


def pct_argv(vmid: Union[int, str], argv: List[str]) -> List[str]:
    """``pct exec VMID -- ARGV`` as the PVE host's root runs it."""
    return ["pct", "exec", str(vmid), "--", *argv]


def in_ct(status: dict, *argv: str, vmid: Union[int, str] = 200, timeout: float = 60,
          check: bool = True) -> subprocess.CompletedProcess:
    """ARGV inside container VMID through the PVE host (ssh + ``pct exec``); with CHECK, rc 0 is asserted."""
    done = on_host(status, pct_argv(vmid, list(argv)), timeout=timeout)
    if check:
        assert done.returncode == 0, "pct exec %s %s: %s%s" % (vmid, argv, done.stdout, done.stderr)
    return done


def attach(status: dict, *argv: str, vmid: Union[int, str] = 200, timeout: float = 60,
           check: bool = True) -> subprocess.CompletedProcess:
    """ARGV inside container VMID straight through ``lxc-attach`` on this machine (neither ssh nor pct)."""
    done = subprocess.run(["lxc-attach", "-P", status["lxcpath"], "-n", str(vmid), "--", *argv],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError("%s: rc=%s %s" % (argv, done.returncode, done.stderr))
    return done
