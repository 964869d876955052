"""datagen.units: ``systemctl show`` parsed, and ``pipeline-state``, the probe the role polls after starting the pipeline."""

from __future__ import annotations

import json

import pytest

from datagen import cli, units
from tests.support.datagen_rows import run_cli


@pytest.mark.parametrize("text,expected", [
    ("ActiveState=active\nSubState=running\n", {"ActiveState": "active", "SubState": "running"}),
    ("ExecStart={ path=/bin/x ; argv[]=/bin/x a=b }\n", {"ExecStart": "{ path=/bin/x ; argv[]=/bin/x a=b }"}),
    ("MainPID=\n", {"MainPID": ""}),
    ("", {}),
    ("no equals sign\n\nResult=exit-code\n", {"Result": "exit-code"}),
])
def test_parse_properties(text, expected):
    assert units.parse_properties(text) == expected


@pytest.mark.parametrize("text,expected", [
    (None, {}),
    ("", {}),
    ('{"stage": "gen', {}),  # torn (the CLI replaces it atomically, but another writer might not)
    ("[1, 2]", {}),
    ('{"stage": "generate", "why": "first responses written"}\n',
     {"stage": "generate", "why": "first responses written"}),
])
def test_parse_ready(text, expected):
    assert units.parse_ready(text) == expected


def test_pipeline_state_reads_the_file_the_cli_writes(tmp_path):
    asked = []

    def show(unit, properties):
        asked.append((unit, tuple(properties)))
        return "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n"

    work = str(tmp_path / "work")
    assert units.pipeline_state(work, show) == {
        "unit": {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0"},
        "ready": {}}
    cli.mark_ready(work, "generate", "first responses written")
    state = units.pipeline_state(work, show)
    assert (state["ready"]["stage"], state["ready"]["why"]) == ("generate", "first responses written")
    assert asked == [("datagen-pipeline.service", ("ActiveState", "SubState", "Result", "NRestarts"))] * 2


def test_cli_pipeline_state_end_to_end(tmp_path, fake_systemctl):
    fake_systemctl({"datagen-pipeline.service": {"ActiveState": "activating", "SubState": "auto-restart",
                                                 "Result": "exit-code", "NRestarts": "2"}})
    work = tmp_path / "work"
    p = run_cli("pipeline-state", "--work-dir", str(work))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"unit": {"ActiveState": "activating", "SubState": "auto-restart",
                                             "Result": "exit-code", "NRestarts": "2"}, "ready": {}}
    cli.mark_ready(str(work), "prepare", "stage finished")
    assert json.loads(run_cli("pipeline-state", "--work-dir", str(work)).stdout)["ready"]["stage"] == "prepare"


def test_cli_pipeline_state_without_systemctl_exits_1(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    p = run_cli("pipeline-state", "--work-dir", str(tmp_path))
    assert p.returncode == 1 and "systemctl not found" in p.stderr and "Traceback" not in p.stderr
