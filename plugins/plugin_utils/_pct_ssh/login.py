# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Logging in: a paramiko SSHClient connected with the settings, its failures as SessionError kinds."""

from __future__ import annotations

import os
import typing as t

from . import known_hosts
from .errors import SessionError
from .settings import Settings

# use_rsa_sha2_algorithms false: the algorithm names disabled (as OpenSSH spells them; names paramiko does not
# know are ignored by its disabled_algorithms)
RSA_SHA2 = ("rsa-sha2-512", "rsa-sha2-256", "rsa-sha2-512-cert-v01@openssh.com", "rsa-sha2-256-cert-v01@openssh.com")


def import_paramiko() -> t.Any:
    try:
        import paramiko
    except ImportError as e:
        raise SessionError("config", "the pct_ssh connection needs the Python library paramiko: %s" % e) from None
    return paramiko


def connect_kwargs(settings: Settings) -> t.Dict[str, t.Any]:
    """The keyword arguments of paramiko's SSHClient.connect for SETTINGS."""
    paramiko = import_paramiko()
    s = settings
    key_filename = os.path.expanduser(s.key_filename) if s.key_filename else None
    kwargs: t.Dict[str, t.Any] = {
        "port": s.port,
        "username": s.user,
        "password": s.password,
        "passphrase": s.password if key_filename else None,
        "key_filename": key_filename,
        "look_for_keys": s.look_for_keys,
        "allow_agent": s.password is None,
        "timeout": s.connect_timeout,
        "banner_timeout": s.banner_timeout,
        "auth_timeout": s.connect_timeout,
    }
    if s.proxy_command:
        cmd = s.proxy_command.replace("%h", s.host).replace("%p", str(s.port)).replace("%r", s.user or "")
        kwargs["sock"] = paramiko.ProxyCommand(cmd)
    if not s.use_rsa_sha2_algorithms:
        kwargs["disabled_algorithms"] = {"pubkeys": list(RSA_SHA2), "keys": list(RSA_SHA2)}
    return kwargs


def new_client(settings: Settings) -> t.Any:
    """A paramiko SSHClient that knows the configured host keys and judges a missing one by SETTINGS."""
    paramiko = import_paramiko()

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            known_hosts.accept_missing_key(settings, client, hostname, key)

    client = paramiko.SSHClient()
    known_hosts.load_known_hosts(client, settings)
    client.set_missing_host_key_policy(_Policy())
    return client


def login(settings: Settings) -> t.Any:
    """A connected, logged-in paramiko SSHClient; SessionError with the kind of failure otherwise."""
    paramiko = import_paramiko()
    s = settings
    client = new_client(s)
    try:
        client.connect(s.host, **connect_kwargs(s))
    except SessionError:
        client.close()
        raise
    except paramiko.BadHostKeyException as e:
        client.close()
        raise SessionError("hostkey_mismatch", known_hosts.mismatch_message(s, e.expected_key, e.key)) from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise SessionError("auth", "login as %s failed: %s" % (s.user or "(default user)", e or type(e).__name__)) from None
    except (OSError, EOFError, paramiko.SSHException) as e:
        client.close()
        raise SessionError("unreachable", "%s: %s" % (type(e).__name__, e)) from None
    return client
