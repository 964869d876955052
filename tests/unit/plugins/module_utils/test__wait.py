"""Deadline: bounded, monotonic, extendable only forward."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline


class FakeClock:
    """A clock the test moves by hand (the unit under test is the arithmetic)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_remaining_counts_down_and_never_goes_negative():
    clock = FakeClock()
    deadline = Deadline(5, clock=clock)
    assert deadline.remaining() == 5
    clock.now += 2
    assert deadline.remaining() == 3
    assert not deadline.expired()
    clock.now += 10
    assert deadline.remaining() == 0
    assert deadline.expired()
    assert deadline.elapsed() == 12


def test_extend_moves_only_forward():
    clock = FakeClock()
    deadline = Deadline(5, clock=clock)
    deadline.extend_to(103)
    assert deadline.at == 105
    deadline.extend_to(110)
    assert deadline.at == 110
    assert deadline.timeout == 10


def test_negative_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        Deadline(-1)
