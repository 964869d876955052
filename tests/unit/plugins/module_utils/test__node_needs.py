"""What a node must have to run a CUDA build: each requirement judged, in words that name fact and need."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._node_needs import (
    driver_problem,
    glibc_problem,
    node_problems,
    parse_version,
    python_problem,
)


@pytest.mark.parametrize("driver, cuda, problem", [
    ("580.95.05", 13, None),
    ("580.00", 13, None),  # r580 runs every CUDA 13 toolkit (minor version compatibility)
    ("570.124.06", 13, "NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds"),
    ("550.54.15", 12, None),
    ("525.60.12", 12, "NVIDIA driver 525.60.12 is older than 525.60.13, the oldest that runs CUDA 12 builds"),
    ("", 13, "nvidia-smi reported no driver version ('')"),
    ("580.95.05", 14, "no driver minimum is known for CUDA 14 (known: 11, 12, 13)"),
])
def test_driver_against_the_cuda_major_of_the_build(driver, cuda, problem):
    assert driver_problem(driver, cuda) == problem


def test_versions_compare_as_numbers_not_text():
    assert parse_version("580.9") < parse_version("580.65.06") < parse_version("580.100")
    assert parse_version("2.36-9+deb12u14") == (2, 36)
    assert parse_version("unknown") is None


@pytest.mark.parametrize("found, problem", [
    ("2.36", None),
    ("2.34", None),
    ("2.31", "glibc 2.31 is older than 2.34, the oldest the wheels are built for (manylinux_2_34)"),
    ("", "the node's glibc version could not be read (not a glibc system?); wheels need glibc >= 2.34"),
])
def test_glibc_against_the_wheels_manylinux_tag(found, problem):
    assert glibc_problem(found, "2.34") == problem


@pytest.mark.parametrize("found, problem", [
    ("3.11.2", None),
    ("3.13.9", None),
    ("3.10.12", "/usr/bin/python3 is Python 3.10; the wheels need Python >= 3.11"),
    ("3.14.0", "/usr/bin/python3 is Python 3.14; the wheels exist up to Python 3.13 only"),
    ("", "/usr/bin/python3 did not run (no output)"),
])
def test_python_against_the_wheels_range(found, problem):
    assert python_problem(found, "3.11", "3.13", "/usr/bin/python3") == problem


def test_every_unmet_requirement_is_listed_driver_first():
    facts = {"driver_version": "570.124.06", "glibc_version": "2.31", "python_version": "3.11.2",
             "python_venv": False, "python_error": "ModuleNotFoundError: No module named 'ensurepip'"}
    assert node_problems(facts, 13, "2.34", "/usr/bin/python3", "3.11", "3.13") == [
        "NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds",
        "glibc 2.31 is older than 2.34, the oldest the wheels are built for (manylinux_2_34)",
        "/usr/bin/python3 cannot create a venv (ModuleNotFoundError: No module named 'ensurepip')",
    ]


def test_an_unreadable_driver_is_a_problem_only_when_a_cuda_build_is_asked_for():
    facts = {"nvidia_smi_error": "nvidia-smi not found on PATH", "glibc_version": "2.36"}
    assert node_problems(facts, None, "", "", "", "") == []
    assert node_problems(facts, 13, "", "", "", "") == [
        "the NVIDIA driver could not be read: nvidia-smi not found on PATH"]
