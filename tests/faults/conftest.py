"""The fault suite: every test here is marked ``faults``; the figures of the run go to
``$GPUOPS_FAULTS_FIGURES`` (default /tmp/gpuops-faults-figures.json) and the terminal summary."""

from __future__ import annotations

import json
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


def pytest_sessionfinish(session, exitstatus):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and _FIGURES.faults:  # an xdist worker: its figures go to the controller
        workeroutput["fault_figures"] = json.dumps(_FIGURES.as_dict())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    figures = getattr(node, "workeroutput", {}).get("fault_figures")
    if figures:
        _FIGURES.merge(json.loads(figures))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _FIGURES.faults:
        return
    _FIGURES.save()
    totals = _FIGURES.totals()
    terminalreporter.section("fault-injection figures")
    for key, value in totals.items():
        terminalreporter.write_line(f"{key}: {value}")
