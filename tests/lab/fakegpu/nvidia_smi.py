# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fake ``nvidia-smi`` over the fakegpu state dir (see fakegpu.py and README.md).

Answers the forms the collection and an operator use, with real nvidia-smi's
output formats, messages and exit codes; ``config.json``'s ``mode`` selects a
broken backend.
"""

from __future__ import annotations

import sys
import time

# Run as a script (the nvidia-smi wrapper execs this file by its real path), so Python has put
# this directory first on sys.path: fakegpu.py next to it is found in the tree and in the lab.
import fakegpu

# nvidia-smi(1) RETURN VALUE section
RC_INVALID_ARG, RC_NOT_FOUND, RC_NO_DRIVER, RC_NO_NVML, RC_GPU_LOST = 2, 6, 9, 12, 15

MSG = {
    "no_devices": ("No devices were found", RC_NOT_FOUND),
    "no_driver": ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.\n", RC_NO_DRIVER),
    "no_nvml": ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
                "Display Driver is properly installed and present in your system.\n"
                "Please also try adding directory that contains libnvidia-ml.so to your system PATH.", RC_NO_NVML),
}
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

# field -> (header unit or None, getter)
GPU_FIELDS = {
    "index": None, "uuid": None, "gpu_uuid": None, "name": None, "gpu_name": None, "pci.bus_id": None,
    "gpu_bus_id": None, "memory.used": "MiB", "memory.total": "MiB", "memory.free": "MiB", "count": None,
    "driver_version": None, "persistence_mode": None, "utilization.gpu": "%", "temperature.gpu": None,
}
APP_FIELDS = {"pid": None, "process_name": None, "name": None, "used_gpu_memory": "MiB", "used_memory": "MiB",
              "gpu_uuid": None, "gpu_name": None, "gpu_bus_id": None}


def out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")


def parse_args(argv: list[str]) -> dict | None:
    opts: dict = {"format": None, "query_gpu": None, "query_apps": None, "list": False, "ids": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            name = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps", "--format": "format",
                    "-i": "ids", "--id": "ids"}[key]
            opts[name] = value
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        else:
            return None
        i += 1
    return opts


def fmt_value(field: str, unit: str | None, value, nounits: bool) -> str:
    if isinstance(value, str) and value.startswith("["):
        return value
    if unit and not nounits:
        return "%s %s" % (value, unit)
    return str(value)


def gpu_rows(cfg: dict, used: dict[int, int], ids: list[int]) -> list[dict]:
    rows = []
    mode = cfg.get("mode", "ok")
    for g in cfg["gpus"]:
        if g["index"] not in ids:
            continue
        total = cfg["memory_total_mib"]
        u = used[g["index"]]
        row = {"index": g["index"], "uuid": g["uuid"], "gpu_uuid": g["uuid"], "name": cfg["name"],
               "gpu_name": cfg["name"], "pci.bus_id": g["bus_id"], "gpu_bus_id": g["bus_id"],
               "memory.used": u, "memory.total": total, "memory.free": max(0, total - u), "count": cfg["count"],
               "driver_version": cfg["driver_version"], "persistence_mode": "Enabled",
               "utilization.gpu": 97 if u > 1024 else 0, "temperature.gpu": 71 if u > 1024 else 34}
        if mode == "na":
            row["memory.used"] = row["memory.free"] = "[N/A]"
        elif mode == "not_supported":
            row["memory.used"] = row["memory.free"] = "[Not Supported]"
        rows.append(row)
    return rows


def csv(fields: list[str], units: dict, rows: list[dict], fmt: str) -> str:
    flags = set(fmt.split(","))
    lines = []
    if "noheader" not in flags:
        # real nvidia-smi keeps the unit in the header even with nounits
        lines.append(", ".join("%s [%s]" % (f, units[f]) if units[f] else f for f in fields))
    for row in rows:
        lines.append(", ".join(fmt_value(f, units[f], row[f], "nounits" in flags) for f in fields))
    return "\n".join(lines) + ("\n" if lines else "")


def table(cfg: dict, used: dict[int, int], procs: list[dict], ids: list[int]) -> str:
    w = 89
    bar3 = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ", "+" + "-" * w + "+",
             ("| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s" % (
                 cfg["driver_version"], cfg["driver_version"], cfg["cuda_version"])).ljust(w + 1) + "|",
             bar3,
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|                                         |                        |               MIG M. |",
             "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    name = cfg["name"]
    short = name if len(name) <= 27 else name[:24] + "..."

    def row(left: str, mid: str, right: str) -> str:
        return "|" + left.ljust(41)[:41] + "|" + mid.rjust(24)[-24:] + "|" + right.rjust(22)[-22:] + "|"

    for g in cfg["gpus"]:
        if g["index"] not in ids:
            continue
        u = used[g["index"]]
        busy = u > 1024
        mem = "%dMiB / %6dMiB " % (u, cfg["memory_total_mib"])
        if cfg.get("mode") in ("na", "not_supported"):
            mem = "N/A / %6dMiB " % cfg["memory_total_mib"]
        lines.append(row(" %3d  %-27s    On  " % (g["index"], short), "%s Off " % g["bus_id"], "Off "))
        power = "%dW" % (540 if busy else 12)
        left = " %2d%%   %2dC    %-2s %15s /  %3dW " % (30, 71 if busy else 34, "P1" if busy else "P8", power, 600)
        lines.append(row(left, mem, "%3d%%      Default " % (97 if busy else 0)))
        lines.append(row("", "", "N/A "))
        lines.append(bar3)
    lines += ["", "+" + "-" * w + "+",
              "| Processes:" + " " * (w - 11) + "|",
              "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|" + "=" * w + "|"]
    shown = [p for p in procs if p["gpu"] in ids]
    if not shown:
        lines.append("|  No running processes found" + " " * (w - 28) + "|")
    for p in shown:
        pname = p["process_name"] if len(p["process_name"]) <= 36 else "..." + p["process_name"][-33:]
        left = "|  %3d   N/A  N/A  %15d      C   %-36s" % (p["gpu"], p["pid"], pname)
        lines.append(left + ("%dMiB" % p["used_mib"]).rjust(w - len(left)) + " |")
    lines.append("+" + "-" * w + "+")
    return "\n".join(lines) + "\n"


def select_ids(cfg: dict, spec: str | None) -> list[int] | None:
    if not spec:
        return [g["index"] for g in cfg["gpus"]]
    ids = []
    for part in spec.split(","):
        part = part.strip()
        match = [g["index"] for g in cfg["gpus"] if part in (str(g["index"]), g["uuid"], g["bus_id"])]
        if not match:
            return None
        ids += match
    return ids


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if opts is None:
        out(INVALID)
        return RC_INVALID_ARG
    try:
        cfg = fakegpu.load_config()
    except (OSError, ValueError):
        # no state dir: as on a machine whose driver is not loaded
        out(MSG["no_driver"][0])
        return RC_NO_DRIVER
    mode = cfg.get("mode", "ok")
    if mode == "hang":
        time.sleep(float(cfg.get("hang_seconds") or 3600))
    if mode in MSG:
        text, rc = MSG[mode]
        out(text)
        return rc
    ids = select_ids(cfg, opts["ids"])
    if ids is None:
        out("No devices were found")
        return RC_NOT_FOUND
    allocs = fakegpu.allocations()
    used = fakegpu.used_mib(cfg, allocs)
    lost = set(cfg.get("lost_gpus") or []) if mode == "gpu_lost" else set()
    lost_lines = ["Unable to determine the device handle for GPU%s: GPU is lost.  Reboot the system to recover this GPU"
                  % g["bus_id"] for g in cfg["gpus"] if g["index"] in lost and g["index"] in ids]
    good = [i for i in ids if i not in lost]
    if mode == "empty":
        return 0
    if opts["list"]:
        for g in cfg["gpus"]:
            if g["index"] in good:
                out("GPU %d: %s (UUID: %s)" % (g["index"], cfg["name"], g["uuid"]))
        for line in lost_lines:
            out(line)
        return RC_GPU_LOST if lost_lines else 0
    if opts["query_gpu"] or opts["query_apps"]:
        if opts["query_gpu"] and opts["query_apps"]:
            out(INVALID)
            return RC_INVALID_ARG
        if not opts["format"] or not opts["format"].startswith("csv"):
            out("'--format' must be specified with '--query-*' options: --format=csv[,noheader][,nounits]")
            return RC_INVALID_ARG
        bad = [f for f in opts["format"].split(",")[1:] if f not in ("noheader", "nounits")]
        if bad:
            out('Invalid format option "%s".' % bad[0])
            return RC_INVALID_ARG
        table_fields = GPU_FIELDS if opts["query_gpu"] else APP_FIELDS
        fields = [f.strip() for f in (opts["query_gpu"] or opts["query_apps"]).split(",")]
        for f in fields:
            if f not in table_fields:
                out('Field "%s" is not a valid field to query.\n' % f)
                return RC_INVALID_ARG
        if opts["query_gpu"]:
            rows = gpu_rows(cfg, used, good)
        else:
            rows = []
            for p in fakegpu.host_processes(cfg=cfg, allocs=allocs):
                if p["gpu"] in good:
                    g = cfg["gpus"][p["gpu"]]
                    rows.append({"pid": p["pid"], "process_name": p["process_name"], "name": p["process_name"],
                                 "used_gpu_memory": p["used_mib"], "used_memory": p["used_mib"],
                                 "gpu_uuid": g["uuid"], "gpu_name": cfg["name"], "gpu_bus_id": g["bus_id"]})
        text = csv(fields, table_fields, rows, opts["format"])
        if mode == "garbled":
            # a torn, partly binary answer (dying driver, interleaved writes)
            text = text[: max(1, len(text) // 3)] + "\x00\x1b[?\ufffd\ufffd, , ,\n" + "GPU-\n"
        sys.stdout.write(text)
        for line in lost_lines:
            out(line)
        return RC_GPU_LOST if lost_lines else 0
    sys.stdout.write(table(cfg, used, fakegpu.host_processes(cfg=cfg, allocs=allocs), good))
    for line in lost_lines:
        out(line)
    return RC_GPU_LOST if lost_lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
