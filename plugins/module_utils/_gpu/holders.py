# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Who holds the GPUs: a ``/proc`` scan for open NVIDIA device files (what ``fuser -v /dev/nvidia*`` does),
merged with the backend's process list and split into counted and ignored holders.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). It never signals a process.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat as stat_mod
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import name_ignored
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import GpuInfo, Holder, Sample
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    container_vmid_from_cgroup,
    fd_links,
    list_pids,
    parse_systemd_unit,
    read_process,
)

DEFAULT_DEVICE_PATHS = ("/dev/nvidia*",)
# The inode of the kernel's initial PID namespace (include/linux/proc_ns.h PROC_PID_INIT_INO). The driver (NVML,
# nvidia-smi) reports PIDs in that namespace; in any other (inside a container) a backend PID is another
# process's number, and an equal PID here is a coincidence, never the same process.
PROC_PID_INIT_INO = 0xEFFFFFFC


def backend_pids_are_ours(ns_path: str = "/proc/self/ns/pid") -> bool:
    """Whether this process runs in the initial PID namespace, where the driver's PIDs name our processes."""
    try:
        return os.stat(ns_path).st_ino == PROC_PID_INIT_INO
    except OSError:
        return False


_DEV_INDEX_RE = re.compile(r"nvidia(\d+)$")


def _identity(st: os.stat_result) -> tuple:
    if stat_mod.S_ISCHR(st.st_mode):
        return ("chr", st.st_rdev)
    return ("file", st.st_dev, st.st_ino)


def device_identities(patterns: t.Sequence[str]) -> dict[tuple, str]:
    """The device files the patterns name here, keyed by identity (char device number, or inode)."""
    import glob

    ids: dict[tuple, str] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                ids.setdefault(_identity(os.stat(path)), path)
            except OSError:
                continue
    return ids


def device_gpu_index(path: str) -> t.Optional[int]:
    match = _DEV_INDEX_RE.search(path)
    return int(match.group(1)) if match else None


def _container_of(info: t.Any) -> tuple[t.Optional[int], t.Optional[int]]:
    """(VMID from the cgroup path, PID in the innermost PID namespace); each None where it does not apply."""
    inner = info.nspid[-1] if len(info.nspid) > 1 else None
    return container_vmid_from_cgroup(info.cgroup), inner


def scan_holders(patterns: t.Sequence[str] = DEFAULT_DEVICE_PATHS, proc_root: str = "/proc",
                 exclude_pids: t.Collection[int] = ()) -> list[Holder]:
    """Every process with a matching device file open, one entry per (pid, GPU).

    A fd counts when it is the same file as a device the patterns name here
    (so a bind mount seen under another path in a container still matches),
    or when its path matches a pattern (the device exists only in the
    process's own mount namespace). Processes vanishing mid-scan are skipped.
    """
    ids = device_identities(patterns)
    base_globs = {os.path.basename(p) for p in patterns}
    holders: list[Holder] = []
    for pid in list_pids(proc_root):
        if pid in exclude_pids:
            continue
        devices: dict[t.Optional[int], str] = {}
        for fd_path, target in fd_links(pid, proc_root):
            if not any(fnmatch.fnmatchcase(os.path.basename(target), g) for g in base_globs):
                continue
            device = None
            try:
                device = ids.get(_identity(os.stat(fd_path)))
            except OSError:
                pass
            if device is None and any(fnmatch.fnmatchcase(target, p) for p in patterns):
                device = target
            if device is not None:
                devices.setdefault(device_gpu_index(device), device)
        if not devices:
            continue
        info = read_process(pid, proc_root)
        if info is None:
            continue
        vmid, inner = _container_of(info)
        gpus = sorted(g for g in devices if g is not None) or [None]
        for gpu in gpus:
            holders.append(Holder(pid=pid, name=info.comm, cmdline=info.command, gpu=gpu,
                                  device=devices.get(gpu, devices.get(None, "")), container=vmid,
                                  container_pid=inner, unit=parse_systemd_unit(info.cgroup)))
    return holders


def merge_backend_processes(holders: list[Holder], sample: t.Optional[Sample], gpus: t.Sequence[GpuInfo],
                            lookup: t.Callable[[int], t.Optional[t.Any]],
                            pids_are_ours: bool = True) -> tuple[list[Holder], list[dict]]:
    """Attach backend MiB to /proc holders and add backend processes the scan could not see.

    Returns (holders, foreign): ``foreign`` are backend PIDs that name no process here: they do not exist in
    this PID namespace, or (PIDS_ARE_OURS false: :func:`backend_pids_are_ours`, inside a container) every one,
    since the driver's PIDs are the host's and a process here with the same number is another process. A
    holder's container comes from its cgroup, never from a PID match.
    """
    if sample is None or not sample.processes:
        return holders, []
    uuid_to_index = {g.uuid: g.index for g in gpus}
    by_key = {(h.pid, h.gpu): h for h in holders} if pids_are_ours else {}
    foreign = []
    for proc in sample.processes:
        index = uuid_to_index.get(proc.gpu_uuid)
        holder = by_key.get((proc.pid, index))
        if holder is not None:
            holder.used_mib = proc.used_mib
            holder.gpu_uuid = proc.gpu_uuid
            continue
        info = lookup(proc.pid) if pids_are_ours else None
        if info is None:
            foreign.append({"pid": proc.pid, "name": proc.name, "gpu_uuid": proc.gpu_uuid, "used_mib": proc.used_mib})
            continue
        vmid, inner = _container_of(info)
        new = Holder(pid=proc.pid, name=info.comm, cmdline=info.command, gpu=index, device="", used_mib=proc.used_mib,
                     gpu_uuid=proc.gpu_uuid, container=vmid, container_pid=inner, unit=parse_systemd_unit(info.cgroup))
        holders.append(new)
        by_key[(proc.pid, index)] = new
    for h in holders:
        if h.gpu_uuid is None and h.gpu is not None:
            h.gpu_uuid = next((g.uuid for g in gpus if g.index == h.gpu), None)
    return holders, foreign


def classify_holders(holders: t.Sequence[Holder], gpus: t.Optional[t.Sequence[GpuInfo]], ignore: t.Sequence[str],
                     container: t.Optional[int],
                     lookup: t.Callable[[int], t.Optional[t.Any]] = lambda pid: None) -> tuple[list[Holder], list[Holder]]:
    """Split into (counted, ignored); holders of unselected GPUs are dropped (``gpus`` None: every GPU counts)."""
    wanted = None if gpus is None else {g.index for g in gpus}
    counted, ignored = [], []
    for h in holders:
        if wanted is not None and h.gpu is not None and h.gpu not in wanted:
            continue
        info = lookup(h.pid)
        argv = tuple(info.cmdline) if info is not None else tuple(h.cmdline.split(" ")[:1])
        pattern = name_ignored(h.name, argv, ignore)
        if pattern:
            h.ignored = "ignore_processes: %s" % pattern
        elif container is not None and h.container != container:
            h.ignored = "outside container %d (%s)" % (
                container, "CT%d" % h.container if h.container is not None else "host")
        (ignored if h.ignored else counted).append(h)
    return counted, ignored
