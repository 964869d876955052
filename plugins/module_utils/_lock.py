# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Locks on a target: the one place for lock files, ``flock`` with a bounded wait, and run leases.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, Python >= 3.9).

Two kinds of lock are built from the same parts here:

- a *held* lock (:func:`flock_within`): ``flock`` on an open file, dropped by the
  kernel when the holding process dies, however it dies. ``_stop.ladder_lock`` uses it for
  one ``training_stop`` ladder at a time;
- a *lease* (:func:`acquire`, :func:`release`, :func:`read`): a JSON file naming the
  run that holds it, which outlives any one process, so a play can take it in one
  task and release it in a later one (the ``run_lock`` module). Every check-and-set
  of a lease happens under a held lock on a sibling ``.guard`` file (held for
  milliseconds, never across a wait), so two runs racing for a free or stale lease
  cannot both win. A lease is taken over only when it is stale: past its expiry,
  unreadable (a crash while writing must never wedge the target for good), or named
  by ``take_over`` (the controller proved that run's process gone).

Whether a holder's controller process is gone can only be judged on the controller
that started it: :func:`controller_pid`, :func:`controller_alive` and
:func:`run_to_take_over` are the pure parts the ``run_lock`` action plugin uses there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_process_light, read_starttime
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

POLL_S = 0.2
# A guard is held for one read-and-replace of a small file; this bound only stops a wedged filesystem
# from hanging the module for good.
GUARD_TIMEOUT_S = 30.0
# What an unreadable lease file counts as: a holder nobody can name, expired at once.
UNREADABLE: t.Dict[str, t.Any] = {"run_id": "", "unknown": True, "expires_at": 0}


class LockError(Exception):
    """Bad input, or a lock path that cannot be used; the message names the option and the fix."""


class LockHeld(LockError):
    """Another run held the lease for the whole bounded wait."""

    def __init__(self, msg: str, holder: t.Mapping[str, t.Any] | None, waited: float) -> None:
        super().__init__(msg)
        self.holder = dict(holder) if holder else None
        self.waited = waited


# ------------------------------------------------------------------ files and flock

def read_record(path: str, torn: t.Mapping[str, t.Any] | None = None) -> dict | None:
    """The JSON object in ``path``; None when there is no file, a copy of ``torn`` when it is not a JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return dict(torn) if torn is not None else None
    if not isinstance(value, dict):
        return dict(torn) if torn is not None else None
    return value


def write_record(path: str, value: t.Mapping[str, t.Any]) -> None:
    """Replace ``path`` atomically (tmp + fsync + rename), so a reader never sees half a record."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(dict(value), handle, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def pid_alive(pid: t.Any, proc_root: str = "/proc") -> bool:
    """Whether a process with this PID exists (any process: see :func:`controller_alive` for identity)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and os.path.exists("%s/%d" % (proc_root, pid))


def flock_within(fd: int, timeout: float, on_busy: t.Callable[[], None] | None = None,
                 poll: float = POLL_S, clock: t.Callable[[], float] = time.monotonic) -> bool:
    """Take ``flock(LOCK_EX)`` on ``fd``, waiting at most ``timeout`` seconds.

    True when taken, False when another process held it for the whole wait;
    ``on_busy`` runs once, the first time it is found held (to note who holds it).
    Any error other than "held" is raised (OSError).
    """
    deadline = Deadline(timeout, clock=clock)
    noted = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if on_busy is not None and not noted:
            noted = True
            on_busy()
        if deadline.expired():
            return False
        time.sleep(min(poll, max(0.01, deadline.remaining())))


def open_lock_file(path: str, option: str) -> int:
    """Open (creating it and its directory) a file to ``flock``; LockError names ``option`` when it cannot be."""
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LockError("%s: cannot create %s (%s); give a writable directory (the module runs as uid %d)"
                        % (option, path, exc.strerror or exc, os.geteuid())) from None


@contextlib.contextmanager
def guarded(path: str, option: str = "path", timeout: float = GUARD_TIMEOUT_S) -> t.Iterator[None]:
    """Hold ``flock`` on ``<path>.guard`` for one check-and-set of the lease at ``path``."""
    fd = open_lock_file(path + ".guard", option)
    try:
        if not flock_within(fd, timeout):
            raise LockError("%s: %s.guard stayed locked for %gs; a process is stuck holding it (fuser %s.guard)"
                            % (option, path, timeout, path))
        yield
    finally:
        os.close(fd)  # drops the flock


# ------------------------------------------------------------------ leases: pure judgements

def describe(holder: t.Mapping[str, t.Any] | None) -> str:
    """One line naming a lease's holder for an operator."""
    if not holder:
        return "nobody"
    if holder.get("unknown"):
        return "an unreadable lock file"
    parts = ["run %s" % holder.get("run_id", "?")]
    if holder.get("awx_job_id"):
        parts.append("AWX job %s" % holder["awx_job_id"])
    parts.append("by %s on controller %s (ansible-playbook pid %s)"
                 % (holder.get("user", "?"), holder.get("controller", "?"), holder.get("controller_pid", "?")))
    if holder.get("acquired_at_iso"):
        parts.append("since %s" % holder["acquired_at_iso"])
    return ", ".join(parts)


def stale_reason(holder: t.Mapping[str, t.Any], now: float, take_over: str = "") -> str:
    """Why ``holder`` may be taken over, or '' while it is live."""
    if holder.get("unknown"):
        return "unreadable lock file"
    if take_over and holder.get("run_id") == take_over:
        return "its ansible-playbook process (pid %s on %s) is gone" % (
            holder.get("controller_pid"), holder.get("controller"))
    try:
        expires_at = float(holder.get("expires_at", 0))
    except (TypeError, ValueError):
        expires_at = 0.0
    if now >= expires_at:
        return "expired %d s ago" % int(now - expires_at)
    return ""


def new_holder(run_id: str, owner: t.Mapping[str, t.Any], now: float, expiry: float) -> dict:
    """The record a run writes when it takes the lease."""
    mine = dict(owner)
    mine.update(run_id=run_id, acquired_at=now, acquired_at_iso=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                expires_at=now + expiry)
    return mine


def check_inputs(run_id: str, wait: float, expiry: float) -> None:
    if not run_id:
        raise LockError("run_id: must be a non-empty string naming this run")
    if wait < 0:
        raise LockError("timeout: must be >= 0 seconds, got %r" % wait)
    if expiry <= 0:
        raise LockError("expiry: must be > 0 seconds, got %r" % expiry)


# ------------------------------------------------------------------ leases: on the target

def try_acquire(path: str, run_id: str, owner: t.Mapping[str, t.Any], expiry: float, take_over: str, now: float,
                check_mode: bool = False) -> tuple[dict | None, dict | None]:
    """One check-and-set: (result, None) when this run holds the lease now, (None, holder) while another does."""
    with guarded(path):
        current = read_record(path, torn=UNREADABLE)
        taken_over = None
        if current is not None:
            if current.get("run_id") and current.get("run_id") == run_id:
                return {"changed": False, "acquired": not check_mode, "holder": current, "reentered": True}, None
            reason = stale_reason(current, now, take_over)
            if not reason:
                return None, current
            taken_over = {"holder": current, "reason": reason}
        mine = new_holder(run_id, owner, now, expiry)
        if not check_mode:
            write_record(path, mine)
        result: dict = {"changed": True, "acquired": not check_mode, "holder": mine}
        if taken_over:
            result["taken_over"] = taken_over
        return result, None


def acquire(path: str, run_id: str, owner: t.Mapping[str, t.Any], wait: float, expiry: float, take_over: str = "",
            check_mode: bool = False, clock: t.Callable[[], float] = time.time,
            monotonic: t.Callable[[], float] = time.monotonic) -> dict:
    """Take the lease at ``path`` for ``run_id``, waiting at most ``wait`` seconds for another run to release it.

    Returns the result (``acquired``, ``holder``, ``waited``, and ``taken_over`` or ``reentered``);
    raises LockHeld naming the holder after the wait. In check mode nothing is written and nothing
    waited for: the result says what a real run would do (``acquired`` stays false).
    """
    check_inputs(run_id, wait, expiry)
    deadline = Deadline(wait, clock=monotonic)
    held_before = False  # only time spent behind another run is waiting; a slow free take is not
    while True:
        result, held_by = try_acquire(path, run_id, owner, expiry, take_over, clock(), check_mode)
        if result is not None:
            result["waited"] = round(deadline.elapsed(), 2) if held_before else 0.0
            if result["changed"] and held_before:
                result["waited_for_other_run"] = True
            return result
        held_before = True
        if check_mode:
            msg = "lock %s is held by %s; a real run would wait up to %g s for it" % (path, describe(held_by), wait)
            return {"changed": False, "acquired": False, "holder": held_by, "waited": 0.0, "would_wait": True,
                    "description": describe(held_by), "msg": msg}
        if deadline.expired():
            break
        time.sleep(min(POLL_S, max(0.01, deadline.remaining())))
    raise LockHeld("lock %s is held by %s; waited %g s. If that run is dead, remove %s on the target"
                   " (or wait until it expires)." % (path, describe(held_by), wait, path),
                   held_by, round(deadline.elapsed(), 2))


def release(path: str, run_id: str, check_mode: bool = False) -> dict:
    """Remove the lease if, and only if, ``run_id`` holds it; another run's lease is left alone."""
    if not run_id:
        raise LockError("run_id: must be a non-empty string naming the run whose lock to release")
    with guarded(path):
        current = read_record(path, torn=UNREADABLE)
        if current is None:
            return {"changed": False, "released": False, "msg": "no lock held"}
        if current.get("run_id") != run_id:
            return {"changed": False, "released": False, "holder": current,
                    "msg": "lock belongs to %s; left alone" % describe(current)}
        if not check_mode:
            os.unlink(path)
    return {"changed": True, "released": not check_mode, "holder": current}


def read(path: str) -> dict:
    """The current holder (None when free) and its description; changes nothing and takes no guard."""
    holder = read_record(path, torn=UNREADABLE)
    return {"changed": False, "holder": holder, "description": describe(holder)}


# ------------------------------------------------------------------ on the controller

def controller_pid(pid: int, proc_root: str = "/proc") -> int:
    """The controller's main process, seen from one of its workers ``pid`` (0 when it cannot be read).

    ansible-playbook (or ansible, or ansible-runner's ansible-playbook) forks its
    workers, so they keep its command line: the main process is the top of the
    chain of ancestors with the same command line as ``pid``.
    """
    info = read_process_light(pid, proc_root)
    if info is None:
        return 0
    top = info
    for _step in range(64):
        parent = read_process_light(top.ppid, proc_root) if top.ppid > 1 else None
        if parent is None or parent.cmdline != info.cmdline:
            break
        top = parent
    return top.pid


def controller_identity(pid: int, host: str, proc_root: str = "/proc") -> dict:
    """What a lease records about the controller process that holds it (pid + start time name it for good)."""
    main = controller_pid(pid, proc_root)
    return {"controller": host, "controller_pid": main,
            "controller_started": read_starttime(main, proc_root) if main else None}


def controller_alive(holder: t.Mapping[str, t.Any], proc_root: str = "/proc") -> bool:
    """Whether the holder's controller process (on this controller) still runs.

    With its recorded start time this is exact (a reused PID is another process); a
    holder recorded without one counts as alive while a process of that PID runs
    anything called ansible. Unparsable PIDs count as alive: never take over on doubt.
    """
    try:
        pid = int(holder.get("controller_pid") or 0)
    except (TypeError, ValueError):
        return True
    if pid <= 0:
        return True
    started = holder.get("controller_started")
    if isinstance(started, int) and not isinstance(started, bool):
        return read_starttime(pid, proc_root) == started
    info = read_process_light(pid, proc_root)
    return info is not None and any("ansible" in arg for arg in info.cmdline)


def run_to_take_over(holder: t.Mapping[str, t.Any] | None, me: t.Mapping[str, t.Any],
                     alive: t.Callable[[t.Mapping[str, t.Any]], bool]) -> str:
    """The run id of a holder that this controller proves dead (a run killed part-way), else ''.

    Only a holder started on this same controller (host name) and by another run
    can be judged here; ``alive`` is :func:`controller_alive` outside tests.
    """
    if not holder or holder.get("unknown"):
        return ""
    if holder.get("controller", "") != me.get("controller") or holder.get("run_id", "") in ("", me.get("run_id")):
        return ""
    try:
        if int(holder.get("controller_pid") or 0) <= 0:
            return ""
    except (TypeError, ValueError):
        return ""
    return "" if alive(holder) else str(holder["run_id"])


def new_run_id(controller_pid_: int, now: float, nonce: int) -> str:
    """A run id that says which controller process took the lock and when (the nonce keeps it unique)."""
    return "%d-%s-%06d" % (controller_pid_, time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)), nonce % 1000000)
