# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What ``gpu_free_wait`` measures and finds: a GPU, a compute process, one sample, a holder.

Shared by the nvidia-smi parsers (``_gpu.nvidia_smi``), the judgement (``_gpu.judge``), the
holder scan (``_gpu.holders``) and the backends (``_gpu.nvidia_smi_backend``, ``_gpu.nvml``).

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).
"""

from __future__ import annotations

import re
import typing as t
from dataclasses import asdict, dataclass, field

GPU_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F/-]*$")
# pid_max can never exceed 2**22 (PID_MAX_LIMIT); NVML struct-version mismatches give 0 or garbage.
PID_LIMIT = 1 << 22


class GpuError(Exception):
    """The GPUs cannot be judged (bad input, missing or broken backend): never read as 'free'."""


# a working nvidia-smi on a node without persistence mode can take seconds: each call gets at least this long
# (when the wait has it left), and only a call that had it and did not answer is taken for a hung driver
WORKING_CALL_S = 5.0


class GpuTimeout(GpuError):
    """A backend call did not answer within the GIVEN seconds it was allowed."""

    def __init__(self, msg: str, given: float) -> None:
        super().__init__(msg)
        self.given = given

    @property
    def proves_hang(self) -> bool:
        """Given the time a working call may need, it still did not answer; a call the wait's end cut shorter
        than that says nothing about the driver."""
        return self.given >= WORKING_CALL_S


class BackendUnavailable(GpuError):
    """This backend cannot run here; ``backend: auto`` may fall back to the next one."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int
    bus_id: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """A compute process as the backend (NVML / nvidia-smi) lists it: PIDs of the driver's namespace."""

    pid: int
    gpu_uuid: str
    used_mib: t.Optional[int]
    name: str = ""


@dataclass
class Sample:
    """One reading of every GPU. ``processes`` is None when the backend gave no usable list."""

    at: float  # wall clock, so tests can line samples up with other processes' events
    gpus: tuple[GpuInfo, ...]
    processes: t.Optional[tuple[GpuProcess, ...]]
    backend: str
    took: float = 0.0
    notes: tuple[str, ...] = ()
    # nvidia-smi needs a second call for processes: made only when the memory alone says busy
    fetch: t.Optional[t.Callable[[], t.Tuple[t.Optional[tuple], str]]] = field(default=None, repr=False)

    def ensure_processes(self) -> None:
        """Fetch the deferred process list (once)."""
        if self.fetch is not None:
            fetch, self.fetch = self.fetch, None
            self.processes, note = fetch()
            if note:
                self.notes = self.notes + (note,)


@dataclass
class Holder:
    """A process with an NVIDIA device file open, as ``fuser -v /dev/nvidia*`` would list it."""

    pid: int
    name: str
    cmdline: str
    gpu: t.Optional[int]  # None: only driver-wide files (nvidiactl, nvidia-uvm) are open
    device: str
    container: t.Optional[int] = None  # VMID from the cgroup path (on the PVE host)
    container_pid: t.Optional[int] = None  # the PID inside the container (innermost NSpid)
    used_mib: t.Optional[int] = None  # where the backend reports it for this PID
    gpu_uuid: t.Optional[str] = None
    ignored: str = ""  # why it does not count, '' when it does
    unit: str = ""  # its systemd service or scope ('' for none), from its cgroup

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = "GPU %s" % self.gpu if self.gpu is not None else "driver"
        mib = "%d MiB" % self.used_mib if self.used_mib is not None else "MiB unknown"
        ct = " in CT%s (pid %s there)" % (self.container, self.container_pid) if self.container is not None else ""
        return "pid %d %s [%s] on %s, %s%s" % (self.pid, self.name, self.cmdline[:120], where, mib, ct)
