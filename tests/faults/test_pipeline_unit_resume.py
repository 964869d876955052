"""The pipeline unit's resume rules, run for real without systemd: the unit and timer templates
rendered as the role renders them, and the service's ``ExecCondition`` command line run by
``/bin/sh`` against a real config and a real ``pipeline.done`` marker (as written by its
``ExecStartPost``). The reboot itself (the timer starting an unfinished pipeline after boot) is
``test_datagen_lab_faults.py`` on the lab."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import jinja2
import pytest

from tests.support.paths import ROOT

TEMPLATES = os.path.join(ROOT, "roles", "sglang_datagen", "templates")


def render(name: str, work: str, config: str) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    env.filters["bool"] = bool
    return env.get_template(name).render(
        ansible_managed="managed", sglang_datagen_stages=["prepare", "generate"], sglang_datagen_serve=False,
        sglang_datagen_use_router=False, sglang_datagen_work_dir=work, sglang_datagen_home="/opt/datagen",
        sglang_datagen_venv="/opt/datagen/venv", sglang_datagen_config_path=config,
        # what `datagen check-config` reports (the unit sizes its open-file limit from max_in_flight)
        sglang_datagen__max_in_flight=4,
        sglang_datagen_resume_after_boot_delay=30, sglang_datagen_pipeline_restart_delay=60,
        sglang_datagen__needs_key=False,
        sglang_datagen__all_worker_urls=["http://127.0.0.1:30001"])


def directive(unit: str, key: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^%s=(.*)$" % key, unit, re.M)]


def run_systemd_cmd(cmd: str) -> int:
    # systemd's ExecCondition: the first word is the program, the rest its arguments (no shell of its own)
    return subprocess.run(shlex.split(cmd), check=False, timeout=30).returncode


@pytest.fixture
def unit(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "datagen.yml"
    config.write_text("work_dir: x\n")
    return work, config, render("datagen-pipeline.service.j2", str(work), str(config))


def test_unfinished_pipeline_runs_finished_one_is_skipped_changed_config_runs_again(unit):
    work, config, text = unit
    [condition] = directive(text, "ExecCondition")
    [post] = directive(text, "ExecStartPost")
    assert run_systemd_cmd(condition) == 0, "no marker: an unfinished pipeline must run"
    assert run_systemd_cmd(post) == 0 and (work / "pipeline.done").exists()
    # exit 1..254 from ExecCondition: systemd skips the unit (not a failure)
    assert run_systemd_cmd(condition) == 1, "finished for this config: the boot timer's start must be skipped"
    config.write_text("work_dir: y\n")
    assert run_systemd_cmd(condition) == 0, "a changed config is not finished"


def test_a_run_is_finished_only_for_the_config_it_started_on(unit):
    """A play killed after writing a new config and before restarting the pipeline leaves the run going on
    the older config: when it ends, its marker must not call the new config finished."""
    work, config, text = unit
    [pre] = directive(text, "ExecStartPre")
    [post] = directive(text, "ExecStartPost")
    [condition] = directive(text, "ExecCondition")
    assert run_systemd_cmd(pre) == 0 and (work / "pipeline.started").exists()
    config.write_text("work_dir: written while it ran\n")
    assert run_systemd_cmd(post) == 0
    assert not (work / "pipeline.started").exists(), "the start record became the finished marker"
    assert run_systemd_cmd(condition) == 0, "the config written while it ran is not finished: it must run again"
    # the run the new config starts finishes it
    assert run_systemd_cmd(pre) == 0 and run_systemd_cmd(post) == 0
    assert run_systemd_cmd(condition) == 1


def test_timer_resumes_after_boot_and_does_not_hold_boot(unit, tmp_path):
    work, config, _text = unit
    timer = render("datagen-pipeline.timer.j2", str(work), str(config))
    assert directive(timer, "OnBootSec") == ["30s"]
    assert directive(timer, "Unit") == ["datagen-pipeline.service"]
    assert directive(timer, "WantedBy") == ["timers.target"]
    # the oneshot service itself is not wanted by a boot target: boot would wait hours for it
    assert directive(_text, "WantedBy") == []
