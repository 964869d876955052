# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``secret_file``'s work: a random secret written to a file once, by whichever run gets there first.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

The secret is written to a private temporary file (``O_EXCL``, mode 0600) and linked to its name: a link
fails when the name exists, so two runs racing (two AWX slices) cannot make two secrets, and a reader never
sees a half-written one. Nothing here returns or prints the secret.
"""

from __future__ import annotations

import os
import secrets
import typing as t


def write_once(path: str, text: str) -> bool:
    """Put TEXT in PATH (mode 0600) unless PATH exists; True when this call made it."""
    tmp = "%s.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def ensure_secret(p: t.Mapping[str, t.Any], check_mode: bool = False) -> t.Dict[str, t.Any]:
    """``secret_file``'s runner: ``{changed, created, path}``; in check mode an absent secret is only reported."""
    path = p["path"]
    if os.path.exists(path):
        return {"changed": False, "created": False, "path": path}
    if check_mode:
        return {"changed": True, "created": False, "path": path}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        created = write_once(path, secrets.token_urlsafe(p["nbytes"]))
    except OSError as exc:
        return {"failed": True, "msg": "cannot create the secret file %s: %s" % (path, exc), "path": path}
    return {"changed": created, "created": created, "path": path}
