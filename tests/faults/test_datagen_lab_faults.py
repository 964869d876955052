"""Faults in the data half on the CT200 lab: the role's real systemd units, the real router, the stand-in workers.

- The router and then one SGLang worker SIGKILLed mid-generation (``systemctl kill -s SIGKILL``):
  systemd restarts both (``Restart=on-failure``), the router sends requests to the restarted worker again
  by itself (its circuit breaker, ``--cb-timeout-duration-secs``), generation finishes, every prepared id
  exactly once and token-exact, no request left in the errors file.
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
    WORKERS,
    generated_rows,
    lab_worker_args,
    play,
    reset_pipeline,
    router_workers,
    server_metrics,
    wait_pipeline_finished,
)
from tests.support.lab import MAIN_CT, lab_cli
from tests.support.ssh import attach, on_host
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]

ROWS = 100  # the lab inventory's datagen config (tests/lab/datagen, target_total)
RESUME_DELAY = 5  # sglang_datagen_resume_after_boot_delay for these runs


def pve(lab, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A command on the lab's PVE host over its sshd (as an operator or another tool would run it)."""
    return on_host(lab, *argv, timeout=timeout, check=False)


def every_id_once(lab, token_exact: bool = False) -> int:
    """Every prepared id exactly once in generated.jsonl and in the tokenized rows (with TOKEN_EXACT, each row
    token-exact: prompt and response ids as the worker counted them); the rows lost."""
    prompts = [json.loads(line)["id"] for line in attach(lab, "cat", f"{WORK}/prompts.jsonl").stdout.splitlines()]
    ids = [r["id"] for r in generated_rows(lab)]
    assert len(prompts) == len(set(prompts)) == ROWS
    assert len(ids) == len(set(ids)), "a row was generated twice"
    assert sorted(ids) == sorted(prompts), sorted(set(prompts) - set(ids))[:5]
    exact = json.loads(attach(lab, "/opt/datagen/venv/bin/python", "-c", TOKEN_EXACT_PY, WORK).stdout)
    assert (exact["rows"], exact["distinct"]) == (ROWS, ROWS), exact
    if token_exact:
        assert exact["exact"] == ROWS, exact
    return ROWS - exact["distinct"]


def main_pid(lab, unit: str) -> int:
    out = attach(lab, "systemctl", "show", "-p", "MainPID", "--value", unit, check=False).stdout.strip()
    return int(out) if out.isdigit() else 0


def test_router_then_a_worker_sigkilled_mid_generation_systemd_restarts_them_and_the_router_uses_it_again(
        lab, figures):
    reset_pipeline(lab)
    # slow workers (15 s a request, 16 in flight: about 105 s for the 100 rows): both kills land mid-run, and
    # rows are left once the worker is back (RestartSec 15 s) and the router's breaker lets it in again
    play("-e", lab_worker_args("--latency", "15"))
    argv = attach(lab, "systemctl", "show", "-p", "ExecStart", "sglang-datagen-router.service").stdout
    assert "--cb-timeout-duration-secs 10" in argv, argv  # sglang_datagen_router_cb_timeout (upstream: 60)
    worker, url = "sglang-datagen-worker@3.service", WORKERS[3]
    metrics_before = server_metrics()
    # the router first: the worker's kill then reaches a router that has seen it answer, so using the restarted
    # worker again is the router's own recovery (its circuit breaker), not a fresh router's first look
    for victim in ("sglang-datagen-router.service", worker):
        before = main_pid(lab, victim)
        assert before, f"{victim} is not running"
        assert attach(lab, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip() \
            == "activating", "generation ended before the kill"
        attach(lab, "systemctl", "kill", "-s", "SIGKILL", "--kill-whom=main", victim)
        figures.injected("SIGKILL mid-generation: " + victim.split("@", maxsplit=1)[0].split(".", maxsplit=1)[0])
        # RestartSec: worker 15 s, router 5 s
        wait_for(lambda v=victim, b=before: main_pid(lab, v) not in (0, b), 60, f"{victim} restarted by systemd")
    left = ROWS - len(generated_rows(lab))
    assert left >= 20, f"only {left} rows left once the worker was back: the run is too short to show routing to it"
    wait_pipeline_finished(lab, 400)

    # the new process (another start time) answered chat requests: the router routed to it again by itself
    after = server_metrics()
    assert after[url]["standin_start_time_seconds"] > metrics_before[url]["standin_start_time_seconds"], (
        metrics_before[url], after[url])
    assert after[url]["standin_ok_total"] > 0, (after[url], attach(
        lab, "journalctl", "-u", "sglang-datagen-router", "--no-pager", "-n", "30", "-o", "cat", check=False).stdout)
    assert router_workers() == {w: True for w in WORKERS}
    assert attach(lab, "test", "-s", f"{WORK}/generate.errors.jsonl", check=False).returncode != 0, attach(
        lab, "cat", f"{WORK}/generate.errors.jsonl", check=False).stdout[-2000:]
    lost = every_id_once(lab, token_exact=True)
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
    rebooted = pve(lab, "pct", "reboot", MAIN_CT, "--timeout", "60")
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
        rebooted = pve(lab, "pct", "reboot", MAIN_CT, "--timeout", "60")
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
