"""The pipeline unit killed through systemd at each stage, on the CT200 lab: the role's real
``datagen-pipeline.service``, the real router, the stand-in workers.

For each stage (prepare, generate, tokenize, merge, report) the unit is started and its whole cgroup is
SIGKILLed (``systemctl kill -s SIGKILL datagen-pipeline.service``) the moment the stage's in-progress
output appears; then what a user sees: systemd restarts the unit by itself (``Restart=on-failure``, after
``sglang_datagen_pipeline_restart_delay``, 2 s here), the killed stage is redone (its output written
after the kill), every prepared id exactly once, no truncated or stray shard, nothing of the killed run
left; a second start (as the boot timer would) is skipped by the unit's ``ExecCondition`` and writes
nothing; and at the end a plain re-run of the role changes nothing.

The kill points and the dataset checks are ``tests/support/datagen_stages.py``, the same code the host
version of this fault (``test_datagen_faults.py``) uses: here it runs inside CT200, where the kill has to
land within a millisecond of the stage's output appearing (the lab's pipeline is 100 rows).

Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import datagen_stages as stages
from tests.support import faults
from tests.support.datagen import WORK, lab_worker_args, play, reset_pipeline, wait_pipeline_finished
from tests.support.faults import Fault, Figures
from tests.support.ssh import attach

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]

ROWS = 100  # the lab inventory's datagen config (target_total)
UNIT = "datagen-pipeline.service"
RESTART_DELAY = 2  # sglang_datagen_pipeline_restart_delay for these runs (the role's default is 60 s)
KILL_WAIT_S = 120  # bound on the stage reaching its kill point
FINISH_S = 180  # bound on the restarted pipeline finishing (100 rows)
PYTHON = "/opt/datagen/venv/bin/python"
STAGES_SOURCE = Path(stages.__file__).read_text(encoding="utf-8")
# workers at 50 ms a request (16 in flight): generate takes about 0.4 s, long enough for its kill to land mid-way
EXTRA = ("-e", lab_worker_args("--latency", "0.05"),
         "-e", json.dumps({"sglang_datagen_pipeline_restart_delay": RESTART_DELAY}))


def stages_in_ct(lab: dict, *args: str, timeout: float = 200) -> dict:
    """tests/support/datagen_stages.py run inside CT200 with the pipeline's python; its JSON answer."""
    done = attach(lab, PYTHON, "-c", STAGES_SOURCE, *args, timeout=timeout)
    return json.loads(done.stdout)


def unit_show(lab: dict, prop: str) -> str:
    return attach(lab, "systemctl", "show", "-p", prop, "--value", UNIT, check=False).stdout.strip()


def mtime(lab: dict, path: str) -> float:
    out = attach(lab, "stat", "-c", "%.9Y", path, check=False).stdout.strip()
    return float(out) if out else 0.0


@pytest.fixture(scope="module")
def fast_restart_unit(lab):
    """The role converged with a 2 s restart delay and slower workers; its first pipeline finished."""
    reset_pipeline(lab)
    play(*EXTRA)
    wait_pipeline_finished(lab, FINISH_S)
    return lab


def reset_for(lab: dict, stage: str) -> None:
    """A pipeline that must run again from STAGE on (the stages before it skip what is done)."""
    reset_pipeline(lab)
    if stage == "prepare":
        attach(lab, "rm", "-f", f"{WORK}/prompts.jsonl", f"{WORK}/prepare.manifest.json")
    # the unit allows 5 starts an hour (StartLimitBurst): this module kills it 5 times in a row on purpose
    attach(lab, "systemctl", "reset-failed", UNIT, check=False)


@dataclass
class Unit:
    """One point's context: the lab (the role converged with a fast restart), the ledger."""

    lab: dict
    figures: Figures


def unit_killed(stage: str):
    """The injector: the unit's whole cgroup SIGKILLed through systemd the moment STAGE's output appears."""

    def inject(ctx: Unit) -> dict:
        reset_for(ctx.lab, stage)
        return dict(stages_in_ct(ctx.lab, "kill", stage, WORK, str(ROWS), str(KILL_WAIT_S), UNIT), stage=stage)

    return inject


def systemd_restarts_it(ctx: Unit, kill: dict) -> dict:
    """systemd, not the test, brings the unit back; the killed stage is redone, nothing lost; a second start (the
    boot timer's, or anyone's) changes nothing."""
    lab, stage = ctx.lab, kill["stage"]
    assert kill["landed"], f"{stage} never reached its kill point within {KILL_WAIT_S} s"
    assert kill["unfinished"], f"{stage} had finished before the kill landed: the point missed the stage"
    t0 = time.monotonic()
    # nobody starts the unit from here on
    wait_pipeline_finished(lab, FINISH_S)
    ctx.figures.wait("pipeline killed through systemd, restarted and finished", time.monotonic() - t0,
                     RESTART_DELAY + FINISH_S)
    since = "@%d" % int(kill["killed_at"])
    journal = attach(lab, "journalctl", "-u", UNIT, "--since", since, "--no-pager", "-o", "cat").stdout
    assert "Scheduled restart job" in journal, journal[-3000:]
    # the killed stage is redone: its output was written after the kill (never the half output taken as done)
    assert mtime(lab, stages.done_output(stage, WORK)) > kill["killed_at"], f"{stage} was not redone"
    check = stages_in_ct(lab, "check", WORK, str(ROWS))
    assert check["problems"] == [], check["problems"]
    # the ExecCondition reads pipeline.done
    before = {p: mtime(lab, p) for p in (f"{WORK}/generated.jsonl", f"{WORK}/merged/manifest.json")}
    attach(lab, "systemctl", "start", UNIT)
    assert unit_show(lab, "ActiveState") == "inactive"
    assert {p: mtime(lab, p) for p in before} == before, "a finished pipeline ran again"
    return {"rows_lost": check["lost"]}


FAULTS = [Fault("pipeline unit SIGKILLed through systemd", stage, unit_killed(stage), systemd_restarts_it)
          for stage in stages.PIPELINE]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_pipeline_unit_killed_through_systemd_then_systemd_restarts_it(row, fast_restart_unit, figures):
    faults.run(figures, row, Unit(fast_restart_unit, figures))


def test_after_the_kills_a_plain_rerun_of_the_role_changes_nothing(fast_restart_unit):
    out, changed = play(*EXTRA)
    assert changed == 0, out[-4000:]
    assert "finished for this config (nothing started)" in out, out[-4000:]
    assert unit_show(fast_restart_unit, "ActiveState") == "inactive"
