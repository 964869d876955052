# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runner of ``gpu_free_wait``: options in, the module's result out.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). :func:`wait_free` opens a
backend (``_gpu.nvml``), samples until the judgement (``_gpu.judge``) says free
or the wait (``_wait.Waiter``) ends, and names the holders (``_gpu.holders``).
Nothing here signals a process.
"""

from __future__ import annotations

import os
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.holders import (
    backend_pids_are_ours,
    classify_holders,
    merge_backend_processes,
    scan_holders,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import (
    counted_mib,
    discounted_mib,
    judge,
    select_gpus,
    validate_options,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    WORKING_CALL_S,
    GpuError,
    GpuInfo,
    GpuTimeout,
    Holder,
    Sample,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvml import open_backend
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_process
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import (
    CheckModeWaiter,
    SampleCut,
    Waiter,
    WaitResult,
)


def nvidia_smi_call_bound(timeout: float, elapsed: float) -> float:
    """Seconds one ``nvidia-smi`` call may take, ELAPSED seconds into a wait of TIMEOUT.

    A call gets min(30, max(5, timeout)): a working nvidia-smi on a node without persistence mode can take
    seconds, so a shorter bound calls a slow driver hung (timeout 0, one sample, once allowed only 0.5 s).
    Calls are cut so that they end by max(timeout, 5) s into the wait (never below 0.5 s): a hung driver
    cannot hold the wait past that.
    """
    per_call = min(30.0, max(WORKING_CALL_S, timeout))
    return round(max(0.5, min(per_call, max(timeout, per_call) - elapsed)), 1)


def cut_or_hung(fn: t.Callable[..., t.Any]) -> t.Callable[..., t.Any]:
    """FN, where a backend call that timed out is a hung driver (GpuTimeout) only when it had the time a working
    call may need; one the wait's end cut shorter ends the wait as timed out (SampleCut)."""

    def call(*args: t.Any) -> t.Any:
        try:
            return fn(*args)
        except GpuTimeout as exc:
            if exc.proves_hang:
                raise
            raise SampleCut("the last nvidia-smi call was cut at the wait's end (%s)" % exc) from exc

    return call


def no_process(pid: int) -> None:
    """The lookup where no backend PID names a process here (see ``backend_pids_are_ours``)."""
    return None


def classified(found: list[Holder], p: t.Mapping[str, t.Any], sample: Sample,
               selected: t.Sequence[GpuInfo]) -> tuple[list[Holder], list[Holder], list[dict]]:
    """(counted, ignored, foreign) holders: the /proc scan merged with the backend's process list."""
    if found:
        sample.ensure_processes()  # MiB per holder, where the backend knows it
    found, foreign = merge_backend_processes(found, sample, sample.gpus, read_process, backend_pids_are_ours())
    counted, ignored = classify_holders(found, selected, p["ignore_processes"], p["container"], read_process)
    return counted, ignored, foreign


def gpu_report(first: Sample, last: Sample, selected: t.Sequence[GpuInfo], discount: t.Mapping[str, int],
               max_used_mib: int) -> list[dict]:
    """RV(gpus): per selected GPU, memory before and after and whether it counts as free."""
    before = {g.index: g for g in first.gpus}
    out = []
    for g in last.gpus:
        if g.index not in {s.index for s in selected}:
            continue
        counted = counted_mib(g, discount)
        out.append({"index": g.index, "uuid": g.uuid, "name": g.name, "bus_id": g.bus_id,
                    "memory_total_mib": g.total_mib,
                    "memory_used_mib_before": before[g.index].used_mib if g.index in before else None,
                    "memory_used_mib_after": g.used_mib, "memory_counted_mib_after": counted,
                    "free": counted <= max_used_mib})
    return out


def timeout_msg(p: t.Mapping[str, t.Any], result: WaitResult, report: t.Sequence[dict], counted: t.Sequence[Holder],
                foreign: t.Sequence[dict]) -> str:
    busy = [g for g in report if not g["free"]]
    msg = "GPU memory not released within %s s (%d samples, max_used_mib %d): %s." % (
        p["timeout"], result.samples, p["max_used_mib"],
        ", ".join("GPU %d %d MiB" % (g["index"], g["memory_counted_mib_after"]) for g in busy))
    if counted:
        msg += " Holders: " + "; ".join(h.describe() for h in counted) + "."
    else:
        msg += (" No process here has a GPU device file open (%s): the memory is held from outside this"
                " PID namespace (run on the PVE host, optionally with container) or by the driver." % ", ".join(p["device_paths"]))
    if foreign:
        msg += " The backend lists PIDs foreign to this namespace: %s." % ", ".join(
            "%d (%s, %s MiB)" % (f["pid"], f["gpu_uuid"], f["used_mib"]) for f in foreign)
    if result.cut:
        msg += " The figures are the last whole sample's: %s." % result.cut
    return msg + " Nothing was signalled."


