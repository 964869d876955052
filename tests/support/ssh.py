"""Commands on the lab's PVE host (OpenSSH with the lab's key) and inside its containers.

The way an operator does it, and independent of the code under test: ``ssh`` to the
PVE host, then ``pct exec VMID -- ARGV`` there; or ``lxc-attach`` on this machine,
the lab's own path into a container, for checks that must not go through pct at all.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Callable, List, Optional, Union

from tests.support.lab import MAIN_CT

SSH_OPTIONS = ("-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", "ConnectTimeout=10")


def ssh_argv(status: dict, user: str = "root", port: Optional[int] = None) -> List[str]:
    """OpenSSH's argv up to and including USER@HOST for the lab's PVE host (PORT: another lab PVE host's, as
    the second node's ``status["node2"]["port"]``); append one remote command string.

    No ssh_config is read (``-F /dev/null``): the lab's key and known_hosts only, never the caller's.
    """
    return ["ssh", "-F", "/dev/null", "-i", status["key"], "-o", "UserKnownHostsFile=" + status["known_hosts"],
            *SSH_OPTIONS, "-p", str(port or status["port"]), "%s@%s" % (user, status["host"])]


def on_host(status: dict, *command: Union[str, List[str]], user: str = "root", timeout: float = 120,
            check: bool = True, port: Optional[int] = None) -> subprocess.CompletedProcess:
    """COMMAND on the PVE host (PORT: see :func:`ssh_argv`) as USER: one string is shell text as is; several strings, or one list, are an
    argv quoted once (ssh hands the remote shell one string). With CHECK, rc 0 is asserted."""
    if len(command) == 1 and isinstance(command[0], (list, tuple)):  # an argv passed as one list
        command = tuple(command[0])
    remote = command[0] if len(command) == 1 and isinstance(command[0], str) else shlex.join(command)
    done = subprocess.run(ssh_argv(status, user, port) + [remote], capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check:
        assert done.returncode == 0, "%s on the PVE host: rc %s %s%s" % (
            remote, done.returncode, done.stdout, done.stderr)
    return done


def pct_argv(vmid: Union[int, str], argv: List[str]) -> List[str]:
    """``pct exec VMID -- ARGV`` as the PVE host's root runs it."""
    return ["pct", "exec", str(vmid), "--", *argv]


# lxc-attach first copies itself into a sealed memfd and re-executes from it (liblxc src/lxc/rexec.c, against
# CVE-2019-5736). Sealing fails with EBUSY while the kernel still counts the copied pages as pinned
# (mm/memfd.c memfd_wait_for_pins), which a loaded machine shows now and then; lxc-attach then exits before it
# touched the container, so the command never ran and running it again is safe.
LXC_REXEC_FAILED = "Failed to rexec as memfd"
LXC_REXEC_TRIES = 3


def without_lxc_rexec_failures(attempt: Callable[[], subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    """ATTEMPT again (at most LXC_REXEC_TRIES runs) while lxc-attach failed before it started the command."""
    for _run in range(LXC_REXEC_TRIES - 1):
        done = attempt()
        if done.returncode == 0 or LXC_REXEC_FAILED not in done.stderr:
            return done
    return attempt()


def in_ct(status: dict, *argv: str, vmid: Union[int, str] = MAIN_CT, timeout: float = 60,
          check: bool = True) -> subprocess.CompletedProcess:
    """ARGV inside container VMID through the PVE host (ssh + ``pct exec``); with CHECK, rc 0 is asserted."""
    done = without_lxc_rexec_failures(
        lambda: on_host(status, *pct_argv(vmid, list(argv)), timeout=timeout, check=False))
    if check:
        assert done.returncode == 0, "pct exec %s %s: %s%s" % (vmid, argv, done.stdout, done.stderr)
    return done


def attach(status: dict, *argv: str, vmid: Union[int, str] = MAIN_CT, timeout: float = 60,
           check: bool = True) -> subprocess.CompletedProcess:
    """ARGV inside container VMID straight through ``lxc-attach`` on this machine (neither ssh nor pct)."""
    done = without_lxc_rexec_failures(lambda: subprocess.run(
        ["lxc-attach", "-P", status["lxcpath"], "-n", str(vmid), "--", *argv],
        capture_output=True, text=True, timeout=timeout, check=False))
    if check and done.returncode != 0:
        raise AssertionError("%s: rc=%s %s" % (argv, done.returncode, done.stderr))
    return done
