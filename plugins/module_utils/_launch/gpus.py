# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPUs a started job must hold: named by index or UUID, and watched until its processes hold them.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). An unknown GPU is a
:class:`GpuError` naming the ``gpus`` option, raised before anything starts.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.holders import (
    backend_pids_are_ours,
    classify_holders,
    device_gpu_index,
    device_identities,
    scan_holders,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import DEFAULT_IGNORE_PROCESSES
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import GpuError, GpuInfo, GpuProcess, Holder
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvml import open_backend
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline


@dataclass(frozen=True)
class GpuTarget:
    wanted: str  # as the gpus option gives it
    index: int | None
    uuid: str | None


def resolve_gpus(wanted: t.Sequence[str], backend_gpus: t.Sequence[GpuInfo] | None,
                 device_indices: t.Collection[int], devices_text: str) -> list[GpuTarget]:
    """Each expected GPU by index and UUID. Without a backend (no NVML, no nvidia-smi) only indices can be named,
    and each must have a device file among gpu_devices; an unknown GPU is an error before anything moves."""
    targets = []
    for item in wanted:
        item = str(item).strip()
        if backend_gpus is not None:
            gpu = next((g for g in backend_gpus if str(g.index) == item or g.uuid.lower() == item.lower()), None)
            if gpu is None:
                raise GpuError("gpus: no GPU %r here; present: %s" % (
                    item, ", ".join("%d (%s)" % (g.index, g.uuid) for g in backend_gpus) or "none"))
            targets.append(GpuTarget(item, gpu.index, gpu.uuid))
        elif item.isdigit():
            if int(item) not in device_indices:
                raise GpuError("gpus: no device file for GPU %s among gpu_devices (%s)" % (item, devices_text))
            targets.append(GpuTarget(item, int(item), None))
        else:
            raise GpuError("gpus: %r is not an index, and neither NVML nor nvidia-smi answers here to map a UUID to "
                           "one; name the GPUs by index (checked through gpu_devices)" % item)
    return targets


def gpus_held(targets: t.Sequence[GpuTarget], tree: t.Collection[int], holders: t.Sequence[Holder],
              backend_processes: t.Sequence[GpuProcess]) -> list[dict[str, t.Any]]:
    """The expected GPUs that the job's processes hold: a device file open (``/dev/nvidiaN``), or listed on the GPU
    by NVML / nvidia-smi (where its PIDs are ours), with the PIDs and how it was seen."""
    held = []
    for target in targets:
        by_device = {h.pid for h in holders if h.pid in tree and target.index is not None and h.gpu == target.index}
        by_backend = {p.pid for p in backend_processes if p.pid in tree and target.uuid and p.gpu_uuid == target.uuid}
        if by_device or by_backend:
            held.append({"gpu": target.wanted, "index": target.index, "uuid": target.uuid,
                         "pids": sorted(by_device | by_backend),
                         "via": sorted((["device"] if by_device else []) + (["backend"] if by_backend else []))})
    return held


def busy_holders(targets: t.Sequence[GpuTarget], holders: t.Sequence[Holder]) -> list[Holder]:
    """Processes already holding an expected GPU before the launch: the new job would fail on it, or share it."""
    indices = {target.index for target in targets}
    return [h for h in holders if h.gpu is not None and h.gpu in indices]


class GpuWatch:
    """Samples who holds the expected GPUs: the device-file scan first, the backend only when that is not enough."""

    def __init__(self, wanted: t.Sequence[str], patterns: t.Sequence[str]) -> None:
        self.patterns = list(patterns)
        self.notes: list[str] = []
        self.backend: t.Any = None
        self.targets: list[GpuTarget] = []
        self.deadline: Deadline | None = None  # the wait's, once it runs
        if not wanted:
            return
        gpus = None
        try:
            self.backend = open_backend("auto", "nvidia-smi", call_timeout=self.call_timeout)
            gpus = list(self.backend.sample().gpus)
        except GpuError as exc:
            self.close()
            self.notes.append("GPUs checked through gpu_devices only (no NVML or nvidia-smi answer: %s)" % exc)
        devices = device_identities(self.patterns)
        indices = {i for i in (device_gpu_index(path) for path in devices.values()) if i is not None}
        self.targets = resolve_gpus(wanted, gpus, indices, "%s matched %s" % (
            ", ".join(self.patterns), ", ".join(sorted(devices.values())) or "nothing"))

    def call_timeout(self) -> float:
        """Seconds one nvidia-smi call may take: never past the wait's deadline (30 s before the wait starts)."""
        return 30.0 if self.deadline is None else max(0.5, min(30.0, self.deadline.remaining()))

    def holders(self) -> list[Holder]:
        """Every process holding a device file of gpu_devices, driver tools (nvidia-smi, ...) left out."""
        found = scan_holders(self.patterns, exclude_pids={os.getpid()})
        return classify_holders(found, None, DEFAULT_IGNORE_PROCESSES, None)[0]

    def held(self, tree: t.Collection[int]) -> list[dict[str, t.Any]]:
        holders = self.holders()
        held = gpus_held(self.targets, tree, holders, ())
        if len(held) == len(self.targets) or self.backend is None or not backend_pids_are_ours():
            return held
        try:
            sample = self.backend.sample()
            sample.ensure_processes()
        except GpuError as exc:
            self.notes.append("GPU backend failed (%s); GPUs checked through gpu_devices only from then on" % exc)
            self.close()
            return held
        return gpus_held(self.targets, tree, holders, sample.processes or ())

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
