"""The fault suite: every test here is marked ``faults``; the figures of the run go to
``$GPUOPS_FAULTS_FIGURES`` (default /tmp/gpuops-faults-figures.json) and the terminal summary."""

from __future__ import annotations

import os

import pytest

from tests.support.faults import Figures

HERE = os.path.dirname(os.path.abspath(__file__))

_FIGURES = Figures()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _FIGURES.faults:
        return
    _FIGURES.save()
    totals = _FIGURES.totals()
    terminalreporter.section("fault-injection figures")
    for key, value in totals.items():
        terminalreporter.write_line(f"{key}: {value}")
