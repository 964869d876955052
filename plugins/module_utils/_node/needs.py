# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a node must have to run a CUDA build: the driver for its CUDA major, glibc, the Python range.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). Pure functions: the module
(``gpu_node_info``) reads the facts, these say what is missing.
"""

from __future__ import annotations

import re
import typing as t

Version = t.Tuple[int, ...]

# The oldest Linux x86_64 driver that runs any toolkit of a CUDA major (NVIDIA's CUDA Toolkit release notes,
# the "minor version compatibility" table): a build for CUDA 13 needs r580, for 12 r525.60.13, for 11 r450.80.02.
# The driver runs toolkits up to its own CUDA version (nvidia-smi's "CUDA Version"), not above.
MIN_DRIVER_FOR_CUDA: t.Dict[int, Version] = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}


def parse_version(text: str) -> t.Optional[Version]:
    """``570.124.06`` -> (570, 124, 6); ``2.36`` -> (2, 36); None when TEXT starts with no number."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def dotted(version: Version) -> str:
    return ".".join(str(part) for part in version)


def driver_problem(driver: str, cuda_major: int) -> t.Optional[str]:
    """Why the NVIDIA driver DRIVER (nvidia-smi's driver_version) cannot run a CUDA CUDA_MAJOR build, or None."""
    need = MIN_DRIVER_FOR_CUDA.get(cuda_major)
    if need is None:
        known = ", ".join(str(major) for major in sorted(MIN_DRIVER_FOR_CUDA))
        return "no driver minimum is known for CUDA %d (known: %s)" % (cuda_major, known)
    found = parse_version(driver)
    if found is None:
        return "nvidia-smi reported no driver version (%r)" % driver
    if found < need:
        return "NVIDIA driver %s is older than %s, the oldest that runs CUDA %d builds" % (
            driver.strip(), dotted(need), cuda_major)
    return None


def glibc_problem(found: str, need: str) -> t.Optional[str]:
    """Why glibc FOUND is too old for wheels built for NEED (their manylinux_X_Y tag), or None."""
    have, want = parse_version(found), parse_version(need)
    if want is None:
        return None
    if have is None:
        return "the node's glibc version could not be read (not a glibc system?); wheels need glibc >= %s" % need
    if have < want:
        return "glibc %s is older than %s, the oldest the wheels are built for (manylinux_%s)" % (
            found, need, need.replace(".", "_"))
    return None


def python_problem(found: str, low: str, high: str, path: str, error: str = "") -> t.Optional[str]:
    """Why the interpreter PATH (version FOUND; ERROR when it did not run) is outside LOW..HIGH (major.minor, both
    included), or None."""
    have = parse_version(found)
    if have is None:
        return "%s did not run (%s)" % (path, error or found or "no output")
    have = have[:2]
    if low and have < (parse_version(low) or ()):
        return "%s is Python %s; the wheels need Python >= %s" % (path, dotted(have), low)
    if high and have > (parse_version(high) or ()):
        return "%s is Python %s; the wheels exist up to Python %s only" % (path, dotted(have), high)
    return None


def node_problems(facts: t.Mapping[str, t.Any], cuda_major: t.Optional[int], glibc: str, python_path: str,
                  python_min: str, python_max: str) -> t.List[str]:
    """Every requirement FACTS do not meet, in the order a fix is best made (driver, glibc, Python)."""
    problems = []
    if cuda_major is not None:
        if facts.get("nvidia_smi_error"):
            problems.append("the NVIDIA driver could not be read: %s" % facts["nvidia_smi_error"])
        else:
            problems.append(driver_problem(facts.get("driver_version", ""), cuda_major))
    if glibc:
        problems.append(glibc_problem(facts.get("glibc_version", ""), glibc))
    if python_path:
        no_venv = None if facts.get("python_venv") else "%s cannot create a venv (%s)" % (
            python_path, facts.get("python_error") or "no venv or ensurepip module")
        problems.append(python_problem(facts.get("python_version", ""), python_min, python_max, python_path,
                                       facts.get("python_error", "")) or no_venv)
    return [problem for problem in problems if problem]


# ---------------------------------------------------------------- disk, model files, ports

WILDCARDS = ("0.0.0.0", "::")
GB = 1000 ** 3


def disk_problem(name: str, path: str, checked: str, free_bytes: int, need_gb: float) -> t.Optional[str]:
    """Why PATH (its filesystem, read at CHECKED, the nearest directory that exists) has too little room for NAME."""
    if free_bytes >= need_gb * GB:
        return None
    where = path if checked == path else "%s (read at %s)" % (path, checked)
    return "%s: the filesystem of %s has %.1f GB free; it needs %g GB" % (name, where, free_bytes / GB, need_gb)


# A model directory SGLang loads (transformers' from_pretrained layout): its config, a tokenizer in one of the
# forms transformers reads, and weights.
MODEL_TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
MODEL_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_problems(name: str, path: str, listing: t.Optional[t.Sequence[str]]) -> t.List[str]:
    """What the model directory PATH (LISTING: its file names, None when it is not a directory) lacks for SGLang."""
    if listing is None:
        return ["%s=%s is not a directory on this node" % (name, path)]
    files = set(listing)
    problems = []
    if "config.json" not in files:
        problems.append("%s=%s has no config.json" % (name, path))
    if not any(all(part in files for part in form) for form in MODEL_TOKENIZER_FILES):
        problems.append("%s=%s has no tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt)"
                        % (name, path))
    if not any(entry.endswith(MODEL_WEIGHT_SUFFIXES) for entry in files):
        problems.append("%s=%s has no weights (*.safetensors, *.bin)" % (name, path))
    return problems


def binds_clash(listening: str, wanted: str) -> bool:
    """Whether a socket listening on LISTENING keeps a bind to WANTED (same port) from succeeding."""
    return listening in WILDCARDS or wanted in WILDCARDS or listening == wanted


def port_problems(listeners: t.Sequence[t.Mapping[str, t.Any]], address: str,
                  wanted: t.Sequence[t.Mapping[str, t.Any]], own_units: t.Sequence[str]) -> t.List[str]:
    """Each port in WANTED ({name, port}) that a listener in LISTENERS ({address, port, pids, units, commands})
    holds where ADDRESS would bind it. A port held only by processes of units named with a prefix in OWN_UNITS
    (the servers an earlier run started, which the role restarts itself) is no problem."""
    problems = []
    for want in wanted:
        holders = [item for item in listeners if item["port"] == int(want["port"]) and binds_clash(item["address"], address)]
        for item in holders:
            units = [unit for unit in item.get("units") or [] if unit]
            if item.get("pids") and units and len(units) == len(item["pids"]) \
                    and all(unit.startswith(tuple(own_units)) for unit in units):
                continue
            if item.get("pids"):
                who = ", ".join("pid %d (%s%s)" % (pid, command, ", " + unit if unit else "")
                                for pid, command, unit in zip(item["pids"], item.get("commands") or [],
                                                              item.get("units") or []))
            else:
                who = "a process this node cannot see (another container or the host sharing its network?)"
            problems.append("port %d (%s) is in use on %s by %s" % (int(want["port"]), want["name"], item["address"], who))
            break
    return problems
