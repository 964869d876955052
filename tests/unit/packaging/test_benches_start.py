"""Every benchmark under tests/bench starts: it imports and answers ``--help``.

Benchmarks are not collected by pytest (they measure, they do not assert), so a broken one
would otherwise go unnoticed until someone needs its figures.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT, TESTS

pytestmark = pytest.mark.processes

BENCHES = sorted(p.stem for p in (TESTS / "bench").glob("bench_*.py"))


def test_there_are_benchmarks():
    assert len(BENCHES) >= 5, BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_benchmark_answers_help(name):
    done = subprocess.run([sys.executable, "-m", f"tests.bench.{name}", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
