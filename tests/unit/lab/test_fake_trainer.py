"""The fake trainer's behaviours, under real signals (real processes, no module involved)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import fake_trainer
import pytest
from trainer_harness import (
    TRAINER,
    Trainer,
    alive,
    latest_checkpoint,
    verify_checkpoint,
)

from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]


@pytest.fixture
def job(tmp_path):
    started = []

    def make(behaviour, **kwargs):
        trainer = Trainer(str(tmp_path), behaviour, **kwargs)
        started.append(trainer)
        return trainer.start()

    yield make
    for trainer in started:
        trainer.cleanup()


def test_checkpoint_roundtrip_and_torn_file_detected(tmp_path):
    path = fake_trainer.write_checkpoint(str(tmp_path), 700)
    assert verify_checkpoint(path) == 700
    assert latest_checkpoint(str(tmp_path)) == (path, 700)
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="torn|checksum"):
        verify_checkpoint(path)


def test_shape_launcher_and_workers_in_their_own_sessions(job):
    trainer = job("graceful", nproc=3)
    launcher = trainer.launcher()
    workers = trainer.workers()
    assert len(workers) == 3
    for pid in workers:
        with open("/proc/%d/stat" % pid) as handle:
            rest = handle.read().rsplit(")", 1)[1].split()
        ppid, pgid, sid = int(rest[1]), int(rest[2]), int(rest[3])
        assert ppid == launcher
        assert pgid == sid == pid  # setsid: Ctrl-C in the launcher's terminal never reaches them
    assert "step 682 | 21.5 Ktok/s | loss" in trainer.log()


def test_graceful_sigint_to_launcher_checkpoints_and_exits(job):
    trainer = job("graceful")
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=20) == 0
    wait_for(lambda: not trainer.workers(), 10, what="workers gone", interval=0.02)
    path, step = latest_checkpoint(trainer.ckpt_dir)
    assert step >= 682 and "saved %s" % path in trainer.log()


def test_slow_checkpoint_file_keeps_growing_while_saving(job):
    trainer = job("slow_checkpoint", extra=["--checkpoint-seconds", "2"])
    trainer.proc.send_signal(signal.SIGTERM)

    def tmp_file():
        names = [n for n in os.listdir(trainer.ckpt_dir) if n.endswith(".tmp")]
        return os.path.join(trainer.ckpt_dir, names[0]) if names else None

    tmp = wait_for(tmp_file, 10, what="checkpoint .tmp", interval=0.02)
    sizes = []
    for _sample in range(4):
        try:
            sizes.append(os.path.getsize(tmp))
        except FileNotFoundError:
            break
        time.sleep(0.3)
    assert len(sizes) >= 2 and sizes[-1] > sizes[0], sizes
    assert trainer.proc.wait(timeout=20) == 0
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_a_slow_save_keeps_to_its_seconds_when_every_sleep_overruns(tmp_path, monkeypatch):
    # A loaded or CPU-throttled machine wakes each sleeper late. Paced per chunk, 10 chunks each
    # 0.3 s late made a 1 s save take 4 s; in the lab a 20 s save grew past torchrun's 30 s
    # teardown, which then killed it mid-save. Paced against one clock, only the last overrun counts.
    late = 0.3
    real_sleep = time.sleep
    monkeypatch.setattr(fake_trainer.time, "sleep", lambda seconds: real_sleep(seconds + late if seconds > 0 else 0))
    started = time.monotonic()
    path = fake_trainer.write_checkpoint(str(tmp_path), 700, seconds=1.0)
    took = time.monotonic() - started
    assert verify_checkpoint(path) == 700
    # paced: about 1 s + one overrun (1.3 s); per chunk it would be 1 s + 10 overruns (4 s)
    assert 1.0 <= took < 1.0 + 5 * late, took


def test_teardown_past_its_wait_kills_a_saving_worker_with_torchruns_line(job):
    trainer = job("slow_checkpoint", nproc=2, extra=["--checkpoint-seconds", "30", "--teardown-seconds", "1"])
    rank0 = trainer.worker_of_rank(0)
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=20) == 0
    assert "Unable to shutdown process %d via SIGTERM, forcefully exiting via SIGKILL" % rank0 in trainer.log()
    assert [n for n in os.listdir(trainer.ckpt_dir) if n.endswith(".tmp")], "the killed save left no .tmp"


def test_stubborn_workers_ignore_int_and_term_only_kill_ends_them(job):
    trainer = job("stubborn")
    workers = trainer.workers()
    trainer.proc.send_signal(signal.SIGINT)
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    steps_before = trainer.log().count("step ")
    wait_for(lambda: trainer.log().count("step ") > steps_before + 2, 10, what="steps continuing", interval=0.02)
    assert all(alive(pid) for pid in workers)
    assert trainer.proc.poll() is None  # the launcher waits forever
    trainer.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert trainer.proc.poll() is None
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert trainer.proc.wait(timeout=10) == 0  # its wait ends once they are gone


def test_orphans_launcher_exits_workers_live_on_reparented(job):
    trainer = job("orphans")
    workers = trainer.workers()
    launcher = trainer.proc.pid
    trainer.proc.send_signal(signal.SIGINT)
    assert trainer.proc.wait(timeout=10) == 0
    assert all(alive(pid) for pid in workers)
    for pid in workers:
        with open("/proc/%d/stat" % pid) as handle:
            assert int(handle.read().rsplit(")", 1)[1].split()[1]) != launcher
    for pid in workers:
        os.kill(pid, signal.SIGTERM)  # they still stop gracefully
    wait_for(lambda: not any(alive(pid) for pid in workers), 10, what="orphans gone", interval=0.02)
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_respawn_restarts_dead_workers_ignores_sigint_stops_on_sigterm(job):
    trainer = job("respawn")
    victim = trainer.workers()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(trainer.restarts()) == 1 and len(trainer.workers()) == 2 and victim not in trainer.workers(),
             10, what="respawn", interval=0.02)
    trainer.proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert trainer.proc.poll() is None and len(trainer.workers()) == 2
    trainer.proc.send_signal(signal.SIGTERM)
    assert trainer.proc.wait(timeout=20) == 0
    wait_for(lambda: not trainer.workers(), 10, what="workers gone", interval=0.02)
    assert len(trainer.restarts()) == 1


def test_workers_hold_fake_gpus(tmp_path):
    fakegpu = os.path.join(os.path.dirname(TRAINER), "..", "fakegpu", "fakegpu.py")
    if not os.path.exists(fakegpu):
        pytest.skip("tests/lab/fakegpu/fakegpu.py is not there")
    env = dict(os.environ, FAKEGPU_DIR=str(tmp_path / "fakegpu"))
    subprocess.run([sys.executable, fakegpu, "init", "--count", "2", "--release-delay", "0"], env=env, check=True)
    old = os.environ.get("FAKEGPU_DIR")
    os.environ["FAKEGPU_DIR"] = env["FAKEGPU_DIR"]
    trainer = Trainer(str(tmp_path), "graceful", nproc=2, gpu=True, extra=["--gpu-mib", "1234"])
    try:
        trainer.start()
        state = json.loads(subprocess.run([sys.executable, fakegpu, "state"], env=env, check=True,
                                          capture_output=True, text=True).stdout)
        held = sorted((a["gpu"], a["mib"]) for a in state["allocations"] if a["state"] == "alive")
        assert held == [(0, 1234), (1, 1234)]
        trainer.proc.send_signal(signal.SIGINT)
        trainer.proc.wait(timeout=20)
    finally:
        trainer.cleanup()
        if old is None:
            os.environ.pop("FAKEGPU_DIR")
        else:
            os.environ["FAKEGPU_DIR"] = old
