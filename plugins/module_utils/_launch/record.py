# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The launch record: what ``training_stop`` stopped, so that ``training_start`` can start it again.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

One JSON file per tmux session, ``<record_dir>/<session>.json``, root-only (0600 in
a 0700 directory), written atomically. It holds the launcher's argv, working
directory and user, its tmux session and window, an allow-listed part of its
environment (never a name that looks like a secret, whatever the list says), the
last step line, the newest whole checkpoint, and when and how it was stopped.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tempfile
import typing as t

RECORD_VERSION = 1
DEFAULT_RECORD_DIR = "/var/lib/gpuops/launch"
# What a relaunch needs to find the same GPUs, peers and Python; nothing else of the job's environment.
ENV_ALLOW = ("CUDA_VISIBLE_DEVICES", "NCCL_*", "MASTER_*", "OMP_NUM_THREADS", "PYTHONPATH", "PATH", "VIRTUAL_ENV")
# Checked after the allow-list and case-insensitively, so no list (the role's extra names included) lets one through.
SECRET_PATTERNS = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
BY_HAND = "give the command by hand instead with argv, cwd and user"


class RecordError(Exception):
    """A launch record is missing, unreadable or for another session; the message says what gives the command."""


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


def allowed_env(environ: t.Mapping[str, str], extra: t.Sequence[str] = ()) -> dict[str, str]:
    """The part of ``environ`` the allow-list (plus ``extra`` names or patterns) names, without secret-like names."""
    patterns = tuple(ENV_ALLOW) + tuple(extra)
    return {name: value for name, value in sorted(environ.items())
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns) and not looks_secret(name)}


def record_path(record_dir: str, session: str) -> str:
    """``<record_dir>/<session>.json``; characters a file name should not hold become ``_`` (the record keeps the name)."""
    return os.path.join(record_dir, _UNSAFE_NAME.sub("_", session) + ".json")


def build_record(*, session: str, window: str, argv: t.Sequence[str], cwd: str, user: str, uid: int | None,
                 env: t.Mapping[str, str], step_line: str, step: int | None, checkpoint: dict | None,
                 checkpoint_skipped: t.Sequence[dict], stopped_at: float, stopped_by: str | None) -> dict[str, t.Any]:
    return {
        "version": RECORD_VERSION, "tmux_session": session, "tmux_window": window,
        "argv": list(argv), "cwd": cwd, "user": user, "uid": uid,
        "env": {name: value for name, value in env.items() if not looks_secret(name)},
        "step_line": step_line, "step": step,
        "checkpoint": checkpoint, "checkpoint_skipped": list(checkpoint_skipped),
        "stopped_at": stopped_at, "stopped_by": stopped_by,
    }


def write_record(path: str, record: t.Mapping[str, t.Any]) -> None:
    """Write ``record`` to ``path`` atomically (temporary file, fsync, rename), readable by root only."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".launch-", suffix=".tmp", dir=directory)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def record_file_problem(path: str, owner: int, mode: int, euid: int) -> str:
    """Why a record file must not be trusted ('' when it may): its argv runs as its user, often root, so a record
    that someone else can write (or that belongs to someone else) would run their command."""
    if owner not in (0, euid):
        return "the launch record %s belongs to uid %d, not root: refusing to run the command it holds" % (path, owner)
    if mode & 0o022:
        return ("the launch record %s is writable by group or others (mode %04o): refusing to run the command it holds;"
                " chmod 600 it after checking it" % (path, mode & 0o7777))
    return ""


def check_record(record: t.Mapping[str, t.Any], path: str) -> None:
    """The fields a relaunch needs are there and of the right type (argv is checked by the reader)."""
    if record.get("version", RECORD_VERSION) != RECORD_VERSION:
        raise RecordError("the launch record %s has version %r; this collection reads version %d; %s" % (
            path, record.get("version"), RECORD_VERSION, BY_HAND))
    for key in ("tmux_session", "cwd", "user"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise RecordError("the launch record %s has no %s; %s" % (path, key, BY_HAND))
    env = record.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RecordError("the launch record %s: env is not a mapping of names to strings; %s" % (path, BY_HAND))


def read_record(path: str, session: str | None = None) -> dict[str, t.Any]:
    """The record at ``path``, checked; RecordError when there is none, it is not root's (or is writable by others),
    it does not parse, lacks what a relaunch needs, or is for another session than ``session``."""
    by_hand = BY_HAND
    try:
        st = os.stat(path)
    except OSError:
        st = None  # opening it below says what is wrong with the path
    if st is not None:
        problem = record_file_problem(path, st.st_uid, st.st_mode, os.geteuid())
        if problem:
            raise RecordError(problem)
    try:
        with open(path) as handle:
            record = json.load(handle)
    except FileNotFoundError:
        raise RecordError("no launch record at %s: the stop half writes one when it stops a job in a tmux session; "
                          "%s" % (path, by_hand)) from None
    except (OSError, ValueError) as exc:
        raise RecordError("cannot read the launch record %s: %s; %s" % (path, exc, by_hand)) from None
    if not isinstance(record, dict) or not isinstance(record.get("argv"), list) or not record["argv"] \
            or not all(isinstance(arg, str) for arg in record["argv"]):
        raise RecordError("the launch record %s holds no argv; %s" % (path, by_hand))
    check_record(record, path)
    if session is not None and record.get("tmux_session") != session:
        raise RecordError("the launch record %s is for tmux session %r, not %r; %s" % (
            path, record.get("tmux_session"), session, by_hand))
    return record
