"""The NVML backend against the documented nvidia-ml-py API.

No GPU is here. The real ``pynvml`` is used where it can answer without one
(its exception classes and structs, and ``nvmlInit`` failing with
LibraryNotFound on this machine); the device answers come from ``FakeNvml``,
a stand-in for the GPU behind the *same* function names and signatures
(checked against the real module below), raising the real NVMLError classes.
"""

from __future__ import annotations

import pynvml
import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import nvml as _nvml
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    BackendUnavailable,
    GpuError,
    GpuProcess,
)

pytestmark = pytest.mark.processes

MIB = 1024 * 1024
NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
UUIDS = ["GPU-72e5f72d-18ee-5e60-842e-9c4a48fc83cd", "GPU-981ec1ea-ec8c-5678-b94e-043da42b32b1"]
SMI_GPUS = "".join("%d, %s, %s, 4, 97887, 00000000:%02X:00.0\n" % (i, u, NAME, 1 + 32 * i) for i, u in enumerate(UUIDS))
SMI_APPS = "4242, python3, 80000, %s\n" % UUIDS[0]


def nvml_error(name):
    return pynvml.NVMLError(getattr(pynvml, name))


class Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


class FakeNvml:
    """Two fake GPUs behind pynvml's API (function names, return types, error classes)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, used_mib=(80004, 4), procs=None, fail=None):
        self.used_mib = list(used_mib)
        self.procs = procs if procs is not None else {0: [Proc(4242, 80000 * MIB)], 1: []}
        self.fail = fail or {}  # function name -> NVML_ERROR_* name
        self.calls = []
        for name in dir(pynvml):
            if name.startswith("NVMLError_"):
                setattr(self, name, getattr(pynvml, name))

    def _call(self, name):
        self.calls.append(name)
        if name in self.fail:
            raise nvml_error(self.fail[name])

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return len(self.used_mib)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle):
        self._call("nvmlDeviceGetUUID")
        return UUIDS[handle]  # str in nvidia-ml-py >= 11.515 (convertStrBytes)

    def nvmlDeviceGetName(self, handle):
        self._call("nvmlDeviceGetName")
        return NAME.encode()  # older bindings return bytes: both must work

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo")
        mem = pynvml.c_nvmlMemory_t()
        mem.total = 97887 * MIB
        mem.used = self.used_mib[handle] * MIB
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetPciInfo(self, handle):
        self._call("nvmlDeviceGetPciInfo")
        pci = pynvml.nvmlPciInfo_t()
        pci.busId = b"00000000:%02X:00.0" % (1 + 32 * handle)
        return pci

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return self.procs[handle]


def smi_runner(calls):
    def run(argv, timeout):
        calls.append(argv[1])
        return (0, SMI_GPUS if argv[1].startswith("--query-gpu") else SMI_APPS, "")
    return run


def test_fake_matches_the_real_api():
    for name in _nvml.NVML_FUNCTIONS:
        assert callable(getattr(pynvml, name)), name
        assert hasattr(FakeNvml, name), name
    for name in ("NVMLError_LibraryNotFound", "NVMLError_FunctionNotFound", "NVMLError_DriverNotLoaded",
                 "NVMLError_GpuIsLost", "NVMLError_NotSupported"):
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError)
    assert _nvml.import_pynvml() is pynvml


def test_real_pynvml_without_driver_library_falls_back_to_nvidia_smi():
    calls = []
    backend = _nvml.open_backend("auto", "/bin/true", runner=smi_runner(calls))
    assert backend.name == "nvidia_smi"
    assert "libnvidia-ml.so not found" in backend.notes[0] and "using nvidia-smi" in backend.notes[0]
    sample = backend.sample()
    assert [g.uuid for g in sample.gpus] == UUIDS and sample.backend == "nvidia_smi"


def test_real_pynvml_backend_nvml_is_a_clear_error():
    with pytest.raises(GpuError, match="backend nvml: NVML: libnvidia-ml.so not found.*use backend: auto or nvidia_smi"):
        _nvml.open_backend("nvml", "/bin/true")


def test_nvml_missing_module():
    with pytest.raises(GpuError, match="nvidia-ml-py .pynvml. is not importable.*pip install nvidia-ml-py"):
        _nvml.open_backend("nvml", "/bin/true", nvml_loader=lambda: None)
    backend = _nvml.open_backend("auto", "/bin/true", runner=smi_runner([]), nvml_loader=lambda: None)
    assert backend.name == "nvidia_smi" and backend.notes == ["nvidia-ml-py not importable; using nvidia-smi"]


def test_nvml_sample():
    fake = FakeNvml()
    backend = _nvml.open_backend("auto", "/bin/true", nvml_loader=lambda: fake)
    sample = backend.sample()
    assert sample.backend == "nvml"
    assert [(g.index, g.uuid, g.name, g.used_mib, g.total_mib, g.bus_id) for g in sample.gpus] == [
        (0, UUIDS[0], NAME, 80004, 97887, "00000000:01:00.0"),
        (1, UUIDS[1], NAME, 4, 97887, "00000000:21:00.0"),
    ]
    assert sample.processes == (GpuProcess(pid=4242, gpu_uuid=UUIDS[0], used_mib=80000),)
    backend.close()
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"


def test_nvml_unknown_process_memory_is_none():
    fake = FakeNvml(procs={0: [Proc(4242, None)], 1: []})
    sample = _nvml.NvmlBackend(fake).sample()
    assert sample.processes == (GpuProcess(pid=4242, gpu_uuid=UUIDS[0], used_mib=None),)


@pytest.mark.parametrize("procs, fail, note", [
    ({0: [Proc(0, 5 * MIB)], 1: []}, {}, "sentinel PID 0"),
    ({0: [Proc(0xFFFFFFFF, 5 * MIB)], 1: []}, {}, "sentinel PID 4294967295"),
    (None, {"nvmlDeviceGetComputeRunningProcesses": "NVML_ERROR_FUNCTION_NOT_FOUND"}, "cannot list processes"),
])
def test_nvml_unusable_process_list_comes_from_nvidia_smi(procs, fail, note):
    calls = []
    fake = FakeNvml(procs=procs, fail=fail)
    backend = _nvml.open_backend("auto", "/bin/true", runner=smi_runner(calls), nvml_loader=lambda: fake)
    sample = backend.sample()
    assert sample.backend == "nvml" and sample.gpus[0].used_mib == 80004  # memory still from NVML
    assert sample.processes == (GpuProcess(pid=4242, gpu_uuid=UUIDS[0], used_mib=80000, name="python3"),)
    assert any(note in n for n in sample.notes) and "processes from nvidia-smi" in sample.notes
    assert calls == ["--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid"]


def test_nvml_function_not_found_on_memory_switches_to_nvidia_smi_for_good():
    calls = []
    fake = FakeNvml(fail={"nvmlDeviceGetMemoryInfo": "NVML_ERROR_FUNCTION_NOT_FOUND"})
    backend = _nvml.open_backend("auto", "/bin/true", runner=smi_runner(calls), nvml_loader=lambda: fake)
    first = backend.sample()
    second = backend.sample()
    assert first.backend == second.backend == backend.name == "nvidia_smi"
    assert "lacks a function" in backend.notes[-1] and "nvmlShutdown" in fake.calls
    # forced nvml does not fall back
    with pytest.raises(BackendUnavailable):
        _nvml.open_backend("nvml", "/bin/true", nvml_loader=lambda: FakeNvml(
            fail={"nvmlDeviceGetMemoryInfo": "NVML_ERROR_FUNCTION_NOT_FOUND"})).sample()


@pytest.mark.parametrize("fail, fragment", [
    ({"nvmlDeviceGetMemoryInfo": "NVML_ERROR_GPU_IS_LOST"}, "GPU 0 has fallen off the bus"),
    ({"nvmlDeviceGetUUID": "NVML_ERROR_NO_PERMISSION"}, "NVML failed on GPU 0: Insufficient Permissions"),
    ({"nvmlDeviceGetCount": "NVML_ERROR_UNKNOWN"}, "NVML failed: Unknown Error"),
])
def test_nvml_errors_are_never_free(fail, fragment):
    backend = _nvml.open_backend("auto", "/bin/true", nvml_loader=lambda: FakeNvml(fail=fail))
    with pytest.raises(GpuError, match=fragment):
        backend.sample()


def test_nvml_no_devices_and_driver_not_loaded():
    with pytest.raises(GpuError, match="NVML: No devices were found"):
        _nvml.NvmlBackend(FakeNvml(used_mib=())).sample()
    with pytest.raises(GpuError, match="the NVIDIA driver is not loaded"):
        _nvml.open_backend("auto", "/bin/true",
                           nvml_loader=lambda: FakeNvml(fail={"nvmlInit": "NVML_ERROR_DRIVER_NOT_LOADED"}))


@pytest.mark.parametrize("pid, sentinel", [(0, True), (-1, True), (1, False), (4194303, False), (4194304, True)])
def test_sentinel_pid(pid, sentinel):
    assert _nvml.sentinel_pid(pid) is sentinel
