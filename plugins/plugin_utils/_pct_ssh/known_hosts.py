# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Host keys: reading known_hosts, judging a key it lacks, and recording an accepted one under a lock."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import time
import typing as t

from .errors import SessionError
from .settings import Settings

SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


def known_hosts_name(host: str, port: int) -> str:
    """The host name as OpenSSH writes it in known_hosts."""
    return host if port == 22 else "[%s]:%d" % (host, port)


def fingerprint_sha256(key: t.Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def flock_within(handle: t.IO[t.Any], timeout: float, interval: float = 0.05) -> bool:
    """Take an exclusive flock within ``timeout`` seconds; False when another holder keeps it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def append_known_host(path: str, line: str, timeout: float) -> None:
    """Append one known_hosts line under an exclusive lock (bounded wait)."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        if not flock_within(lock, timeout):
            raise SessionError("config", "could not lock %s within lock_file_timeout=%ss" % (path, timeout))
        try:
            with open(path, "a") as fh:
                fh.write(line + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_known_hosts(client: t.Any, settings: Settings) -> None:
    """Give paramiko's CLIENT the system's and the configured known_hosts (when host keys are checked)."""
    import paramiko

    if not settings.host_key_checking:
        return
    for path in (SYSTEM_KNOWN_HOSTS, settings.known_hosts_file):
        path = os.path.expanduser(path)
        if os.path.exists(path):
            try:
                client.load_system_host_keys(path)
            except (OSError, paramiko.hostkeys.InvalidHostKey) as e:
                raise SessionError("config", "cannot read known_hosts file %s: %s" % (path, e)) from None


def accept_missing_key(settings: Settings, client: t.Any, hostname: str, key: t.Any) -> None:
    """A host key known_hosts lacks: refused (SessionError 'hostkey_unknown') unless auto-add allows it,
    then trusted for this connection and recorded when record_host_keys says so."""
    s = settings
    name = known_hosts_name(s.host, s.port)
    if s.host_key_checking and not s.host_key_auto_add:
        raise SessionError(
            "hostkey_unknown",
            "the host key of %s (%s %s) is not in %s. Check the fingerprint on the host "
            "(ssh-keygen -lf /etc/ssh/ssh_host_%s_key.pub), then add it, e.g. `ssh-keyscan -p %d %s >> %s`, "
            "or set ansible_pct_ssh_host_key_auto_add=true to accept and record it"
            % (name, key.get_name(), fingerprint_sha256(key), s.known_hosts_file, key.get_name().replace("ssh-", ""),
               s.port, s.host, s.known_hosts_file),
        )
    client.get_host_keys().add(hostname, key.get_name(), key)
    if s.host_key_checking and s.record_host_keys:
        append_known_host(s.known_hosts_file, "%s %s %s" % (name, key.get_name(), key.get_base64()), s.lock_file_timeout)


def mismatch_message(settings: Settings, expected: t.Any, got: t.Any) -> str:
    return (
        "the host key of %s changed: expected %s, got %s. This can be an attack; if the host was reinstalled, "
        "remove its old line from %s"
        % (known_hosts_name(settings.host, settings.port), fingerprint_sha256(expected), fingerprint_sha256(got),
           settings.known_hosts_file)
    )
