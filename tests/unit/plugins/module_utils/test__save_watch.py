"""SaveWatch: one rung's judgement of "a save begun after the signal is still being written", sampled by hand.

The holder of the files is this test process itself (its own /proc fds), so each case is a real file
opened before or after the watch began, with no child process and no clock to race.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import files_open_for_writing
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.save_watch import STEP_SLACK, Grace, SaveWatch


def own_holds() -> set[tuple[int, int, int]]:
    return {(os.getpid(),) + ident for ident in files_open_for_writing(os.getpid())}


def write(handle, data: bytes) -> None:
    handle.write(data)
    handle.flush()


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "ckpt").mkdir()
    return tmp_path / "ckpt"


def test_a_file_opened_and_written_after_the_signal_is_a_save_and_grants_grace(ckpt):
    watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=2.0, max_grace=60))
    watch.start(100.0)
    with open(ckpt / "model.pt.tmp", "wb") as save:
        write(save, b"w" * 4096)
        watch.sample(100.5)
    assert watch.save_seen and not watch.held_open
    assert watch.grace_end(rung_start=100.0, timeout=1.0) == 102.5  # the last change plus stall


def test_a_log_opened_before_the_signal_changing_is_no_save(ckpt):
    with open(ckpt / "train.log", "ab") as log:
        watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=2.0, max_grace=60))
        watch.start(100.0)
        write(log, b"step 7\n")
        watch.sample(100.5)
    assert not watch.save_seen and watch.grace_end(100.0, 1.0) is None


def test_a_save_pausing_with_its_file_open_is_still_waited_for(ckpt):
    watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=0.5, max_grace=60))
    with open(ckpt / "model.pt.tmp", "wb") as save:
        write(save, b"w")
        watch.sample(100.5)
        watch.sample(103.0)  # nothing changed for longer than stall, but the file is still open
    assert watch.held_open and watch.grace_end(100.0, 1.0) == 103.5


def test_a_save_that_closed_and_stopped_changing_grants_nothing_more(ckpt):
    watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=0.5, max_grace=60))
    with open(ckpt / "model.pt.tmp", "wb") as save:
        write(save, b"w")
        watch.sample(100.5)
    watch.sample(103.0)  # closed: neither changed nor held
    assert watch.grace_end(100.0, 1.0) == 101.0  # the grace ended at the last change plus stall


def test_grace_never_passes_max_grace_from_the_rung_start(ckpt):
    watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=5.0, max_grace=3.0))
    with open(ckpt / "model.pt.tmp", "wb") as save:
        write(save, b"w")
        watch.sample(102.0)
    assert watch.grace_end(rung_start=100.0, timeout=1.0) == 103.0


@pytest.mark.parametrize("steps, training", [
    ([40, 40, 40 + STEP_SLACK], False),  # the step in flight at the signal finished: shutting down
    ([40, 41, 40 + STEP_SLACK + 1], True),  # still counting steps: training, whatever it writes
    ([None, 40, 40 + STEP_SLACK + 1], True),  # no step line at the signal: the first one seen is the base
])
def test_a_job_still_counting_steps_gets_no_grace_for_what_it_writes(ckpt, steps, training):
    seen = iter(steps)
    watch = SaveWatch(own_holds, Grace(paths=[str(ckpt)], stall=2.0, max_grace=60, step_probe=lambda: next(seen)))
    with open(ckpt / "ckpt-000041.pt.tmp", "wb") as save:
        write(save, b"w")
        watch.sample(100.5)
        write(save, b"w")
        watch.sample(101.0)
    assert watch.training is training
    assert (watch.grace_end(100.0, 1.0) is None) is training
    assert watch.steps == [next(s for s in steps if s is not None), steps[-1]]


def test_a_grace_without_paths_or_steps_watches_nothing():
    assert not Grace().watches
    assert Grace(paths=["/nonexistent"]).watches and Grace(step_probe=lambda: None).watches
