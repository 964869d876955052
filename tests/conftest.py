"""Shared pytest set-up: the ``lab`` fixture (import paths come with the ``tests`` package: tests/__init__.py)."""

from __future__ import annotations

import pytest

from tests.support.lab import require_lab


@pytest.fixture(scope="module")
def lab() -> dict:
    """The lab's status, read once per test module; the test is skipped unless root and the lab is up
    (the one rule: tests/support/lab.py ``skip_reason``). A module that must restore something afterwards
    overrides it: ``def lab(lab): yield lab; restore_trainer()``."""
    return require_lab()
