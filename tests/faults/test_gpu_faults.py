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
from dataclasses import dataclass

import pytest
from fakegpu_harness import NVIDIA_SMI, FakeGpus, module_args_file

from tests.support import faults
from tests.support.faults import Fault
from tests.support.paths import COLLECTIONS

MODULE = "ansible_collections.gpuops.repurpose.plugins.modules.gpu_free_wait"

pytestmark = pytest.mark.timeout(120)

# the wait's own bound (one nvidia-smi call is bounded by the wait's time left); the call to the driver hung at
# MID_WAIT_S still gets the 5 s a working call may take, so its timeout is the hang, not the wait's end
TIMEOUT = 10
# what the module documents: calls are cut to end by TIMEOUT into the wait, each still gets at least 0.5 s,
# so a hung driver can hold the wait past TIMEOUT by that 0.5 s and the sample's own handling
WAIT_BOUND_S = TIMEOUT + 1
MID_WAIT_S = 1.5  # the point: several samples taken with GPU 3 held


@dataclass
class Wait:
    """One point's context: the fake GPUs, a scratch directory, the ledger."""

    fake: FakeGpus
    tmp_path: object
    figures: faults.Figures


@dataclass(frozen=True)
class Result:
    """What the wait returned (its JSON result) and how long the module process ran."""

    out: dict
    waited: float


def module_cmd(fake, tmp_path, **args) -> list:
    """The module as Ansible runs it on a target: ``python -m MODULE ARGS.json``."""
    args.setdefault("nvidia_smi_path", NVIDIA_SMI)
    args.setdefault("device_paths", [fake.device_glob])
    path = module_args_file(str(tmp_path / ("args-%d.json" % time.monotonic_ns())), **args)
    return [sys.executable, "-m", MODULE, path]


def mid_wait(**mode):
    """The injector: the fake driver switched to MODE once the wait has sampled MID_WAIT_S with GPU 3 held."""

    def inject(ctx: Wait) -> Result:
        fake = ctx.fake
        holder = fake.hold([3], mib=80000)
        try:
            t0 = time.monotonic()
            proc = subprocess.Popen(module_cmd(fake, ctx.tmp_path, timeout=TIMEOUT, interval=0.2),
                                    env=dict(fake.env, PYTHONPATH=str(COLLECTIONS)), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(MID_WAIT_S)
            assert proc.poll() is None, "the wait ended before the fault"
            fake.config(**mode)
            out, _err = proc.communicate(timeout=TIMEOUT + 30)
            return Result(json.loads(out[out.index("{"):]), time.monotonic() - t0)
        finally:
            fake.kill(holder)
            fake.config(mode="ok")

    return inject


def within_bound(ctx: Wait, name: str, result: Result) -> None:
    """The wait's own span (the module's elapsed, what its timeout bounds) held to its bound; the process start-up
    and the result's printing around it are not the wait (about 0.3 s here)."""
    ctx.figures.wait(name, result.out.get("elapsed", result.waited), WAIT_BOUND_S)


def gpu_lost_reported(ctx: Wait, result: Result) -> None:
    out = result.out
    within_bound(ctx, "GPU lost during gpu_free_wait", result)
    assert out["failed"] and out["free"] is False, out.get("msg")
    assert "a GPU has fallen off the bus" in out["msg"] and "GPU is lost" in out["msg"], out["msg"]
    assert result.waited < TIMEOUT / 2, f"the lost GPU was noticed only after {result.waited:.1f} s"
    # the failure reports the samples it took and the time it waited
    assert out["samples"] >= 2 and out["elapsed"] >= 1.0, out


def hang_reported(ctx: Wait, result: Result) -> None:
    out = result.out
    within_bound(ctx, "driver hangs during gpu_free_wait", result)
    assert out["failed"] and out["free"] is False, out
    assert "did not answer within" in out["msg"] and "hung driver or lost GPU?" in out["msg"], out["msg"]
    # the span the module reports is the one the test saw it run, less start-up: it is not measured short
    assert out["elapsed"] <= result.waited, (out["elapsed"], result.waited)


FAULTS = [
    Fault("a GPU falls off the bus", "mid-wait", mid_wait(mode="gpu_lost", lost_gpus=[3]), gpu_lost_reported),
    Fault("the driver hangs", "mid-wait", mid_wait(mode="hang", hang_seconds=600), hang_reported),
]


@pytest.fixture
def fake(tmp_path):
    gpus = FakeGpus(str(tmp_path), release_delay=0.5)
    yield gpus
    gpus.close()


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_fault_mid_wait(row, fake, tmp_path, figures):
    faults.run(figures, row, Wait(fake, tmp_path, figures))
