"""The CLI as the role runs it: `python -m datagen SUBCOMMAND --config FILE` in a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dg_rows as fx


def datagen(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=fx.FILES)
    return subprocess.run([sys.executable, "-m", "datagen", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd="/", check=False)


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
