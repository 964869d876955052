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
from dataclasses import dataclass

import pytest

from tests.support import faults
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
from tests.support.faults import Fault, Figures
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


@dataclass
class Pipeline:
    """One point's context: the lab, the ledger."""

    lab: dict
    figures: Figures


def router_then_worker_killed(ctx: Pipeline) -> dict:
    """The injector: the router, then worker 3, SIGKILLed (main process) while generation runs; both back."""
    lab = ctx.lab
    reset_pipeline(lab)
    # slow workers (15 s a request, 16 in flight: about 105 s for the 100 rows): both kills land mid-run, and
    # rows are left once the worker is back (RestartSec 15 s) and the router's breaker lets it in again
    play("-e", lab_worker_args("--latency", "15"))
    argv = attach(lab, "systemctl", "show", "-p", "ExecStart", "sglang-datagen-router.service").stdout
    assert "--cb-timeout-duration-secs 10" in argv, argv  # sglang_datagen_router_cb_timeout (upstream: 60)
    metrics_before = server_metrics()
    # the router first: the worker's kill then reaches a router that has seen it answer, so using the restarted
    # worker again is the router's own recovery (its circuit breaker), not a fresh router's first look
    for victim in ("sglang-datagen-router.service", "sglang-datagen-worker@3.service"):
        before = main_pid(lab, victim)
        assert before, f"{victim} is not running"
        assert attach(lab, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip() \
            == "activating", "generation ended before the kill"
        attach(lab, "systemctl", "kill", "-s", "SIGKILL", "--kill-whom=main", victim)
        # RestartSec: worker 15 s, router 5 s
        wait_for(lambda v=victim, b=before: main_pid(lab, v) not in (0, b), 60, f"{victim} restarted by systemd")
    return {"url": WORKERS[3], "metrics_before": metrics_before}


def router_uses_the_restarted_worker(ctx: Pipeline, landed: dict) -> dict:
    """Generation finishes; the router routed to the restarted worker by itself; nothing lost, nothing failed."""
    lab, url, metrics_before = ctx.lab, landed["url"], landed["metrics_before"]
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
    return {"rows_lost": every_id_once(lab, token_exact=True)}


def rebooted_mid_pipeline(ctx: Pipeline) -> float:
    """The injector: CT200 rebooted (``pct reboot`` on the PVE host) once some rows are generated; when."""
    lab = ctx.lab
    reset_pipeline(lab)
    delay = json.dumps({"sglang_datagen_resume_after_boot_delay": RESUME_DELAY})
    play("-e", lab_worker_args("--latency", "5"), "-e", delay)
    assert attach(lab, "systemctl", "is-enabled", "datagen-pipeline.timer").stdout.strip() == "enabled"
    wait_for(lambda: len(generated_rows(lab)) >= 10, 120, "some rows generated before the reboot")
    assert len(generated_rows(lab)) < ROWS, "generation ended before the reboot"
    t0 = time.monotonic()
    rebooted = pve(lab, "pct", "reboot", MAIN_CT, "--timeout", "60")
    assert rebooted.returncode == 0, rebooted.stderr
    return t0


def resumes_after_boot_and_not_once_finished(ctx: Pipeline, t0: float) -> dict:
    """After boot the timer starts the unfinished pipeline by itself, which resumes by row id and finishes;
    rebooted again once finished, it does not run again (the ExecCondition)."""
    lab = ctx.lab
    wait_pipeline_finished(lab, 400)
    ctx.figures.wait("pipeline resumed and finished after a reboot", time.monotonic() - t0, 400)
    lost = every_id_once(lab)
    journal = attach(lab, "journalctl", "-b", "-u", "datagen-pipeline", "--no-pager", "-o", "cat").stdout
    assert "rows done" in journal, journal[-2000:]

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
    return {"rows_lost": lost}


FAULTS = [
    Fault("the router, then a worker SIGKILLed", "mid-generation", router_then_worker_killed,
          router_uses_the_restarted_worker),
    Fault("CT200 rebooted", "mid-pipeline", rebooted_mid_pipeline, resumes_after_boot_and_not_once_finished,
          at={"reboots": True}),
]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_data_half_fault_then_it_recovers_by_itself(row, lab, figures):
    try:
        faults.run(figures, row, Pipeline(lab, figures))
    finally:
        if row.at.get("reboots"):  # the reboot took the trainer and the decoy sessions with it: the lab puts them back
            lab_cli("up", timeout=600)
