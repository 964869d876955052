# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The NVML backend (nvidia-ml-py's ``pynvml``) and backend selection for ``gpu_free_wait``.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. nvidia-ml-py is optional: without it (or without ``libnvidia-ml.so``)
``backend: auto`` uses ``nvidia-smi``; ``backend: nvml`` fails with the fix.

Only documented pynvml calls are used (``NVML_FUNCTIONS``): nvmlInit,
nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID,
nvmlDeviceGetName, nvmlDeviceGetMemoryInfo, nvmlDeviceGetPciInfo,
nvmlDeviceGetComputeRunningProcesses, and the ``NVMLError_*`` classes.
"""

from __future__ import annotations

import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    PID_LIMIT,
    BackendUnavailable,
    GpuError,
    GpuInfo,
    GpuProcess,
    Sample,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvidia_smi_backend import (
    NvidiaSmiBackend,
    Runner,
    resolve_nvidia_smi,
    run_command,
)

MIB = 1024 * 1024
NVML_FUNCTIONS = (
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo", "nvmlDeviceGetComputeRunningProcesses",
)
INSTALL_HINT = "install nvidia-ml-py on the target (pip install nvidia-ml-py) or use backend: nvidia_smi"


def import_pynvml() -> t.Any:
    """The ``pynvml`` module of nvidia-ml-py, or None when it is not importable."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    missing = [name for name in NVML_FUNCTIONS if not hasattr(pynvml, name)]
    if missing or not hasattr(pynvml, "NVMLError"):
        # The unrelated, long-dead 'pynvml' package or a stub: not the NVIDIA binding.
        return None
    return pynvml


