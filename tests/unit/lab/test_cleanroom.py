"""scripts/cleanroom's handling of a step killed from outside: the error explains itself, and the run fails
like on any other failure (no retry hides it)."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.support.paths import ROOT, TESTS, load_script

cleanroom = load_script(TESTS / "cleanroom" / "cleanroom.py", "gpuops_cleanroom")


@pytest.mark.parametrize(("before", "after", "state", "mib", "says"), [
    (3, 4, "running", 900, ["OOM killer ran 1 time(s)", "init still runs", "MemAvailable 900 MiB"]),
    (3, 3, "running", 20000, ["OOM killer did not run", "step's own process was killed"]),
    (0, 0, "stopped", None, ["init is gone (state 'stopped')", "MemAvailable unknown"]),
    (None, 2, "running", 1, ["OOM kill count is not shown"]),
])
def test_a_sigkilled_step_says_what_the_machine_showed(before, after, state, mib, says):
    text = cleanroom.sigkill_context(before, after, state, mib)
    assert all(part in text for part in says), text


def test_this_machine_shows_its_oom_kills_and_available_memory():
    assert isinstance(cleanroom.oom_kills(), int)
    assert cleanroom.mem_available_mib() > 0


def _main_with(monkeypatch, outcomes: list) -> tuple[int, list]:
    """cleanroom.main with the caches stubbed and each attempt raising (or not) the next of OUTCOMES."""
    calls = []

    def attempt(*_args):
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(cleanroom, "lab_module", lambda: type("Lab", (), {"rootfs_cache": staticmethod(lambda: "/r")}))
    for name, value in (("setup_packages", lambda: []), ("apt_repo", lambda *_a: "/a"), ("wheelhouse", lambda: "/w"),
                        ("prune", lambda _keep: None), ("attempt", attempt)):
        monkeypatch.setattr(cleanroom, name, value)
    monkeypatch.setattr(sys, "argv", ["cleanroom"])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return cleanroom.main(), calls


def test_a_kill_from_outside_fails_the_run_with_what_the_machine_showed(monkeypatch, capsys):
    rc, calls = _main_with(monkeypatch, [cleanroom.KilledFromOutside("setup was killed by SIGKILL; OOM killer did not run")])
    out = capsys.readouterr().out
    assert (rc, len(calls)) == (1, 1), "a kill from outside is never retried away"
    assert "setup was killed by SIGKILL; OOM killer did not run" in out and "passed" not in out


def test_any_other_failure_fails_the_run(monkeypatch, capsys):
    rc, calls = _main_with(monkeypatch, [cleanroom.CleanRoomError("setup failed (rc 1)")])
    assert (rc, len(calls)) == (1, 1) and "setup failed (rc 1)" in capsys.readouterr().out


def test_the_wheelhouse_holds_every_requirements_file_setup_installs():
    """The clean room has no index: a venv scripts/setup makes from a file missing here cannot install."""
    setup = (ROOT / "scripts" / "setup").read_text()
    assert sorted(re.findall(r"^sync_venv \S+ (\S+)$", setup, re.MULTILINE)) == sorted(cleanroom.REQUIREMENTS)
