"""The CLI as the role runs it: `python -m datagen SUBCOMMAND --config FILE` in a real subprocess."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from datagen.generate import settings_from_config
from tests.support import datagen_rows as fx
from tests.support.datagen_rows import run_cli as datagen

pytestmark = pytest.mark.processes


def test_prepare_then_skip_then_report(tmp_path):
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, 10))
    p = datagen("prepare", "--config", cfg)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["written"] == 60 and out["skipped"] is False
    assert json.loads(datagen("prepare", "--config", cfg).stdout)["skipped"] is True
    r = datagen("report", "--config", cfg)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(tmp_path, "work", "report", "mix.png"))


def test_bad_config_exit_2_names_the_key(tmp_path):
    sources = fx.six_sources(tmp_path, 2)
    sources[2]["path"] = "missing/metamath.jsonl"
    cfg = fx.write_config(tmp_path, sources)
    p = datagen("prepare", "--config", cfg)
    assert p.returncode == 2 and p.stdout == ""
    assert f"sources[2].path: file not found: {tmp_path}/missing/metamath.jsonl" in p.stderr
    assert "Traceback" not in p.stderr


def test_stage_error_exit_1(tmp_path):
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, 2))
    p = datagen("tokenize", "--config", cfg)
    assert p.returncode == 1 and "run `python -m datagen generate` first" in p.stderr


def test_status_goes_to_the_generate_side(tmp_path):
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, 2))
    os.makedirs(tmp_path / "work")
    p = datagen("status", "--config", cfg)
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(p.stdout), dict)


def test_usage_errors():
    assert datagen().returncode == 2
    assert datagen("frobnicate", "--config", "x").returncode == 2


def test_check_config_reports_every_problem_the_stages_would_and_runs_nothing(tmp_path):
    """The keys, the sources and the generate stage's sampling settings, all at once, exit 2."""
    sources = fx.six_sources(tmp_path, 2)
    sources[1]["path"] = "missing/gone.jsonl"
    cfg = fx.write_config(tmp_path, sources, sampling={"temprature": 0.7})
    p = datagen("check-config", "--config", cfg)
    assert p.returncode == 2 and p.stdout == ""
    assert f"sources[1].path: file not found: {tmp_path}/missing/gone.jsonl" in p.stderr
    assert "sampling.temprature: unknown sampling parameter; use one of" in p.stderr and "temperature" in p.stderr
    assert "Traceback" not in p.stderr
    assert not os.path.exists(tmp_path / "work")  # nothing ran


def test_check_config_without_inputs_lists_them_resolved_where_the_config_will_live(tmp_path):
    """--no-inputs: the inputs live on the node; they are listed (node paths), not opened."""
    sources = [{"name": "a", "adapter": "messages", "category": "general", "path": "sources/a.jsonl"},
               {"name": "b", "adapter": "messages", "category": "general", "path": ["/data/b1.jsonl", "/data/b*.jsonl"]}]
    cfg = fx.write_config(tmp_path, sources, target_mix={"general": 1.0}, tokenizer="/srv/tok",
                          existing_dataset={"path": "/srv/existing.jsonl"})
    p = datagen("check-config", "--config", cfg, "--no-inputs", "--base-dir", "/opt/datagen")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["valid"] is True and out["inputs_checked"] is False
    assert out["max_in_flight"] == settings_from_config(yaml.safe_load(Path(cfg).read_text())).max_in_flight > 0
    assert out["inputs"] == [
        {"key": "sources[0].path", "path": "/opt/datagen/sources/a.jsonl"},
        {"key": "sources[1].path[0]", "path": "/data/b1.jsonl"},
        {"key": "sources[1].path[1]", "path": "/data/b*.jsonl"},
        {"key": "existing_dataset.path", "path": "/srv/existing.jsonl"},
        {"key": "tokenizer", "path": "/srv/tok"},
    ]
    # the same config with its inputs opened here fails on each of them
    p = datagen("check-config", "--config", cfg)
    assert p.returncode == 2
    assert "sources[0].path: file not found" in p.stderr and "tokenizer: directory not found: /srv/tok" in p.stderr


def test_a_finished_stage_writes_the_ready_marker(tmp_path):
    """pipeline.ready.json: the stage the pipeline got to past its start-up (the role waits for it)."""
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, 3))
    assert not os.path.exists(tmp_path / "work" / "pipeline.ready.json")
    p = datagen("prepare", "--config", cfg)
    assert p.returncode == 0, p.stderr
    marker = json.loads((tmp_path / "work" / "pipeline.ready.json").read_text())
    assert marker["stage"] == "prepare" and marker["why"] == "stage finished"
    # a failing stage writes none
    (tmp_path / "work" / "pipeline.ready.json").unlink()
    p = datagen("tokenize", "--config", cfg)
    assert p.returncode != 0
    assert not os.path.exists(tmp_path / "work" / "pipeline.ready.json")
