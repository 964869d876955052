"""Fixtures the lab suites share (the ``lab`` fixture itself is in tests/conftest.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.lab import reboot_hang_fault


@pytest.fixture()
def reboot_hang(lab: dict) -> Iterator:
    """The lab's reboot-hang fault on CT200 for one test; switched off and the lab restored afterwards."""
    with reboot_hang_fault(lab) as path:
        yield path
