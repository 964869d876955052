# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One ladder at a time per container and selection: a flock held by the module, and its last result.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

Why in the module: killing ``ansible-playbook`` (or the AWX job) leaves the
module running on the target, still climbing its ladder; the role's own lock
is then taken over as stale and a re-run would climb a second ladder at once,
crediting its Ctrl-C with what the first ladder's SIGKILL did. The module's
``flock`` lives exactly as long as the module process (the kernel drops it
when the process dies, however it dies), so a second module waits for it
(bounded) or fails naming the holder, which the lock file describes.

Next to the lock, ``<key>.json`` holds the record of the last ladder: written
``running`` before its first signal and its outcome when it ends, so the next
run reports what happened even when nobody was watching (a record still
``running`` whose process is gone is a ladder that was killed part-way).

The lock files, the bounded ``flock`` and the atomic records are ``_lock``'s
(shared with the ``run_lock`` module); this file adds what is the ladder's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import (
    LockError,
    flock_within,
    open_lock_file,
    pid_alive,
    read_record,
    write_record,
)


class RunLockError(Exception):
    """The lock could not be taken (held past the wait, or its directory unusable); the message says why."""


def lock_key(selection: t.Mapping[str, t.Any]) -> str:
    """A file-name-safe key for one container and selection (same options, same key)."""
    container = selection.get("container")
    digest = hashlib.sha256(json.dumps(dict(selection), sort_keys=True, default=str).encode()).hexdigest()[:16]
    return "training_stop-%s-%s" % ("ct%s" % container if container is not None else "local", digest)


def describe_holder(holder: t.Mapping[str, t.Any] | None, now: float) -> str:
    if not holder:
        return "a training_stop run whose record is not readable yet"
    return "training_stop pid %s (started %s, %ds ago, selection %s)" % (
        holder.get("pid", "?"), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.get("started", 0))),
        max(0, int(now - holder.get("started", now))), holder.get("selection", "?"))


class RunLock:
    """``flock`` on ``<dir>/<key>.lock`` held for the module's life; ``<key>.json`` is the last ladder's record."""

    def __init__(self, directory: str, key: str, clock: t.Callable[[], float] = time.monotonic,
                 wall: t.Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.lock_path = os.path.join(directory, key + ".lock")
        self.state_path = os.path.join(directory, key + ".json")
        self.clock = clock
        self.wall = wall
        self.fd: int | None = None
        self.waited = 0.0
        self.waited_for: str = ""  # who held it when we started waiting

    def holder(self) -> dict | None:
        return read_record(self.lock_path)

    def acquire(self, timeout: float, me: t.Mapping[str, t.Any]) -> None:
        """Take the lock, waiting at most ``timeout`` seconds; RunLockError names the holder."""
        try:
            fd = open_lock_file(self.lock_path, "lock_dir")
        except LockError as exc:
            raise RunLockError(str(exc)) from None

        def note_holder() -> None:  # who held it when we started waiting
            self.waited_for = describe_holder(self.holder(), self.wall())

        started = self.clock()
        try:
            taken = flock_within(fd, timeout, on_busy=note_holder, clock=self.clock)
        except OSError as exc:
            os.close(fd)
            raise RunLockError("lock_dir: cannot lock %s (%s)" % (self.lock_path, exc.strerror or exc)) from None
        if not taken:
            os.close(fd)
            raise RunLockError(
                "another ladder is still running for this selection: %s; waited %gs (lock_timeout). Nothing was "
                "signalled by this run. Wait for it, or raise lock_timeout." % (
                    describe_holder(self.holder(), self.wall()), timeout))
        # only time spent behind another run counts: taking a free lock is not waiting, however slow the host
        self.waited = self.clock() - started if self.waited_for else 0.0
        self.fd = fd
        # the holder's description, for whoever waits next (written in place: only the holder writes it)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(dict(me), sort_keys=True, default=str).encode(), 0)

    def previous(self) -> dict | None:
        """The last ladder's record; one still ``running`` whose process is gone was killed part-way."""
        record = read_record(self.state_path)
        if record and record.get("state") == "running" and not pid_alive(record.get("pid")):
            record["state"] = "interrupted"
        return record

    def record(self, value: t.Mapping[str, t.Any]) -> None:
        write_record(self.state_path, value)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops the flock
            self.fd = None


# A ladder that finishes while nobody is watching: it runs on when its connection dies
# (shield_from_hangup), and its record says what it did (outcome_fields) for the next run to
# report (describe_previous). stop.job calls all three.

MAX_RECORDED = 20  # processes named in a record (the count is always complete)


def shield_from_hangup(received: t.List[str]) -> None:
    """Keep the module climbing when the connection that started it dies; append caught signals to RECEIVED.

    A dead SSH link or a killed ``pct exec`` sends nothing to a command run
    without a terminal, but with a pty (``ansible_pct_ssh_pty``, a terminal)
    the hangup sends SIGHUP, whose default action would end the module between
    two rungs and leave the job half-signalled (a SIGTERM sent and no SIGCONT,
    no SIGKILL); and a write to the closed stdout raises SIGPIPE. Both are
    caught and noted, not ignored: a handler is reset to the default at exec,
    so the programs the ladder runs (tmux) behave as usual. The ladder then
    ends on its own bounds and records its outcome for the next run.
    """

    def note(signum: int, frame: t.Any) -> None:
        received.append(signal.Signals(signum).name)

    for signum in (signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, note)


def outcome_fields(selected: t.Sequence[t.Mapping[str, t.Any]], rungs: t.Sequence[t.Mapping[str, t.Any]],
                   stopped_by: t.Optional[str], hangups: t.Sequence[str]) -> dict:
    """What the record keeps of a finished ladder: what it stopped, with which rungs, and whether it lost its caller."""
    return {
        "stopped": [{"pid": p["pid"], "cmdline": str(p.get("cmdline", ""))[:200]} for p in selected[:MAX_RECORDED]],
        "stopped_count": len(selected),
        "rungs": [{"signal": r.get("signal"), "via": r.get("via"), "sent_at": r.get("sent_at"),
                   "exited": len(r.get("exited") or [])} for r in rungs],
        "stopped_by": stopped_by,
        "hangups": sorted(set(hangups)),
    }


def describe_previous(record: t.Mapping[str, t.Any]) -> str:
    """One line for a re-run: what the last ladder for this selection did, by which rung, and when."""

    def when(key: str) -> str:
        value = record.get(key)
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value)) if isinstance(value, (int, float)) else "?"

    who = "training_stop pid %s, started %s" % (record.get("pid", "?"), when("started"))
    if record.get("state") == "interrupted":
        return "the last ladder for this selection (%s) was interrupted before it finished" % who
    if record.get("state") == "running":
        return "the last ladder for this selection (%s) is still running" % who
    count = record.get("stopped_count", len(record.get("selected") or []))
    names = ", ".join("pid %s (%s)" % (p.get("pid"), p.get("cmdline", "")[:60]) for p in (record.get("stopped") or [])[:3])
    what = "%d process(es)%s" % (count, ": " + names + (" ..." if count > 3 else "") if names else "")
    lost = " (its connection hung up during the ladder: %s; it finished on its own)" % ", ".join(record["hangups"]) \
        if record.get("hangups") else ""
    if record.get("stopped_by"):
        return "the last ladder for this selection (%s) stopped the job with %s at %s, %s%s" % (
            who, record["stopped_by"], when("finished"), what, lost)
    return "the last ladder for this selection (%s) ended at %s: %s%s" % (
        who, when("finished"), record.get("msg") or "nothing was left to stop", lost)
