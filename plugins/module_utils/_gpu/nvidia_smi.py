# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Pure parsers of ``nvidia-smi`` CSV queries and exit codes: text in, GPUs and processes (or GpuError) out.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). Nothing here runs a command (see ``_gpu.nvidia_smi_backend``).
"""

from __future__ import annotations

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    GPU_UUID_RE,
    GpuError,
    GpuInfo,
    GpuProcess,
)

GPU_QUERY_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "pci.bus_id")
APP_QUERY_FIELDS = ("pid", "process_name", "used_gpu_memory", "gpu_uuid")
# nvidia-smi(1) RETURN VALUE: what an operator should read into each exit code.
NVIDIA_SMI_RC = {
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on the target device",
    4: "no permission to access this device",
    6: "no GPU was found",
    8: "a device's external power cables are not attached",
    9: "the NVIDIA driver is not loaded",
    10: "the kernel detected an interrupt issue with a GPU",
    12: "the NVML library (libnvidia-ml.so) could not be found or loaded",
    13: "the local NVML does not implement this function",
    14: "the infoROM is corrupted",
    15: "a GPU has fallen off the bus or become inaccessible",
    255: "other error or internal driver error",
}
_NOT_A_NUMBER = ("[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU is lost]", "[GPU requires reset]",
                 "[Insufficient Permissions]")


def gpu_query_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader,nounits"]


def apps_query_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-compute-apps=" + ",".join(APP_QUERY_FIELDS), "--format=csv,noheader,nounits"]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def check_nvidia_smi(rc: int, stdout: str, stderr: str) -> None:
    """Raise GpuError naming the cause when an nvidia-smi call failed."""
    if rc == 0 and "No devices were found" not in stdout:
        return
    said = _first_line(stdout) or _first_line(stderr) or "(no output)"
    if rc == 0:
        rc = 6
    meaning = NVIDIA_SMI_RC.get(rc, "unknown exit code")
    lost = [line.strip() for line in (stdout + "\n" + stderr).splitlines() if "Unable to determine the device handle" in line]
    if lost:
        said = "; ".join(lost)
    raise GpuError("nvidia-smi failed (rc %d: %s): %s" % (rc, meaning, said))


def parse_mib(value: str, what: str) -> int:
    """An integer MiB field; ``[N/A]``/``[Not Supported]``/garbage raise (unknown is never 0)."""
    value = value.strip()
    if value.endswith(" MiB"):
        value = value[:-4]
    if value in _NOT_A_NUMBER or not value.isdigit():
        raise GpuError("nvidia-smi reported %s as %r: GPU memory cannot be read, so the GPUs cannot be judged free"
                       % (what, value))
    return int(value)


def _split_csv(line: str) -> list[str]:
    # Names and process paths carry no commas in practice; nvidia-smi does not quote.
    return [part.strip() for part in line.split(",")]


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """Parse ``--query-gpu=index,uuid,name,memory.used,memory.total,pci.bus_id --format=csv,noheader,nounits``."""
    if "No devices were found" in text:
        raise GpuError("nvidia-smi: No devices were found")
    if "\x00" in text or "\ufffd" in text:
        raise GpuError("nvidia-smi printed garbled output (binary bytes): %r" % text[:200])
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = _split_csv(line)
        if len(parts) != len(GPU_QUERY_FIELDS):
            raise GpuError("nvidia-smi printed an unexpected line (expected %d fields %s): %r"
                           % (len(GPU_QUERY_FIELDS), ",".join(GPU_QUERY_FIELDS), line[:200]))
        index, uuid, name, used, total, bus = parts
        if not index.isdigit() or not GPU_UUID_RE.match(uuid):
            raise GpuError("nvidia-smi printed an unexpected line (bad index or uuid): %r" % line[:200])
        gpus.append(GpuInfo(index=int(index), uuid=uuid, name=name,
                            used_mib=parse_mib(used, "memory.used of GPU %s" % index),
                            total_mib=parse_mib(total, "memory.total of GPU %s" % index), bus_id=bus))
    if not gpus:
        raise GpuError("nvidia-smi printed no GPUs (empty output): the driver lists no device")
    return gpus


def parse_apps_csv(text: str) -> list[GpuProcess]:
    """Parse ``--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv,noheader,nounits``.

    Memory may be ``[N/A]`` (containers, MIG): kept as None, the list is advisory.
    """
    if "\x00" in text or "\ufffd" in text:
        raise GpuError("nvidia-smi printed garbled process output: %r" % text[:200])
    procs = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        parts = _split_csv(line)
        if len(parts) < 4 or not parts[0].isdigit():
            raise GpuError("nvidia-smi printed an unexpected process line: %r" % line[:200])
        pid, uuid, used = parts[0], parts[-1], parts[-2]
        name = ", ".join(parts[1:-2])
        mib = int(used[:-4] if used.endswith(" MiB") else used) if used.replace(" MiB", "").isdigit() else None
        procs.append(GpuProcess(pid=int(pid), gpu_uuid=uuid, used_mib=mib, name=name))
    return procs
