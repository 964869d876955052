"""training_stop's ``ladder`` suboptions: what the argument spec checks, and what it leaves to the ladder's own
checks (which name the rung and the fix). The real module in its own process, in check mode, selecting nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.module import run_module

pytestmark = pytest.mark.processes


def check_ladder(tmp_path: Path, ladder: list) -> dict:
    # a regex no process matches: the module validates, selects nothing and signals nothing
    return run_module("training_stop", {"match": r"^no-such-program-r13m\s", "ladder": ladder,
                                        "lock_dir": str(tmp_path / "lock")}, check_mode=True, timeout=60)


@pytest.mark.parametrize("ladder, fragment", [
    # refused by the argument spec: the option path and the allowed values are named
    ([{"signal": "INT", "timeout": 1, "wait": 3}], "ladder.wait. Supported parameters include: signal, timeout, to, via"),
    ([{"signal": "INT", "timeout": 1, "via": "screen"}], "value of via must be one of: tmux, got: screen found in ladder"),
    ([{"signal": "TERM", "timeout": 1, "to": "everyone"}], "value of to must be one of: launcher, all, got: everyone"),
    # left to the ladder's checks: a left-out key is None after the argument spec, still "missing"
    ([{"signal": "INT"}], "ladder[0]: a rung needs both signal and timeout"),
    ([{"timeout": 3}], "ladder[0]: a rung needs both signal and timeout"),
    # type raw: a bool is not taken for 1 second
    ([{"signal": "INT", "timeout": True}], "ladder[0].timeout: timeout must be a number of seconds, got True"),
    ([{"signal": "SIGSTOP", "timeout": 1}], "ladder[0].signal"),
    ([{"signal": "INT", "timeout": 1, "via": "tmux"}], "ladder[0].via: tmux needs tmux_session"),
])
def test_bad_rungs_name_the_rung_and_the_fix(tmp_path, ladder, fragment):
    result = check_ladder(tmp_path, ladder)
    assert result["rc"] == 1 and fragment in result["msg"], result["msg"]
    assert result.get("rungs", []) == []


def test_signal_numbers_and_timeout_strings_still_work(tmp_path):
    result = check_ladder(tmp_path, [{"signal": "INT", "timeout": "2.5", "to": "all"}, {"signal": 9, "timeout": 1}])
    assert result["rc"] == 0, result.get("msg")
    assert result["plan"] == ["SIGINT to every process, wait 2.5s", "SIGKILL to every process, wait 1s"]
    assert result["selected"] == [] and result["changed"] is False
