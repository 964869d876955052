# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which files of a group differ on the node, for the ``put_files`` action plugin.

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. The group's wanted sha1 sums come from the controller, the node's from one
``find`` over the group's directories; a file is handed to ``copy`` only when its
sum or mode differs, or when the sum cannot be known here (a directory, a symbolic
mode), where ``copy`` decides as it always does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import typing as t
from dataclasses import dataclass

# one read of a source at a time: a model file may be large
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PutFile:
    """One file of the group: where it goes, its mode as given, and its text or its source on the controller."""

    dest: str
    mode: t.Any = None
    content: t.Optional[str] = None
    src: t.Optional[str] = None


def parse_files(raw: t.Any) -> t.Tuple[t.List[PutFile], t.List[str]]:
    """The group from the task's ``files`` option, and one sentence per entry that is not a valid file."""
    if not isinstance(raw, (list, tuple)):
        return [], ["files: expected a list of {dest, mode, content or src}, got %s" % type(raw).__name__]
    files: t.List[PutFile] = []
    errors: t.List[str] = []
    seen: t.Set[str] = set()
    for index, entry in enumerate(raw):
        where = "files[%d]" % index
        if not isinstance(entry, t.Mapping):
            errors.append("%s: expected a mapping, got %s" % (where, type(entry).__name__))
            continue
        unknown = sorted(set(entry) - {"dest", "mode", "content", "src"})
        dest = entry.get("dest")
        if unknown:
            errors.append("%s: unknown key(s) %s (a file has dest, mode, and content or src)" % (where, ", ".join(unknown)))
        elif not isinstance(dest, str) or not dest.startswith("/"):
            errors.append("%s: dest must be an absolute path on the node, got %s" % (where, json.dumps(str(dest))))
        elif dest in seen:
            errors.append("%s: dest %s is in the group twice" % (where, dest))
        elif ("content" in entry) == ("src" in entry):
            errors.append("%s (%s): give exactly one of content and src" % (where, dest))
        else:
            seen.add(dest)
            files.append(PutFile(dest=dest, mode=entry.get("mode"), content=_text(entry.get("content")),
                                 src=None if entry.get("src") is None else str(entry["src"])))
    return files, errors


def _text(content: t.Any) -> t.Optional[str]:
    """The text copy writes for CONTENT: a list or mapping goes as JSON, as ``ansible.builtin.copy`` does."""
    if content is None:
        return None
    if isinstance(content, (dict, list)):
        return json.dumps(content)
    return str(content)


def octal_mode(mode: t.Any) -> t.Optional[str]:
    """MODE as ``find`` reports it (``0644``), or None when only ``copy`` can tell (symbolic, unset).

    An int is the mode's value (YAML reads an unquoted 0644 as 420); a string is octal digits.
    """
    if isinstance(mode, bool):
        return None
    if isinstance(mode, int):
        return "%04o" % mode
    if isinstance(mode, str) and re.fullmatch(r"0?[0-7]{3,4}", mode.strip()):
        return "%04o" % int(mode.strip(), 8)
    return None


def content_sha1(content: str) -> str:
    return hashlib.sha1(content.encode("utf-8", "surrogateescape")).hexdigest()


def file_sha1(path: str) -> t.Optional[str]:
    """The sha1 of the controller file at PATH, or None for what is not a regular file (copy says the rest)."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_args(files: t.Sequence[PutFile]) -> t.Dict[str, t.Any]:
    """``ansible.builtin.find``'s options that list the group's files, and nothing else, with their sha1 sums."""
    dirs = sorted({os.path.dirname(f.dest) for f in files})
    names = sorted({os.path.basename(f.dest) for f in files})
    return {"paths": dirs, "patterns": ["^%s$" % re.escape(name) for name in names], "use_regex": True,
            "hidden": True, "get_checksum": True, "checksum_algorithm": "sha1"}


def to_write(files: t.Sequence[PutFile], want: t.Mapping[str, t.Optional[str]],
             found: t.Sequence[t.Mapping[str, t.Any]]) -> t.List[PutFile]:
    """The files whose node copy is missing or differs in content or mode from WANT (dest -> sha1 or None).

    FOUND is ``find``'s ``files``; a None sum or an unreadable mode always goes to copy.
    """
    have = {str(entry.get("path")): entry for entry in found}
    out = []
    for file in files:
        node = have.get(file.dest, {})
        mode = octal_mode(file.mode)
        if (want.get(file.dest) is None or node.get("checksum") != want[file.dest]
                or (file.mode is not None and (mode is None or node.get("mode") != mode))):
            out.append(file)
    return out
