# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The free/held judgement of ``gpu_free_wait``: option checks, GPU selection, counted memory.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). Pure functions: a ``Sample`` in, a verdict out.
"""

from __future__ import annotations

import fnmatch
import os
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import GPU_UUID_RE, GpuError, GpuInfo, Sample
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import container_vmid_from_cgroup

DEFAULT_IGNORE_PROCESSES = (
    "nvidia-persistenced", "nvidia-powerd", "nv-hostengine", "dcgm-exporter", "nvidia-smi",
    "Xorg", "X", "Xwayland", "gnome-shell", "kwin_x11", "kwin_wayland", "sddm-greeter", "gdm-x-session",
)


def validate_options(gpus: t.Sequence[str], max_used_mib: int, stable_for: int, timeout: float, interval: float,
                     delay: float, container: t.Optional[int]) -> list[str]:
    """Reject bad input before anything is sampled; returns the normalised ``gpus`` list."""
    if max_used_mib < 0:
        raise GpuError("max_used_mib must be >= 0 (MiB per GPU that still counts as free), got %d" % max_used_mib)
    if stable_for < 1:
        raise GpuError("stable_for must be >= 1 (consecutive free samples), got %d" % stable_for)
    if timeout < 0:
        raise GpuError("timeout must be >= 0 seconds, got %s" % timeout)
    if not interval > 0:
        raise GpuError("interval must be > 0 seconds, got %s" % interval)
    if delay < 0:
        raise GpuError("delay must be >= 0 seconds, got %s" % delay)
    if container is not None and not 100 <= container <= 999999999:
        raise GpuError("container must be a Proxmox VMID (100-999999999), got %d" % container)
    out = []
    for raw in gpus:
        item = str(raw).strip()
        if item.isdigit() or GPU_UUID_RE.match(item):
            out.append(item)
        else:
            raise GpuError("gpus: %r is neither a GPU index (0, 1, ...) nor a UUID (GPU-...); "
                           "list them with nvidia-smi -L" % raw)
    return out


def select_gpus(gpus: t.Sequence[GpuInfo], wanted: t.Sequence[str]) -> list[GpuInfo]:
    """The GPUs named by index or UUID (all when ``wanted`` is empty), in the order the backend lists them."""
    if not wanted:
        return list(gpus)
    by_index = {str(g.index): g for g in gpus}
    by_uuid = {g.uuid.lower(): g for g in gpus}
    chosen: dict[int, GpuInfo] = {}
    for item in wanted:
        gpu = by_index.get(item) or by_uuid.get(item.lower())
        if gpu is None:
            raise GpuError("gpus: no GPU %r here; present: %s" % (
                item, ", ".join("%d (%s)" % (g.index, g.uuid) for g in gpus)))
        chosen[gpu.index] = gpu
    return [g for g in gpus if g.index in chosen]


def name_ignored(comm: str, cmdline: t.Sequence[str], ignore: t.Sequence[str]) -> str:
    """The ignore pattern matching this process's name (comm or argv[0] basename), '' when none."""
    names = {comm}
    if cmdline:
        names.add(os.path.basename(cmdline[0]))
    for pattern in ignore:
        if any(fnmatch.fnmatchcase(n, pattern) for n in names if n):
            return pattern
    return ""


def discounted_mib(sample: Sample, ignore: t.Sequence[str], container: t.Optional[int],
                   lookup: t.Callable[[int], t.Optional[t.Any]]) -> dict[str, int]:
    """MiB per GPU UUID that the backend attributes to processes that do not count.

    Those are ignored processes and, with ``container``, processes outside that
    container. Memory nobody is known to own still counts: unknown is never free.
    ``lookup(pid)`` gives the local ``ProcessInfo`` or None (a PID foreign here).
    """
    out: dict[str, int] = {}
    for proc in sample.processes or ():
        if proc.used_mib is None:
            continue
        info = lookup(proc.pid)
        if info is None:
            continue
        skip = bool(name_ignored(info.comm, info.cmdline, ignore))
        if container is not None and container_vmid_from_cgroup(info.cgroup) != container:
            skip = True
        if skip:
            out[proc.gpu_uuid] = out.get(proc.gpu_uuid, 0) + proc.used_mib
    return out


def counted_mib(gpu: GpuInfo, discount: t.Mapping[str, int]) -> int:
    return max(0, gpu.used_mib - discount.get(gpu.uuid, 0))


def judge(gpus: t.Sequence[GpuInfo], discount: t.Mapping[str, int], max_used_mib: int) -> bool:
    """Free when every given GPU's counted memory is at or under the threshold."""
    return all(counted_mib(g, discount) <= max_used_mib for g in gpus)
