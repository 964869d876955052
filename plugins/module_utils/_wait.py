# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Bounded waiting: one monotonic deadline type for every wait in the collection.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).
"""

from __future__ import annotations

import time
import typing as t


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
