# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The way back on the CT200 lab: playbooks/restore_training.yml for real, after playbooks/repurpose_ct200.yml.

The lab's stubborn trainer (only SIGKILL ends it, so its checkpoint is a periodic save, every 5 steps) is
stopped by the real stop half, which writes its launch record; the real data half generates through the real
router to its end and releases the GPUs itself; the restore starts the recorded command again in tmux session
dflash with ``--data`` pointed at the merged set and ``--resume-from`` at the record's checkpoint, and proves it
trains. Everything is judged from CT200 itself (lxc-attach) and the fake GPUs' own state.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.support.datagen import (
    WORK,
    generated_rows,
    lab_worker_args,
    prepared_ids,
    reset_pipeline,
    wait_pipeline_finished,
)
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import run_playbook
from tests.support.restore import (
    ALL_GPUS,
    CKPT_DIR,
    MERGED,
    RECORD,
    STUBBORN_STOP,
    TRAINER_DATA,
    fresh_job,
    gpus_free_after,
    held_gpus,
    read_record,
    restore,
    stopped_with_record,
    summary_lines,
    trains_from,
    windows,
)
from tests.support.ssh import attach
from tests.support.stop_training import REPURPOSE_PLAYBOOK

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(1800)]


def repurpose(*extra: dict, timeout: float = 1200):
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [STUBBORN_STOP, *extra], timeout=timeout)
    assert done.rc == 0, done.output[-6000:]
    return done


def report_time(status: dict) -> float:
    """When the pipeline's report stage wrote its last file (CT200's clock is this machine's)."""
    stamps = attach(status, "find", WORK + "/report", "-type", "f", "-printf", "%T@\\n").stdout.split()
    return max(float(s) for s in stamps)


def test_the_node_s_whole_life_train_repurpose_generate_release_restore(lab):
    status = lab
    fresh_job(status)
    reset_pipeline(status)
    attach(status, "rm", "-f", RECORD, WORK + "/released.json")

    done = repurpose()
    record = read_record(status)
    ckpt = record["checkpoint"]
    assert record["argv"][1].endswith("fake_trainer.py") and record["argv"][record["argv"].index("--data") + 1] == TRAINER_DATA
    assert ckpt["whole"] and ckpt["path"].startswith(CKPT_DIR + "/ckpt-step") and ckpt["step"] % 5 == 0, record
    assert record["stopped_by"] == "SIGKILL" and record["step"] >= ckpt["step"]
    assert "Last whole checkpoint: %s, step %d" % (ckpt["path"], ckpt["step"]) in done.output

    # generation to its end; the GPUs are released by the pipeline itself, without a play
    wait_pipeline_finished(status, 900)
    free, seconds = gpus_free_after(status, report_time(status), 60)
    assert free and seconds <= 30, "GPUs free %s, %.1f s after the report" % (free, seconds)
    assert json.loads(attach(status, "cat", WORK + "/released.json").stdout)["free"] is True
    # a re-run of the repurpose sees the finished job: nothing stopped, nothing served again
    rerun = repurpose()
    assert "finished for this config" in rerun.output and rerun.recap()["changed"] == 0, rerun.output[-4000:]
    assert attach(status, "systemctl", "is-active", "sglang-datagen-worker@0.service", check=False).stdout.strip() \
        != "active"
    assert held_gpus(status) == []

    # the dry run plans the start and starts nothing
    dry = restore("--check")
    assert dry.rc == 0 and "DRY RUN (check mode)" in dry.output, dry.output[-4000:]
    assert "train" not in windows(status) and held_gpus(status) == []

    run = restore()
    assert run.rc == 0, run.output[-6000:]
    shown = trains_from(status, ckpt)
    assert "[rank 0] data %s" % MERGED in shown, shown
    assert "resumed from %s at step %d" % (ckpt["path"], ckpt["step"] + 1) in shown, shown
    summary = summary_lines(run.output)
    assert "training again in tmux session dflash" in summary and ckpt["path"] in summary and MERGED in summary

    again = restore()
    assert again.rc == 0 and again.recap()["changed"] == 0, again.output[-4000:]
    assert "already trains" in summary_lines(again.output)


def test_restore_while_generating_is_refused_then_forced_keeps_every_row(lab):
    status = lab
    fresh_job(status)
    reset_pipeline(status)
    # workers at 10 s a request: generation runs for minutes
    repurpose(json.loads(lab_worker_args("--latency", "10")))
    deadline = time.monotonic() + 120
    while len(generated_rows(status)) < 16:
        assert time.monotonic() < deadline, "no rows generated within 120 s"
        time.sleep(1)

    refused = restore()
    assert refused.rc != 0
    assert re.search(r"still runs .*generate \w+, \d+/100 rows \(\d+\.\d%\)", refused.output), refused.output[-4000:]
    assert "Nothing was stopped" in refused.output
    assert attach(status, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip() == "activating"

    forced = restore(extra={"restore_training_force": True})
    assert forced.rc == 0, forced.output[-6000:]
    kept = generated_rows(status)
    ids = [row["id"] for row in kept]
    assert len(ids) >= 16 and len(ids) == len(set(ids))
    assert held_gpus(status) == ALL_GPUS

    # a later repurpose resumes the same job: every prepared id exactly once, the kept rows among them
    repurpose(json.loads(lab_worker_args("--latency", "0.01")))
    wait_pipeline_finished(status, 900)
    final = [row["id"] for row in generated_rows(status)]
    assert sorted(final) == sorted(prepared_ids(status)) and len(final) == len(set(final))
    assert set(ids) <= set(final)


def test_bad_input_is_caught_before_anything_moves_and_a_dead_start_frees_the_gpus(lab):
    status = lab
    record = stopped_with_record(status)

    data = {"restore_training_dataset": TRAINER_DATA}

    typo = restore(extra=dict(data, restore_training_overrides={"--learning-rate": "1e-5"}))
    assert typo.rc != 0 and "--learning-rate" in typo.output and "Nothing was stopped" in typo.output
    missing = restore(extra={"restore_training_dataset": "/srv/no/such/set"})
    assert missing.rc != 0 and "/srv/no/such/set does not exist in the container" in missing.output
    gone = restore(extra=dict(data, restore_training_checkpoint="/root/dflash/checkpoints/ckpt-step999999.bin"))
    assert gone.rc != 0 and "ckpt-step999999.bin does not exist in the container" in gone.output
    assert "train" not in windows(status)

    attach(status, "mv", RECORD, RECORD + ".aside")
    try:
        none = restore(extra=data)
        assert none.rc != 0 and "no launch record" in none.output
        assert "restore_training_argv, restore_training_cwd and restore_training_user" in none.output
    finally:
        attach(status, "mv", RECORD + ".aside", RECORD)
    assert "train" not in windows(status)

    # a checkpoint that exists but does not load: the job dies at start
    dead = restore(extra=dict(data, restore_training_checkpoint="/etc/hostname"))
    assert dead.rc != 0, dead.output[-4000:]
    assert "cannot load /etc/hostname" in dead.output and "exited with status 2" in dead.output
    assert "GPUs: free again" in dead.output
    assert held_gpus(status) == []

    good = restore(extra=data)
    assert good.rc == 0, good.output[-6000:]
    trains_from(status, record["checkpoint"])
