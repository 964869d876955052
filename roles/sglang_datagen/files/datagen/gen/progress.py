"""Progress of a generate run, as a small JSON file other processes read (private).

The running process rewrites the file every ``progress_interval`` seconds
(temp file + rename, so a reader never sees half of it). ``datagen status``
reads it; whether the writer is still alive is decided by its lock, not by
the file's age or its PID (PIDs get reused).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections import deque
from typing import Any, Deque, Dict, Optional, Tuple

_WINDOW_S = 30.0


class Progress:
    """Counters of one run and a sliding window for the rates."""

    def __init__(self, total: int, done_at_start: int, servers: Tuple[str, ...]) -> None:
        self.total = total
        self.done_at_start = done_at_start
        self.written = 0
        self.errors = 0
        self.retries = 0
        self.in_flight = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reasons: Dict[str, int] = {}
        self.state = "starting"
        self.message = ""
        self.started = time.time()
        self._mono0 = time.monotonic()
        self.servers: Dict[str, Dict[str, Any]] = {
            s: {"ready": False, "ok": 0, "errors": 0, "retries": 0, "last_error": None} for s in servers
        }
        # behind a router with generate.workers: how many of them serve, and why the others do not (gen/fleet.py);
        # None while nobody watches (no generate.workers) or before the first round
        self.workers_configured: Optional[int] = None
        self.workers_serving: Optional[int] = None
        self.workers_missing: Dict[str, str] = {}
        self._window: Deque[Tuple[float, int, int]] = deque()

    @property
    def done(self) -> int:
        return self.done_at_start + self.written

    def snapshot(self) -> Dict[str, Any]:
        now = time.monotonic()
        self._window.append((now, self.written, self.completion_tokens))
        while len(self._window) > 2 and now - self._window[0][0] > _WINDOW_S:
            self._window.popleft()
        t0, w0, k0 = self._window[0]
        span = now - t0
        if span < 0.5:  # too early for a window: rate since start
            span, w0, k0 = now - self._mono0, 0, 0
        req_s = (self.written - w0) / span if span > 0 else 0.0
        tok_s = (self.completion_tokens - k0) / span if span > 0 else 0.0
        remaining = max(0, self.total - self.done - self.errors)
        eta = remaining / req_s if req_s > 0 else None
        return {
            "state": self.state,
            "message": self.message,
            "pid": os.getpid(),
            "started_at": self.started,
            "updated_at": time.time(),
            "elapsed_s": round(now - self._mono0, 3),
            "total": self.total,
            "done": self.done,
            "done_at_start": self.done_at_start,
            "written": self.written,
            "errors": self.errors,
            "retries": self.retries,
            "in_flight": self.in_flight,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "req_s": round(req_s, 2),
            "tok_s": round(tok_s, 1),
            "eta_s": round(eta, 1) if eta is not None else None,
            "finish_reasons": dict(self.finish_reasons),
            "servers": self.servers,
            "workers_configured": self.workers_configured,
            "workers_serving": self.workers_serving,
            "workers_missing": dict(self.workers_missing),
        }


def summary_line(status: Dict[str, Any]) -> str:
    """One line for humans: ``generate: running 1200/200000 (0.6%) 5312 tok/s 41.3 req/s ETA 1h20m``."""
    total = status.get("total")
    done = status.get("done") or 0
    parts = [f"generate: {status.get('state')}"]
    if total:
        parts.append(f"{done}/{total} ({100.0 * done / total:.1f}%)")
    else:
        parts.append(f"{done} done")
    if status.get("tok_s") is not None:
        parts.append(f"{status['tok_s']:.0f} tok/s")
    if status.get("req_s") is not None:
        parts.append(f"{status['req_s']:.1f} req/s")
    eta = status.get("eta_s")
    if eta is not None and status.get("state") == "running":
        h, rem = divmod(int(eta), 3600)
        parts.append(f"ETA {h}h{rem // 60:02d}m" if h else f"ETA {rem // 60}m{rem % 60:02d}s")
    if status.get("errors"):
        parts.append(f"{status['errors']} errors")
    short = fewer_workers(status)
    if short:
        parts.append(short)
    if status.get("message"):
        parts.append(f"- {status['message']}")
    return " ".join(parts)


def fewer_workers(status: Dict[str, Any]) -> str:
    """``only 3/8 workers serving (not serving: URL, ...)`` while fewer serve than are configured, else ''."""
    configured, serving = status.get("workers_configured"), status.get("workers_serving")
    if configured is None or serving is None or serving >= configured:
        return ""
    missing = ", ".join(sorted(status.get("workers_missing") or {}))
    return f"only {serving}/{configured} workers serving (not serving: {missing})"


class RunLock:
    """One generate run per work directory: an exclusive ``flock`` held for the whole run."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self) -> Optional[int]:
        try:
            with open(self.path, encoding="ascii") as fh:
                return int(fh.read().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def lock_held(path: str) -> bool:
    """True while some process (this one included) holds the run lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
