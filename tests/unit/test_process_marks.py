"""The ``processes`` mark says which unit test files start real processes, so that ``pytest -m "not processes"
tests/unit`` runs only the pure ones: every file that starts a process carries it, and no other file does.

What counts as starting one is read from the source (tests/support/process_starts.py): the standard library's
process starters, directly or through the checkout's own helpers and conftest fixtures.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.paths import TESTS
from tests.support.process_starts import has_processes_mark, is_starter, process_starts

UNIT = TESTS / "unit"
TEST_FILES = sorted(UNIT.rglob("test_*.py"))


def name_of(path: Path) -> str:
    return str(path.relative_to(TESTS.parent))


def test_files_that_start_processes_are_marked_and_only_they():
    unmarked, needless = [], []
    for path in TEST_FILES:
        starts, marked = process_starts(path), has_processes_mark(path)
        if starts and not marked:
            unmarked.append("%s (uses %s)" % (name_of(path), ", ".join(starts[:3])))
        elif marked and not starts:
            needless.append(name_of(path))
    assert not unmarked, "start processes without `pytestmark = pytest.mark.processes`:\n  " + "\n  ".join(unmarked)
    assert not needless, "marked `processes` but start none:\n  " + "\n  ".join(needless)


@pytest.mark.parametrize("name, expected", [
    ("subprocess.run", True),
    ("subprocess.Popen", True),
    ("os.fork", True),
    ("os.execvp", True),
    ("multiprocessing.Process", True),
    ("subprocess.PIPE", False),
    ("os.getpid", False),
    ("os.path.exists", False),
])
def test_starters_are_the_calls_that_start_a_process(name, expected):
    assert is_starter(name) is expected


def write_test(folder: Path, source: str) -> Path:
    path = folder / "test_probe.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.mark.parametrize("source, expected", [
    ("import subprocess\ndef test_x():\n    subprocess.run(['true'])\n", ["subprocess.run"]),
    ("from subprocess import Popen as P\ndef test_x():\n    P(['true'])\n", ["subprocess.Popen"]),
    ("import os\ndef test_x():\n    os.fork()\n", ["os.fork"]),
    # through a support helper that starts the process itself
    ("from tests.support.module import run_module\ndef test_x():\n    run_module('x', {})\n",
     ["tests.support.module.run_module"]),
    # through a class of the lab's harness: one of its methods runs tmux
    ("from trainer_harness import Tmux\ndef test_x(tmp_path):\n    Tmux(str(tmp_path))\n", ["trainer_harness.Tmux"]),
    # a helper of the same module that does, and a constant of subprocess that does not
    ("import subprocess\ndef spawn():\n    return subprocess.Popen(['sleep', '1'])\n"
     "def test_x():\n    spawn().wait()\n", ["subprocess.Popen", "PROBE.test_probe.spawn"]),
    ("import subprocess\nimport os\ndef test_x():\n    assert subprocess.PIPE and os.getpid()\n", []),
    # pure helpers of the same support modules
    ("from tests.support.wait import wait_for\nfrom trainer_harness import latest_checkpoint\n"
     "def test_x(tmp_path):\n    wait_for(lambda: latest_checkpoint(str(tmp_path)) or 1, 1, 'x')\n", []),
])
def test_process_starts_follows_imports_and_helpers(tmp_path, source, expected):
    path = write_test(tmp_path, source)
    assert process_starts(path, top=tmp_path) == [name.replace("PROBE", tmp_path.name) for name in expected]


def test_a_conftest_fixture_that_starts_processes_counts_for_the_tests_that_ask_for_it(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import subprocess
        import pytest

        @pytest.fixture
        def server():
            proc = subprocess.Popen(["sleep", "60"])
            yield proc
            proc.kill()
    """), encoding="utf-8")
    asks = write_test(tmp_path, "def test_x(server):\n    assert server\n")
    assert process_starts(asks, top=tmp_path) == ["%s.conftest.server" % tmp_path.name]
    asks.write_text("def test_x(tmp_path):\n    assert tmp_path\n", encoding="utf-8")
    assert process_starts(asks, top=tmp_path) == []


@pytest.mark.parametrize("source, expected", [
    ("import pytest\npytestmark = pytest.mark.processes\n", True),
    ("import pytest\npytestmark = [pytest.mark.timeout(60), pytest.mark.processes]\n", True),
    ("import pytest\npytestmark = pytest.mark.timeout(60)\n", False),
    ("import pytest\n@pytest.mark.processes\ndef test_x():\n    pass\n", False),
])
def test_the_mark_is_read_from_the_module_s_pytestmark(tmp_path, source, expected):
    assert has_processes_mark(write_test(tmp_path, source)) is expected