def wait_free(p: t.Mapping[str, t.Any], check_mode: bool = False,
              warn: t.Callable[[str], None] = lambda msg: None) -> dict[str, t.Any]:
    """Run ``gpu_free_wait`` with its (already type-checked) options.

    Returns the module's result; on failure it has ``failed=True`` and ``msg``. ``warn`` receives what the
    module should warn about (GPUs free, but device files still open).
    """
    backend = None
    waiter: Waiter = CheckModeWaiter() if check_mode else Waiter(
        timeout=p["timeout"], interval=p["interval"], delay=p["delay"], stable_for=p["stable_for"])
    try:
        wanted = validate_options(p["gpus"], p["max_used_mib"], p["stable_for"], p["timeout"], p["interval"],
                                  p["delay"], p["container"])
        backend = open_backend(p["backend"], p["nvidia_smi_path"],
                               call_timeout=lambda: nvidia_smi_call_bound(p["timeout"], waiter.elapsed()))
        last_discount: dict[str, int] = {}

        def free_fn(sample: Sample) -> tuple[bool, dict[int, int]]:
            selected = select_gpus(sample.gpus, wanted)
            discount: dict[str, int] = {}
            if not judge(selected, discount, p["max_used_mib"]):
                # only memory held by ignored or out-of-scope processes can still make it free
                sample.ensure_processes()
                # inside a container the backend's PIDs are the host's: none names a process here, so none is
                # discounted by a coincidental local match (unknown memory counts)
                discount = discounted_mib(sample, p["ignore_processes"], p["container"],
                                          read_process if backend_pids_are_ours() else no_process)
            last_discount.clear()
            last_discount.update(discount)
            return judge(selected, discount, p["max_used_mib"]), {g.index: counted_mib(g, discount) for g in selected}

        holders_before = scan_holders(p["device_paths"], exclude_pids={os.getpid()})
        result = waiter.wait(cut_or_hung(backend.sample), cut_or_hung(free_fn))
        selected = select_gpus(result.last.gpus, wanted)
        counted, ignored, foreign = classified(scan_holders(p["device_paths"], exclude_pids={os.getpid()}),
                                               p, result.last, selected)
        before = classified(holders_before, p, result.first, select_gpus(result.first.gpus, wanted))[0]
        report = gpu_report(result.first, result.last, selected, last_discount, p["max_used_mib"])
        notes = list(getattr(backend, "notes", [])) + [n for n in result.last.notes if n]
    except (GpuError, SampleCut) as exc:
        # a cut before any whole sample leaves nothing to judge by: the cut call's own timeout is the failure
        reason = exc.__cause__ if isinstance(exc, SampleCut) else exc
        return dict(failed=True, msg=str(reason), free=False, elapsed=round(waiter.elapsed(), 3),
                    samples=waiter.samples, backend_notes=[])
    finally:
        if backend is not None:
            backend.close()

    first_free = result.history[0]["free"] if result.history else result.free
    out = dict(
        free=result.free,
        changed=bool(result.free and not first_free and not check_mode),
        backend=result.last.backend,
        backend_notes=notes,
        gpus=report,
        holders=[h.as_dict() for h in counted],
        holders_before=[h.as_dict() for h in before],
        ignored_holders=[h.as_dict() for h in ignored],
        foreign_processes=foreign,
        elapsed=round(result.elapsed, 3),
        samples=result.samples,
        history=result.history,
    )
    if check_mode:
        out["msg"] = "check mode: GPUs %s" % ("free" if result.free else "busy; a real run would wait up to %s s" % p["timeout"])
        return out
    if not result.free:
        return dict(out, failed=True, msg=timeout_msg(p, result, report, counted, foreign))
    if counted:
        warn("GPU memory is released but these processes still have GPU device files open: %s"
             % "; ".join(h.describe() for h in counted))
    return out
