"""Faults under ``gpu_free_wait`` while it waits (not before it starts): a GPU falls off the bus, the
driver hangs. The real module as Ansible runs it, the fake GPUs' real driver daemon and a real holder.

Each fault lands mid-wait (after the module has taken samples, with memory still held); the module
must fail clearly (the reason, never "freed") well inside its own bound, not sit out ``timeout``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from fakegpu_harness import NVIDIA_SMI, FakeGpus, module_args_file

from tests.support.paths import COLLECTIONS

MODULE = "ansible_collections.gpuops.repurpose.plugins.modules.gpu_free_wait"


def module_cmd(fake, tmp_path, **args) -> list:
    """The module as Ansible runs it on a target: ``python -m MODULE ARGS.json``."""
    args.setdefault("nvidia_smi_path", NVIDIA_SMI)
    args.setdefault("device_paths", [fake.device_glob])
    path = module_args_file(str(tmp_path / ("args-%d.json" % time.monotonic_ns())), **args)
    return [sys.executable, "-m", MODULE, path]


pytestmark = pytest.mark.timeout(120)

TIMEOUT = 8  # the wait's own bound (one nvidia-smi call is bounded by the wait's time left)
# what the module documents: calls are cut to end by TIMEOUT into the wait, each still gets at least 0.5 s,
# so a hung driver can hold the wait past TIMEOUT by that 0.5 s and the sample's own handling
WAIT_BOUND_S = TIMEOUT + 1


@pytest.fixture
def fake(tmp_path):
    gpus = FakeGpus(str(tmp_path), release_delay=0.5)
    yield gpus
    gpus.close()


def wait_mid_fault(fake, tmp_path, figures, name: str, **mode) -> tuple[dict, float]:
    holder = fake.hold([3], mib=80000)
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen(module_cmd(fake, tmp_path, timeout=TIMEOUT, interval=0.2),
                                env=dict(fake.env, PYTHONPATH=str(COLLECTIONS)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)  # several samples with GPU 3 held
        assert proc.poll() is None, "the wait ended before the fault"
        fake.config(**mode)
        if figures is not None:
            figures.injected(name)
        out, err = proc.communicate(timeout=TIMEOUT + 30)
        waited = time.monotonic() - t0
        result = json.loads(out[out.index("{"):])
        if figures is not None:
            # the wait's own span (the module's elapsed, what its timeout bounds); the process start-up and
            # the result's printing around it are not the wait (about 0.3 s here)
            figures.wait(name, result.get("elapsed", waited), WAIT_BOUND_S)
        return result, waited
    finally:
        fake.kill(holder)
        fake.config(mode="ok")


def test_gpu_falls_off_the_bus_mid_wait(fake, tmp_path, figures):
    name = "GPU lost during gpu_free_wait"
    out, waited = wait_mid_fault(fake, tmp_path, figures, name, mode="gpu_lost", lost_gpus=[3])
    assert out["failed"] and out["free"] is False, out.get("msg")
    assert "a GPU has fallen off the bus" in out["msg"] and "GPU is lost" in out["msg"], out["msg"]
    assert waited < TIMEOUT / 2, f"the lost GPU was noticed only after {waited:.1f} s"
    figures.survived(name)


def test_failure_mid_wait_reports_the_samples_it_took(fake, tmp_path):
    out, waited = wait_mid_fault(fake, tmp_path, None, "GPU lost during gpu_free_wait (report)",
                                 mode="gpu_lost", lost_gpus=[3])
    assert out["samples"] >= 2 and out["elapsed"] >= 1.0, out


def test_driver_hangs_mid_wait(fake, tmp_path, figures):
    name = "driver hangs during gpu_free_wait"
    out, waited = wait_mid_fault(fake, tmp_path, figures, name, mode="hang", hang_seconds=600)
    assert out["failed"] and out["free"] is False, out
    assert "did not answer within" in out["msg"] and "hung driver or lost GPU?" in out["msg"], out["msg"]
    # one nvidia-smi call is bounded: the wait ends, never hangs (its exact bound: the test below)
    assert waited < 2 * TIMEOUT + 2, f"a hung driver held the wait for {waited:.1f} s"
    figures.survived(name)


def test_driver_hang_keeps_the_wait_inside_its_timeout(fake, tmp_path):
    out, waited = wait_mid_fault(fake, tmp_path, None, "driver hangs during gpu_free_wait (bound)",
                                 mode="hang", hang_seconds=600)
    assert waited <= WAIT_BOUND_S, f"the wait took {waited:.1f} s, its timeout is {TIMEOUT} s"
