# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The controller lost in the way back, between "serving stopped" and "job launched", on the CT200 lab.

The lab's stubborn trainer, saving a checkpoint every 5 steps, is stopped by the stop half alone (its launch
record written); the data half's serving units, when the container has them, are started, so the restore has
serving to stop. Then ``playbooks/restore_training.yml`` runs and ``ansible-playbook`` is SIGKILLed whole (its
process group and every descendant: ansible-core 2.19's workers ``setsid`` out of the group) the moment the
banner of the launch step is printed: serving stopped and every GPU proven free, nothing launched yet.

What the killed run must have left: no tmux window ``train`` in session dflash, no trainer process, every fake
GPU at its baseline (serving stopped), the launch record as the stop half wrote it, and the run lock held by the
dead ``ansible-playbook``. A plain re-run takes that lock over (its output says so), launches the recorded job
and proves it trains: all 8 GPUs held, the first step past the record's checkpoint step. A second re-run
changes nothing. Everything is judged from CT200 itself and the fake GPUs' own state, never through the code
under test.

Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from tests.support import faults
from tests.support import restore as way_back
from tests.support.ct200 import lock_holder, trainer_pids
from tests.support.faults import Fault, Figures
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import start_playbook
from tests.support.ssh import attach
from tests.support.stop_faults import controller_running, read_lock
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(1500)]

RESTORE_VARS = {"restore_training_dataset": way_back.TRAINER_DATA}
SERVING = "sglang-datagen.target"
# roles/restore_training/tasks: the GPU proof (release.yml), then the launch (launch.yml), whose banner is the
# kill point
FREE_TASK = "Release | Prove every GPU free"
LAUNCH_TASK = "Launch | Start the job in tmux and wait until it trains"
# what the re-run's output says when it takes over the dead run's lock (roles/stop_training/templates/report.j2)
STALE_LOCK_TAKEN = "took over a stale lock"
# The re-run's bound: its launch waits at most restore_training_start_timeout (the role's 300 s) for the proof;
# 120 s more for the rest: the validation pass, the lock, the drain and release (nothing left to stop: the
# killed run stopped serving, so the GPU wait ends at its first look), the connections.
START_TIMEOUT_S = 300
RERUN_BOUND_S = START_TIMEOUT_S + 120
KILL_BOUND_S = 600  # the killed run, from its start to the launch banner (the same work as the re-run's, minus the launch)


def serving_units(status: dict) -> bool:
    """The data half's serving units are installed in the container (its converge ran on this lane)."""
    return attach(status, "systemctl", "cat", SERVING, check=False).returncode == 0


def active(status: dict, unit: str) -> str:
    return attach(status, "systemctl", "is-active", unit, check=False).stdout.strip()


def task_of(banner: str) -> str:
    """A banner's task name without its role prefix (``gpuops.repurpose.restore_training : ``)."""
    return banner.split(" : ", 1)[-1]


@dataclass
class WayBack:
    """The point's context: the lab, the ledger, and the job stopped by the stop half (its launch record)."""

    lab: dict
    figures: Figures
    record: dict = field(default_factory=dict)
    serving: bool = False


def killed_at_the_launch(ctx: WayBack) -> int:
    """The injector: the stop half stops the job (its record), serving runs when the container has it; then
    ``restore_training.yml`` SIGKILLed whole the moment the launch banner is printed. The killed play's PID."""
    status, figures = ctx.lab, ctx.figures
    ctx.record = way_back.stopped_with_record(status)
    ckpt = ctx.record["checkpoint"]
    assert ckpt and ckpt["whole"] and ckpt["step"] % 5 == 0, ctx.record
    ctx.serving = serving_units(status)
    if ctx.serving:
        attach(status, "systemctl", "start", "--no-block", SERVING)
        # --no-block: the start job is queued, not yet run (bounded wait until systemd takes it up)
        wait_for(lambda: active(status, SERVING) in ("active", "activating"), 60, "%s started" % SERVING)
    figures.note("restore controller kill: serving before the restore",
                 "%s started" % SERVING if ctx.serving else "no serving units in the container (data half not deployed)")
    t0 = time.monotonic()
    proc = start_playbook(way_back.RESTORE_PLAYBOOK, LAB_INVENTORY, [RESTORE_VARS])
    seen = faults.controller_killed(proc, lambda banners: task_of(banners[-1]) == LAUNCH_TASK, timeout=KILL_BOUND_S)
    figures.note("restore controller kill: the killed run, start to kill (s)", round(time.monotonic() - t0, 1))
    # the kill landed after the GPUs were proven free (the play goes on past that task only when it passed)
    assert FREE_TASK in [task_of(b) for b in seen], seen
    return proc.pid


def rerun_takes_over_and_trains(ctx: WayBack, killed_pid: int) -> None:
    """Nothing launched and the dead run's lock left; a plain re-run takes the lock over and the job trains from
    the record's checkpoint; a second re-run changes nothing."""
    status, figures, record = ctx.lab, ctx.figures, ctx.record
    # before any launch: no window, no trainer process, every fake GPU at its baseline
    assert "train" not in way_back.windows(status), way_back.windows(status)
    assert not trainer_pids(status)
    assert way_back.held_gpus(status) == []
    if ctx.serving:
        assert active(status, SERVING) == "inactive", active(status, SERVING)
    assert way_back.read_record(status) == record
    # the run lock: held by the dead run
    holder = read_lock(status)
    assert holder is not None and int(holder.get("controller_pid") or 0) == killed_pid, holder
    assert not controller_running(holder), holder

    t1 = time.monotonic()
    run = way_back.restore(extra=RESTORE_VARS)
    rerun_s = time.monotonic() - t1
    figures.note("restore controller kill: the re-run (s)", round(rerun_s, 1))
    assert run.rc == 0, run.output[-6000:]
    figures.wait("restore re-run after the controller was killed before the launch", rerun_s, RERUN_BOUND_S)
    way_back.trains_from(status, record["checkpoint"])
    assert "training again in tmux session dflash" in way_back.summary_lines(run.output)
    assert lock_holder(status) is None

    again = way_back.restore(extra=RESTORE_VARS)
    assert again.rc == 0 and again.recap()["changed"] == 0, again.output[-4000:]
    assert "already trains" in way_back.summary_lines(again.output)
    assert way_back.held_gpus(status) == way_back.ALL_GPUS
    # the dead run's lock was taken over (the re-run went on, and left the lock free): its output says so
    assert STALE_LOCK_TAKEN in " ".join(run.output.split()), run.output[-6000:]


FAULTS = [Fault("restore: controller killed", "before the launch", killed_at_the_launch, rerun_takes_over_and_trains)]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_controller_killed_then_a_plain_rerun_finishes_the_way_back(row, lab, figures):
    faults.run(figures, row, WayBack(lab, figures))
