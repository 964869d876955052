"""Faults in the data half on the CT200 lab: the role's real systemd units, the real router, the stand-in workers.

- One SGLang worker and then the router SIGKILLed mid-generation (``systemctl kill -s SIGKILL``):
  systemd restarts both (``Restart=on-failure``), generation finishes, every prepared id exactly once.
- CT200 rebooted mid-pipeline (``pct reboot`` on the lab's PVE host): after boot the unfinished
  pipeline resumes by itself (``datagen-pipeline.timer``) and finishes, every id exactly once; rebooted
  again once finished, it does not run again (the unit's ``ExecCondition`` reads ``pipeline.done``).

Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.support.datagen import (
    TOKEN_EXACT_PY,
    WORK,
    generated_rows,
    lab_worker_args,
    play,
    reset_pipeline,
    wait_pipeline_finished,
)
from tests.support.lab import lab_cli
from tests.support.ssh import attach, on_host
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

ROWS = 100  # the lab inventory's datagen config (tests/lab/datagen, target_total)
RESUME_DELAY = 5  # sglang_datagen_resume_after_boot_delay for these runs


def pve(lab, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A command on the lab's PVE host over its sshd (as an operator or another tool would run it)."""
    return on_host(lab, *argv, timeout=timeout, check=False)


def every_id_once(lab) -> int:
    prompts = [json.loads(line)["id"] for line in attach(lab, "cat", f"{WORK}/prompts.jsonl").stdout.splitlines()]
    ids = [r["id"] for r in generated_rows(lab)]
    assert len(prompts) == len(set(prompts)) == ROWS
    assert len(ids) == len(set(ids)), "a row was generated twice"
    assert sorted(ids) == sorted(prompts), sorted(set(prompts) - set(ids))[:5]
    exact = json.loads(attach(lab, "/opt/datagen/venv/bin/python", "-c", TOKEN_EXACT_PY, WORK).stdout)
    assert (exact["rows"], exact["distinct"]) == (ROWS, ROWS), exact
    return ROWS - exact["distinct"]


def main_pid(lab, unit: str) -> int:
    out = attach(lab, "systemctl", "show", "-p", "MainPID", "--value", unit, check=False).stdout.strip()
    return int(out) if out.isdigit() else 0


def test_worker_and_router_sigkilled_mid_generation_systemd_restarts_them(lab, figures):
    reset_pipeline(lab)
    # slow workers (10 s a request, 16 in flight: about 60 s for the 100 rows): both kills land mid-run
    play("-e", lab_worker_args("--latency", "10"))
    unit = "sglang-datagen-worker@2.service"
    for victim in (unit, "sglang-datagen-router.service"):
        before = main_pid(lab, victim)
        assert before, f"{victim} is not running"
        assert attach(lab, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip() \
            == "activating", "generation ended before the kill"
        attach(lab, "systemctl", "kill", "-s", "SIGKILL", "--kill-whom=main", victim)
        figures.injected("SIGKILL mid-generation: " + victim.split("@", maxsplit=1)[0].split(".", maxsplit=1)[0])
        # RestartSec: worker 15 s, router 5 s
        wait_for(lambda v=victim, b=before: main_pid(lab, v) not in (0, b), 60, f"{victim} restarted by systemd")
    wait_pipeline_finished(lab, 400)
    lost = every_id_once(lab)
    for victim in ("sglang-datagen-worker", "sglang-datagen-router"):
        figures.survived("SIGKILL mid-generation: " + victim, rows_lost=lost)


def test_ct200_rebooted_mid_pipeline_resumes_after_boot_and_a_finished_one_does_not_rerun(lab, figures):
    reset_pipeline(lab)
    delay = json.dumps({"sglang_datagen_resume_after_boot_delay": RESUME_DELAY})
    play("-e", lab_worker_args("--latency", "5"), "-e", delay)
    assert attach(lab, "systemctl", "is-enabled", "datagen-pipeline.timer").stdout.strip() == "enabled"
    wait_for(lambda: len(generated_rows(lab)) >= 10, 120, "some rows generated before the reboot")
    done_before = len(generated_rows(lab))
    assert done_before < ROWS, "generation ended before the reboot"
    t0 = time.monotonic()
    rebooted = pve(lab, "pct", "reboot", "200", "--timeout", "60")
    figures.injected("CT200 rebooted mid-pipeline")
    assert rebooted.returncode == 0, rebooted.stderr
    try:
        # after boot the timer starts the unfinished pipeline by itself; it resumes by row id
        wait_pipeline_finished(lab, 400)
        figures.wait("pipeline resumed and finished after a reboot", time.monotonic() - t0, 400)
        lost = every_id_once(lab)
        journal = attach(lab, "journalctl", "-b", "-u", "datagen-pipeline", "--no-pager", "-o", "cat").stdout
        assert "rows done" in journal, journal[-2000:]
        figures.survived("CT200 rebooted mid-pipeline", rows_lost=lost)

        # finished: another reboot must not run it again
        mtime = attach(lab, "stat", "-c", "%Y", f"{WORK}/generated.jsonl").stdout.strip()
        rebooted = pve(lab, "pct", "reboot", "200", "--timeout", "60")
        assert rebooted.returncode == 0, rebooted.stderr

        def skipped_by_exec_condition() -> bool:
            result = attach(lab, "systemctl", "show", "-p", "Result", "--value", "datagen-pipeline.service",
                            check=False).stdout
            journal = attach(lab, "journalctl", "-b", "-u", "datagen-pipeline", "--no-pager", check=False).stdout
            return "exec-condition" in result or "Skipped" in journal

        wait_for(skipped_by_exec_condition, RESUME_DELAY + 120, "the boot timer's start skipped by the ExecCondition")
        assert attach(lab, "stat", "-c", "%Y", f"{WORK}/generated.jsonl").stdout.strip() == mtime
        assert attach(lab, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip() \
            == "inactive"
    finally:
        # the reboot took the trainer and the decoy sessions with it: the lab puts them back
        lab_cli("up", timeout=600)
