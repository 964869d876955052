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
        problems.append(python_problem(facts.get("python_version", ""), python_min, python_max, python_path,
                                       facts.get("python_error", ""))
                        or (None if facts.get("python_venv") else "%s cannot create a venv (%s)" % (
                            python_path, facts.get("python_error") or "no venv or ensurepip module")))
    return [problem for problem in problems if problem]
