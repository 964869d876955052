"""Fixtures the lab suites share (the ``lab`` fixture itself is in tests/conftest.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.lab import MAIN_CT, NODE2_CT, reboot_hang_fault, require_fleet, restore_trainer


@pytest.fixture()
def reboot_hang(lab: dict) -> Iterator:
    """The lab's reboot-hang fault on CT200 for one test; switched off and the lab restored afterwards."""
    with reboot_hang_fault(lab) as path:
        yield path


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict]:
    """The two-node lab's status (tests/support/lab.py ``require_fleet``: brought up when the run owns the lab,
    skipped with the reason otherwise); afterwards both nodes as the other suites expect them: the graceful
    trainers running on CT200 and CT210."""
    yield require_fleet()
    for vmid in (MAIN_CT, NODE2_CT):
        restore_trainer(vmid)
