"""The lab's signal audit on real processes: what the fake trainer and the networkd-dispatcher decoy
record is exactly what they were sent, and their behaviour under each signal is unchanged."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from signal_audit import ENV, read_audit
from trainer_harness import PYTHON, Trainer, alive

from tests.support.paths import LAB_DIR
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]


def by_pid(directory: str) -> dict[int, dict]:
    return {rec["pid"]: rec for rec in read_audit(directory)}


@pytest.fixture
def audit_env(tmp_path, monkeypatch):
    directory = str(tmp_path / "signals")
    monkeypatch.setenv(ENV, directory)
    return directory


def test_stubborn_workers_record_the_ignored_sigterm_and_the_launcher_its_stop(tmp_path, audit_env):
    trainer = Trainer(str(tmp_path), "stubborn", nproc=2).start()
    try:
        workers = trainer.workers()
        launcher = trainer.launcher()
        os.kill(workers[0], signal.SIGTERM)
        wait_for(lambda: by_pid(audit_env).get(workers[0], {}).get("signals") == ["SIGTERM"], 10, what="record", interval=0.02)
        assert alive(workers[0]), "a stubborn worker ignores SIGTERM, audited or not"
        os.kill(launcher, signal.SIGINT)
        # the launcher forwards SIGTERM to each worker (torchrun's teardown), and both are recorded
        wait_for(lambda: all(by_pid(audit_env).get(w, {}).get("signals", [])[-1:] == ["SIGTERM"]
                             and len(by_pid(audit_env)[w]["signals"]) == (2 if w == workers[0] else 1)
                             for w in workers), 10, what="forwarded SIGTERM recorded", interval=0.02)
        got = by_pid(audit_env)
        assert got[launcher]["role"] == "launcher" and got[launcher]["signals"] == ["SIGINT"]
        assert {got[w]["role"] for w in workers} == {"worker-0", "worker-1"}
        assert all(got[w]["start"] > 0 and got[w]["boot_id"] for w in workers)
    finally:
        trainer.cleanup()


def test_graceful_worker_stops_after_its_record(tmp_path, audit_env):
    trainer = Trainer(str(tmp_path), "graceful", nproc=1).start()
    try:
        worker = trainer.workers()[0]
        os.kill(worker, signal.SIGTERM)
        wait_for(lambda: not alive(worker), 10, what="graceful worker exit", interval=0.02)
        assert by_pid(audit_env)[worker]["signals"] == ["SIGTERM"]
    finally:
        trainer.cleanup()


def test_decoy_records_sighup_ignored_and_sigterm_ends_it(tmp_path, audit_env):
    script = str(LAB_DIR / "decoys" / "networkd-dispatcher.py")
    env = dict(os.environ)  # the decoy finds the audit module next to its source (in the lab: /opt/lab/trainer)
    proc = subprocess.Popen([PYTHON, script, "--run-startup-triggers"], env=env, start_new_session=True)
    try:
        wait_for(lambda: proc.pid in by_pid(audit_env), 10, what="decoy up", interval=0.02)
        assert by_pid(audit_env)[proc.pid]["signals"] == []
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: by_pid(audit_env)[proc.pid]["signals"] == ["SIGHUP"], 10, what="SIGHUP recorded", interval=0.02)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert by_pid(audit_env)[proc.pid]["signals"] == ["SIGHUP", "SIGTERM"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_no_audit_without_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    trainer = Trainer(str(tmp_path), "graceful", nproc=1).start()
    try:
        assert not any(name.endswith(".jsonl") for _d, _s, files in os.walk(tmp_path) for name in files)
    finally:
        trainer.cleanup()
