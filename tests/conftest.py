"""Shared pytest set-up: the ``lab`` fixture, the lab stream's order and lanes (import paths and the lane come
with the ``tests`` package: tests/__init__.py, tests/support/paths.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.lab import require_lab, restore_trainer
from tests.support.paths import LAB_DIR, LANE

# Seconds each lab test file took in a measured run (tests/lab/README.md "Lanes"): the lab stream hands out the
# longest files first, so that no long file starts last and keeps one lane busy after the others are done.
# A file missing here counts as DEFAULT_FILE_SECONDS.
FILE_SECONDS = LAB_DIR / "file-seconds.json"
DEFAULT_FILE_SECONDS = 60.0


@pytest.fixture(scope="module")
def lab() -> dict:
    """The lab's status (this process's lane: tests/support/paths.py ``select_lane``), read once per test
    module; the test is skipped unless root and the lane is up (the one rule: tests/support/lab.py
    ``skip_reason``). A module that must restore something afterwards overrides it:
    ``def lab(lab): yield lab; restore_trainer()``."""
    return require_lab()


@pytest.fixture(scope="module")
def trainer_back_afterwards(lab):
    """The lab trainer running again after the module: its data half ran alone, on GPUs freed first
    (tests/support/datagen.py ``free_gpus``)."""
    yield lab
    restore_trainer()


def file_seconds(path: Path = FILE_SECONDS) -> Dict[str, float]:
    """The measured seconds per test file ({"tests/x/test_y.py": seconds}); {} when there is no table."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(name): float(seconds) for name, seconds in table.get("files", {}).items()}


def lab_order_key(is_fleet: bool, file_s: float, index: int) -> tuple:
    """Where a test goes in the run: the ``lab_fleet`` tests last (they bring a lane's second node up, and the
    other tests expect the one-node lane: several count processes per PVE host), then the longest file first,
    then the collected order (a file's tests stay together and in their order)."""
    return (is_fleet, -file_s, index)


def file_of(nodeid: str) -> str:
    """A test's file as the seconds table names it (its node id's path, relative to the checkout root)."""
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    seconds = file_seconds()

    def key(pair) -> tuple:
        index, item = pair
        return lab_order_key(item.get_closest_marker("lab_fleet") is not None,
                             seconds.get(file_of(item.nodeid), DEFAULT_FILE_SECONDS), index)

    items[:] = [item for _index, item in sorted(enumerate(items), key=key)]


# ------------------------------------------------ lanes under pytest-xdist (scripts/test's lab stream)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` that hands a lane its next file only when the lane holds at most one test it has not
    finished (xdist's default is two, and with tests of minutes a prefetched file can wait behind them while
    another lane idles). One is the least: a worker starts a test once it knows the next (module teardown)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneFileAheadScheduling(LoadFileScheduling):
        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return OneFileAheadScheduling(config, log)


# Where this run writes its own seconds per file (the table's shape), to refresh FILE_SECONDS from a real run.
FILE_SECONDS_OUT_ENV = "GPUOPS_LAB_FILE_SECONDS_OUT"
_file_seconds: Dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Every phase's duration, by file (on xdist's controller too: the workers' reports come through here)."""
    path = file_of(report.nodeid)
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


_session_start = time.monotonic()
_tests_run = 0
_lane_walls: Dict[int, dict] = {}


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    global _tests_run
    _tests_run += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get(FILE_SECONDS_OUT_ENV)
    if out and not hasattr(session.config, "workeroutput") and _file_seconds:
        Path(out).write_text(json.dumps({"files": {name: round(seconds, 1) for name, seconds in sorted(
            _file_seconds.items(), key=lambda kv: -kv[1])}}, indent=1) + "\n", encoding="utf-8")
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: tell the controller what its lane took
        workeroutput["lane"] = {"lane": LANE.index, "wall_s": round(time.monotonic() - _session_start, 1),
                                "tests": _tests_run}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    report = getattr(node, "workeroutput", {}).get("lane")
    if report:
        _lane_walls[report["lane"]] = report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _lane_walls:
        return
    terminalreporter.section("lanes")
    for index in sorted(_lane_walls):
        terminalreporter.write_line("lane %d: %.0f s wall, %d tests" % (
            index, _lane_walls[index]["wall_s"], _lane_walls[index]["tests"]))
