# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What authenticates a login beyond its settings (key files, default keys, agent), as digests only."""

from __future__ import annotations

import hashlib
import os
import typing as t

if t.TYPE_CHECKING:
    from .settings import Settings

PUBLIC_KEY_STARTS = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-", "---- BEGIN SSH2 PUBLIC KEY", "-----BEGIN PUBLIC KEY")
# the keys paramiko's look_for_keys tries (paramiko.client.SSHClient's authentication)
DEFAULT_KEY_FILES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")


def key_file_problem(path: t.Optional[str]) -> t.Optional[str]:
    """Why the private key file PATH cannot be the login's key (missing, unreadable, a public key), or None.

    paramiko reports these while connecting, as errors that read like a host that cannot be reached."""
    if not path:
        return None
    full = os.path.expanduser(path)
    try:
        with open(full, "rb") as handle:
            head = handle.read(64).lstrip()
    except FileNotFoundError:
        return "ansible_ssh_private_key_file=%s does not exist on the controller" % path
    except IsADirectoryError:
        return "ansible_ssh_private_key_file=%s is a directory, not a key file" % path
    except OSError as exc:
        return "ansible_ssh_private_key_file=%s cannot be read on the controller (%s)" % (path, exc.strerror)
    if head.decode("ascii", "replace").startswith(PUBLIC_KEY_STARTS):
        private = full[:-4] if full.endswith(".pub") else "the file without .pub"
        return "ansible_ssh_private_key_file=%s is a public key; point it at the private key (%s)" % (path, private)
    return None


def file_digest(path: str) -> str:
    """sha256 of a file's content; a marker for a missing or unreadable one (then it cannot authenticate)."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError as e:
        return "unreadable:%s" % (e.errno,)


def credential_identity(settings: Settings, env: t.Optional[t.Mapping[str, str]] = None) -> t.Dict[str, t.Any]:
    """What authenticates a login with SETTINGS beyond the settings themselves (digests only)."""
    env = os.environ if env is None else env
    ident: t.Dict[str, t.Any] = {"euid": os.geteuid()}
    if settings.key_filename:
        ident["key"] = file_digest(settings.key_filename)
    if settings.look_for_keys:
        home = os.path.expanduser("~")
        ident["default_keys"] = {
            name: file_digest(os.path.join(home, d, name))
            for d in (".ssh", "ssh")
            for name in DEFAULT_KEY_FILES
            if os.path.exists(os.path.join(home, d, name))
        }
    if settings.password is None:  # the agent is only offered without a password (see login.connect_kwargs)
        ident["agent"] = env.get("SSH_AUTH_SOCK", "")
    return ident
