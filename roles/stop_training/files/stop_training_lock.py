# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop_training role's run lock on the target (PRIVATE to the role).

The role runs this file's text with ``python3 -c`` inside the container (no file
transfer, standard library only, Python >= 3.9), so two runs of the role (two AWX
jobs, two operators) cannot interleave on one container.

One lock file holds the holder's identity as JSON (run id, controller host and
ansible-playbook PID, user, AWX job id, when it was taken, when it expires).
Every check-and-set happens under ``flock`` on a sibling guard file, so two
runs racing for a free or stale lock cannot both win. A lock is taken over only
when it is stale: past its expiry, or named by ``--break-run-id`` (the role
passes the run id of a holder whose ansible-playbook process is proven dead on
this same controller, i.e. a run that was killed part-way).

Usage (argv after ``-c``)::

    acquire PATH HOLDER_JSON WAIT_S EXPIRY_S [BREAK_RUN_ID]
    release PATH RUN_ID
    read PATH

Prints one JSON object. Exit codes: 0 done, 3 lock held by another run after the
bounded wait (the JSON names the holder), 2 bad usage.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_HELD = 3
POLL_S = 0.25


class LockError(Exception):
    """Bad input to the lock helper."""


def read_holder(path):
    """The holder recorded in ``path``, or None when there is none (or it is unreadable junk)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # A torn or foreign file: treat as a lock of unknown holder, expired at once,
        # so a crash while writing can never wedge the target for good.
        return {"run_id": "", "unknown": True, "expires_at": 0}
    return data if isinstance(data, dict) else {"run_id": "", "unknown": True, "expires_at": 0}


def stale_reason(holder, now, break_run_id):
    """Why ``holder`` may be taken over, or '' when it is live."""
    if holder.get("unknown"):
        return "unreadable lock file"
    if break_run_id and holder.get("run_id") == break_run_id:
        return "its ansible-playbook process (pid %s on %s) is gone" % (
            holder.get("controller_pid"),
            holder.get("controller"),
        )
    try:
        expires_at = float(holder.get("expires_at", 0))
    except (TypeError, ValueError):
        expires_at = 0.0
    if now >= expires_at:
        return "expired %d s ago" % int(now - expires_at)
    return ""


def describe(holder):
    """One line naming a holder for an operator."""
    if not holder:
        return "nobody"
    if holder.get("unknown"):
        return "an unreadable lock file"
    parts = ["run %s" % holder.get("run_id", "?")]
    if holder.get("awx_job_id"):
        parts.append("AWX job %s" % holder["awx_job_id"])
    parts.append(
        "by %s on controller %s (ansible-playbook pid %s)"
        % (holder.get("user", "?"), holder.get("controller", "?"), holder.get("controller_pid", "?"))
    )
    if holder.get("acquired_at_iso"):
        parts.append("since %s" % holder["acquired_at_iso"])
    return ", ".join(parts)


@contextlib.contextmanager
def guarded(path):
    """Hold flock on PATH.guard for one check-and-set (held for milliseconds, never across waits)."""
    fd = os.open(path + ".guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_holder(path, holder):
    """Atomically replace the lock file with ``holder``."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(holder, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def try_acquire(path, holder, expiry_s, break_run_id, now):
    """One check-and-set. Returns (result dict, held_by or None)."""
    with guarded(path):
        current = read_holder(path)
        taken_over = None
        if current is not None:
            if current.get("run_id") and current.get("run_id") == holder["run_id"]:
                return {"changed": False, "acquired": True, "holder": current, "reentered": True}, None
            reason = stale_reason(current, now, break_run_id)
            if not reason:
                return None, current
            taken_over = {"holder": current, "reason": reason}
        mine = dict(holder)
        mine["acquired_at"] = now
        mine["acquired_at_iso"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        mine["expires_at"] = now + expiry_s
        write_holder(path, mine)
        result = {"changed": True, "acquired": True, "holder": mine}
        if taken_over:
            result["taken_over"] = taken_over
        return result, None


def acquire(path, holder, wait_s, expiry_s, break_run_id="", clock=time.time, sleep=time.sleep,
            monotonic=time.monotonic):
    """Take the lock, waiting at most ``wait_s`` for another run to release it."""
    if not isinstance(holder, dict) or not holder.get("run_id"):
        raise LockError("HOLDER_JSON must be a JSON object with a non-empty run_id")
    if wait_s < 0 or expiry_s <= 0:
        raise LockError("WAIT_S must be >= 0 and EXPIRY_S > 0")
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    start = monotonic()
    deadline = start + wait_s
    held_by = None
    while True:
        result, held_by = try_acquire(path, holder, expiry_s, break_run_id, clock())
        if result is not None:
            result["waited"] = round(monotonic() - start, 2)
            if held_by is None and result.get("changed") and monotonic() - start > POLL_S:
                result["waited_for_other_run"] = True
            return EXIT_OK, result
        if monotonic() >= deadline:
            break
        sleep(min(POLL_S, max(0.0, deadline - monotonic())))
    return EXIT_HELD, {
        "changed": False,
        "acquired": False,
        "holder": held_by,
        "waited": round(monotonic() - start, 2),
        "msg": "lock %s is held by %s; waited %s s. If that run is dead, remove %s on the target"
        " (or wait until it expires)." % (path, describe(held_by), wait_s, path),
    }


def release(path, run_id):
    """Remove the lock if (and only if) this run holds it."""
    with guarded(path):
        current = read_holder(path)
        if current is None:
            return EXIT_OK, {"changed": False, "released": False, "msg": "no lock held"}
        if current.get("run_id") != run_id:
            return EXIT_OK, {
                "changed": False,
                "released": False,
                "holder": current,
                "msg": "lock belongs to %s; left alone" % describe(current),
            }
        os.unlink(path)
    return EXIT_OK, {"changed": True, "released": True}


def main(argv):
    """Dispatch argv; return (exit code, JSON-able result)."""
    try:
        if len(argv) >= 1 and argv[0] == "read" and len(argv) == 2:
            holder = read_holder(argv[1])
            return EXIT_OK, {"changed": False, "holder": holder, "description": describe(holder)}
        if len(argv) in (5, 6) and argv[0] == "acquire":
            holder = json.loads(argv[2])
            return acquire(argv[1], holder, float(argv[3]), float(argv[4]), argv[5] if len(argv) == 6 else "")
        if len(argv) == 3 and argv[0] == "release":
            return release(argv[1], argv[2])
    except (LockError, ValueError) as exc:
        return EXIT_USAGE, {"failed": True, "msg": str(exc)}
    return EXIT_USAGE, {"failed": True, "msg": "usage: acquire PATH HOLDER_JSON WAIT_S EXPIRY_S [BREAK_RUN_ID]"
                        " | release PATH RUN_ID | read PATH"}


if __name__ == "__main__":
    code, out = main(sys.argv[1:])
    print(json.dumps(out, sort_keys=True))
    sys.exit(code)
