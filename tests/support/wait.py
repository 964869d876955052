"""Bounded waits for tests: the lab's trainer harness has the one loop; this names its arguments for lab checks."""

from __future__ import annotations

from typing import Any, Callable

from trainer_harness import wait_for as _wait_for


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.3) -> Any:
    """PREDICATE's first truthy value, polled every INTERVAL s; AssertionError naming WHAT after TIMEOUT s."""
    return _wait_for(predicate, timeout, interval, what=what)
