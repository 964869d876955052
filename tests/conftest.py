"""Shared pytest set-up: the ``lab`` fixture (import paths come with the ``tests`` package: tests/__init__.py)."""

from __future__ import annotations

from typing import List

import pytest

from tests.support.lab import require_lab


@pytest.fixture(scope="module")
def lab() -> dict:
    """The lab's status, read once per test module; the test is skipped unless root and the lab is up
    (the one rule: tests/support/lab.py ``skip_reason``). A module that must restore something afterwards
    overrides it: ``def lab(lab): yield lab; restore_trainer()``."""
    return require_lab()


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """The ``lab_fleet`` tests last, every other test in its collected order.

    The whole suite runs on the one-node lab: several tests count processes per PVE host, and this one
    machine plays both lab hosts, so node 2's containers would show up in their counts. Only the fleet
    tests, at the end, bring node 2 up (tests/support/lab.py ``require_fleet``).
    """
    items.sort(key=lambda item: item.get_closest_marker("lab_fleet") is not None)
