# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Bounded waiting: one monotonic deadline type for every wait in the collection, and the sampling loop
``gpu_free_wait`` waits with (:class:`Waiter`).

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass, field


class Deadline:
    """A point on the monotonic clock; wall-clock jumps cannot stretch a wait."""

    def __init__(self, timeout: float, clock: t.Callable[[], float] = time.monotonic) -> None:
        if timeout < 0:
            raise ValueError("timeout must be >= 0, got %r" % timeout)
        self._clock = clock
        self.started = clock()
        self.timeout = float(timeout)
        self.at = self.started + self.timeout

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.at

    def elapsed(self) -> float:
        return self._clock() - self.started

    def extend_to(self, at: float) -> None:
        """Move the deadline later (never earlier), e.g. while progress is seen."""
        if at > self.at:
            self.at = at
            self.timeout = self.at - self.started


class SampleCut(Exception):
    """Raised by a sample (or its judgement) the wait's own end cut short: the wait ends timed out on the last
    whole sample, not failed. Its message says what was cut."""


@dataclass
class WaitResult:
    free: bool
    first: t.Any  # a sample: anything with ``at`` (wall clock) and ``took`` (seconds), like _gpu.model.Sample
    last: t.Any
    samples: int
    elapsed: float
    history: list[dict] = field(default_factory=list)
    timed_out: bool = False
    cut: str = ""  # what the wait's end cut short (SampleCut's message), when it ended that way


def _history_entry(sample: t.Any, started: float, free: bool, counted: t.Mapping[int, int]) -> dict:
    return {"t": round(sample.at, 3), "elapsed": round(sample.at - started, 3), "took": round(sample.took, 3),
            "free": free, "counted_mib": dict(counted)}


class Waiter:
    """Samples every ``interval`` until ``stable_for`` consecutive free samples or ``timeout``."""

    def __init__(self, timeout: float, interval: float, delay: float = 0.0, stable_for: int = 1,
                 sleep: t.Callable[[float], None] = time.sleep, clock: t.Callable[[], float] = time.monotonic,
                 history_limit: int = 100) -> None:
        self.timeout, self.interval, self.delay, self.stable_for = timeout, interval, delay, stable_for
        self.sleep, self.clock, self.history_limit = sleep, clock, history_limit
        # progress so far, readable when a sample raises: a failure mid-wait still reports what it took
        self.deadline: t.Optional[Deadline] = None
        self.samples = 0

    def remaining(self) -> float:
        """Seconds left of ``timeout`` (all of it before the wait starts)."""
        return self.deadline.remaining() if self.deadline is not None else float(self.timeout)

    def elapsed(self) -> float:
        return self.deadline.elapsed() if self.deadline is not None else 0.0

    def wait(self, sample_fn: t.Callable[[], t.Any],
             free_fn: t.Callable[[t.Any], t.Tuple[bool, t.Mapping[int, int]]]) -> WaitResult:
        deadline = self.deadline = Deadline(self.timeout, clock=self.clock)  # delay counts within timeout, as in wait_for
        wall_start = time.time()
        if self.delay:
            self.sleep(min(self.delay, deadline.remaining()))
        streak = count = 0
        first: t.Any = None
        last: t.Any = None
        history: list[dict] = []
        while True:
            began = self.clock()
            try:
                sample = sample_fn()
                free, counted = free_fn(sample)
            except SampleCut as cut:
                if last is None:  # nothing whole to judge by: the cut is the wait's failure
                    raise
                return WaitResult(False, first, last, count, deadline.elapsed(), history, timed_out=True, cut=str(cut))
            count = self.samples = count + 1
            first, last = first or sample, sample
            sample.took = self.clock() - began  # backend calls and judgement: the next sample starts interval after
            streak = streak + 1 if free else 0
            history.append(_history_entry(sample, wall_start, free, counted))
            del history[:-self.history_limit]
            if streak >= self.stable_for:
                return WaitResult(True, first, sample, count, deadline.elapsed(), history)
            if deadline.expired():
                return WaitResult(False, first, sample, count, deadline.elapsed(), history, timed_out=True)
            # sleep from the end of the sample: a slow backend never turns into back-to-back calls
            self.sleep(min(self.interval, deadline.remaining()))


class CheckModeWaiter(Waiter):
    """Check mode: one sample, reported; never waits (the kubernetes.core no-op waiter idea)."""

    def __init__(self) -> None:
        super().__init__(timeout=0, interval=1)

    def wait(self, sample_fn, free_fn) -> WaitResult:
        start = self.clock()
        wall_start = time.time()
        sample = sample_fn()
        free, counted = free_fn(sample)
        return WaitResult(free, sample, sample, 1, self.clock() - start,
                          [_history_entry(sample, wall_start, free, counted)], timed_out=False)
