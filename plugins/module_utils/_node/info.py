# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``gpu_node_info``'s reading of the node: GPUs and driver (nvidia-smi), glibc, an interpreter, disk, a model, ports.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). What the facts fail to meet
is ``_node.needs``'s.
"""

from __future__ import annotations

import os
import platform
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import GpuError
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvidia_smi import (
    check_nvidia_smi,
    gpu_query_argv,
    parse_gpu_csv,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvidia_smi_backend import (
    resolve_nvidia_smi,
    run_command,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._node.needs import (
    disk_problem,
    model_problems,
    node_problems,
    port_problems,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    read_process_light,
    read_systemd_unit,
    read_tcp_listeners,
    socket_owners,
)

Runner = t.Callable[[t.Sequence[str], float], t.Tuple[int, str, str]]

# prints the version, then fails (rc 1) when the interpreter cannot create a venv with pip in it
PYTHON_PROBE = "import sys; print('%d.%d.%d' % sys.version_info[:3]); import venv, ensurepip"


def glibc_version() -> str:
    """The glibc this interpreter runs on ('' on another libc): the node's, for a system Python."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        found = ""
    if found.startswith("glibc "):
        return found.split(" ", 1)[1]
    lib, version = platform.libc_ver()
    return version if lib == "glibc" else ""


def gpu_facts(run: Runner, nvidia_smi: str, timeout: float) -> t.Dict[str, t.Any]:
    """The GPUs and the driver version, or why nvidia-smi could not tell."""
    try:
        path = resolve_nvidia_smi(nvidia_smi)
        rc, out, err = run(gpu_query_argv(path), timeout)
        check_nvidia_smi(rc, out, err)
        gpus = parse_gpu_csv(out)
        rc, out, err = run([path, "--query-gpu=driver_version", "--format=csv,noheader"], timeout)
        check_nvidia_smi(rc, out, err)
    except GpuError as exc:
        return {"gpus": [], "gpu_count": 0, "driver_version": "", "nvidia_smi_error": str(exc)}
    return {"gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "total_mib": g.total_mib, "used_mib": g.used_mib}
                     for g in gpus],
            "gpu_count": len(gpus), "driver_version": (out.strip().splitlines() or [""])[0].strip(), "nvidia_smi_error": ""}


def python_facts(run: Runner, path: str, timeout: float) -> t.Dict[str, t.Any]:
    """The interpreter PATH's version, whether it can create a venv, and what went wrong."""
    try:
        rc, out, err = run([path, "-c", PYTHON_PROBE], timeout)
    except GpuError as exc:  # run_command's bounded-run errors (timeout, cannot execute)
        return {"python_version": "", "python_venv": False, "python_error": str(exc)}
    said = (err.strip().splitlines() or ["rc %d" % rc])[-1]
    return {"python_version": (out.strip().splitlines() or [""])[0], "python_venv": rc == 0,
            "python_error": "" if rc == 0 else said}


def nearest_directory(path: str) -> str:
    """PATH, or its nearest ancestor that exists: where a directory still to be created would take its room."""
    path = os.path.abspath(path)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def disk_facts(entries: t.Sequence[t.Mapping[str, t.Any]]) -> t.List[t.Dict[str, t.Any]]:
    """Free bytes on the filesystem of each entry's path ({name, path, min_gb})."""
    found = []
    for entry in entries:
        checked = nearest_directory(entry["path"])
        stat = os.statvfs(checked)
        found.append({"name": entry["name"], "path": entry["path"], "checked": checked,
                      "free_bytes": stat.f_bavail * stat.f_frsize, "min_gb": float(entry["min_gb"])})
    return found


def directory_listing(path: str) -> t.Optional[t.List[str]]:
    try:
        return sorted(os.listdir(path))
    except (NotADirectoryError, FileNotFoundError):
        return None


def _command_name(pid: int) -> str:
    info = read_process_light(pid)
    return info.comm if info is not None else "gone"


def port_facts(ports: t.Iterable[int]) -> t.List[t.Dict[str, t.Any]]:
    """The TCP listeners on PORTS, each with the processes holding it (pid, command, systemd unit)."""
    wanted = {int(port) for port in ports}
    listeners = [item for item in read_tcp_listeners() if item.port in wanted]
    owners = socket_owners(item.inode for item in listeners)
    found = []
    for item in listeners:
        pids = sorted(owners.get(item.inode, []))
        found.append({"address": item.address, "port": item.port, "pids": pids,
                      "commands": [_command_name(pid) for pid in pids],
                      "units": [read_systemd_unit(pid) for pid in pids]})
    return found


def read_node(params: t.Mapping[str, t.Any], run: Runner = run_command) -> t.Dict[str, t.Any]:
    """Every fact ``gpu_node_info`` returns, and its ``problems`` against the requirements in PARAMS."""
    timeout = float(params["timeout"])
    facts = gpu_facts(run, params["nvidia_smi_path"], timeout)
    facts["glibc_version"] = glibc_version()
    if params.get("python_path"):
        facts.update(python_facts(run, params["python_path"], timeout))
    problems = node_problems(facts, params.get("cuda_major"), params.get("glibc") or "",
                             params.get("python_path") or "", params.get("python_min") or "",
                             params.get("python_max") or "")
    if params.get("model_path"):
        problems.extend(model_problems(params.get("model_name") or "model_path", params["model_path"],
                                       directory_listing(params["model_path"])))
    facts["disk"] = disk_facts(params.get("free_space") or [])
    problems.extend(disk_problem(d["name"], d["path"], d["checked"], d["free_bytes"], d["min_gb"])
                    for d in facts["disk"])
    wanted = params.get("ports") or []
    facts["ports_in_use"] = port_facts(item["port"] for item in wanted)
    problems.extend(port_problems(facts["ports_in_use"], params.get("listen_address") or "0.0.0.0", wanted,
                                  params.get("ports_owned_by") or []))
    facts["problems"] = [problem for problem in problems if problem]
    return facts