def _text(value: t.Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _err(nvml: t.Any, name: str) -> tuple:
    cls = getattr(nvml, name, None)
    return (cls,) if isinstance(cls, type) else ()


def sentinel_pid(pid: int) -> bool:
    """PIDs NVML returns when its process struct does not match the driver's (0, -1, garbage)."""
    return pid <= 0 or pid >= PID_LIMIT


class NvmlBackend:
    """Samples through NVML; ``processes_fallback`` supplies the list when NVML's is unusable."""

    name = "nvml"

    def __init__(self, nvml: t.Any,
                 processes_fallback: t.Optional[t.Callable[[], t.Tuple[t.Optional[tuple], str]]] = None) -> None:
        self.nvml = nvml
        self.processes_fallback = processes_fallback
        try:
            nvml.nvmlInit()
        except _err(nvml, "NVMLError_LibraryNotFound") as exc:
            raise BackendUnavailable("NVML: libnvidia-ml.so not found (%s)" % exc) from exc
        except _err(nvml, "NVMLError_FunctionNotFound") as exc:
            raise BackendUnavailable("NVML: the driver's libnvidia-ml.so lacks a function (%s)" % exc) from exc
        except _err(nvml, "NVMLError_DriverNotLoaded") as exc:
            raise GpuError("NVML: the NVIDIA driver is not loaded (%s)" % exc) from exc
        except nvml.NVMLError as exc:
            raise GpuError("NVML initialisation failed: %s" % exc) from exc

    def _processes(self, handle: t.Any, uuid: str) -> t.Tuple[t.Optional[list], str]:
        nvml = self.nvml
        try:
            raw = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except _err(nvml, "NVMLError_FunctionNotFound") + _err(nvml, "NVMLError_NotSupported") as exc:
            return None, "NVML cannot list processes (%s)" % exc
        procs = []
        for proc in raw:
            pid = int(getattr(proc, "pid", 0) or 0)
            if sentinel_pid(pid):
                return None, "NVML returned sentinel PID %d (process struct mismatch)" % pid
            used = getattr(proc, "usedGpuMemory", None)
            procs.append(GpuProcess(pid=pid, gpu_uuid=uuid, used_mib=None if used is None else int(used) // MIB))
        return procs, ""

    def sample(self) -> Sample:
        nvml = self.nvml
        start, now = time.monotonic(), time.time()
        gpus: list[GpuInfo] = []
        procs: t.Optional[list] = []
        notes: list[str] = []
        index = -1
        try:
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                raise GpuError("NVML: No devices were found")
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(GpuInfo(index=index, uuid=uuid, name=_text(nvml.nvmlDeviceGetName(handle)),
                                    used_mib=int(mem.used) // MIB, total_mib=int(mem.total) // MIB,
                                    bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId)))
                if procs is not None:
                    got, note = self._processes(handle, uuid)
                    procs = None if got is None else procs + got
                    if note:
                        notes.append(note)
        except _err(nvml, "NVMLError_GpuIsLost") as exc:
            raise GpuError("GPU %d has fallen off the bus (NVML: %s): reboot or reset it; it is not free" % (index, exc)) from exc
        except _err(nvml, "NVMLError_FunctionNotFound") as exc:
            raise BackendUnavailable("NVML: the driver's library lacks a function (%s)" % exc) from exc
        except nvml.NVMLError as exc:
            raise GpuError("NVML failed%s: %s" % (" on GPU %d" % index if index >= 0 else "", exc)) from exc
        if procs is None and self.processes_fallback is not None:
            fallback, why = self.processes_fallback()
            procs = None if fallback is None else list(fallback)
            notes.append("processes from nvidia-smi" if fallback is not None else why)
        return Sample(at=now, gpus=tuple(gpus), processes=None if procs is None else tuple(procs),
                      backend=self.name, took=time.monotonic() - start, notes=tuple(notes))

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a broken NVML must not mask the real result
            pass


class AutoBackend:
    """NVML first; on an unavailable NVML (now or at the first sample) nvidia-smi for good."""

    def __init__(self, primary: t.Optional[NvmlBackend], make_secondary: t.Callable[[], NvidiaSmiBackend],
                 note: str = "") -> None:
        self.current: t.Any = primary
        self.make_secondary = make_secondary
        self.notes = [note] if note else []
        if primary is None:
            self.current = make_secondary()

    @property
    def name(self) -> str:
        return self.current.name

    def sample(self) -> Sample:
        if isinstance(self.current, NvmlBackend):
            try:
                return self.current.sample()
            except BackendUnavailable as exc:
                self.current.close()
                self.notes.append("%s; using nvidia-smi" % exc)
                self.current = self.make_secondary()
        return self.current.sample()

    def close(self) -> None:
        self.current.close()


def open_backend(kind: str, nvidia_smi_path: str, runner: Runner = run_command,
                 nvml_loader: t.Callable[[], t.Any] = import_pynvml,
                 call_timeout: t.Union[float, t.Callable[[], float]] = 30.0) -> t.Any:
    """A backend with ``sample()``/``close()``/``name`` (and ``notes`` for auto) for ``backend``."""
    if kind not in ("auto", "nvml", "nvidia_smi"):
        raise GpuError("backend must be auto, nvml or nvidia_smi, got %r" % kind)

    def smi() -> NvidiaSmiBackend:
        return NvidiaSmiBackend(resolve_nvidia_smi(nvidia_smi_path), runner=runner, call_timeout=call_timeout)

    if kind == "nvidia_smi":
        return smi()

    def smi_processes() -> t.Tuple[t.Optional[tuple], str]:
        try:
            return smi().processes()
        except GpuError as exc:
            return None, "no process list: %s" % exc

    nvml = nvml_loader()
    if kind == "nvml":
        if nvml is None:
            raise GpuError("backend nvml: nvidia-ml-py (pynvml) is not importable by %s; %s" % (
                __import__("sys").executable, INSTALL_HINT))
        try:
            return NvmlBackend(nvml, smi_processes)
        except BackendUnavailable as exc:
            raise GpuError("backend nvml: %s; use backend: auto or nvidia_smi" % exc) from exc
    if nvml is None:
        return AutoBackend(None, smi, "nvidia-ml-py not importable; using nvidia-smi")
    try:
        return AutoBackend(NvmlBackend(nvml, smi_processes), smi)
    except BackendUnavailable as exc:
        return AutoBackend(None, smi, "%s; using nvidia-smi" % exc)
