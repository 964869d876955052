"""What a node must have to run a CUDA build: each requirement judged, in words that name fact and need."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._node.needs import (
    GB,
    binds_clash,
    disk_problem,
    driver_problem,
    glibc_problem,
    model_problems,
    node_problems,
    parse_version,
    port_problems,
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


def test_disk_room_is_judged_in_gigabytes_naming_where_it_was_read():
    assert disk_problem("sglang_datagen_venv", "/opt/datagen/venv", "/opt", 31 * GB, 30) is None
    assert disk_problem("sglang_datagen_venv", "/opt/datagen/venv", "/opt", int(12.34 * GB), 30) == (
        "sglang_datagen_venv: the filesystem of /opt/datagen/venv (read at /opt) has 12.3 GB free; it needs 30 GB")
    assert disk_problem("x", "/srv", "/srv", 0, 1) == "x: the filesystem of /srv has 0.0 GB free; it needs 1 GB"


@pytest.mark.parametrize("listing, missing", [
    (["config.json", "tokenizer.json", "tokenizer_config.json", "model-00001-of-00002.safetensors"], []),
    (["config.json", "vocab.json", "merges.txt", "pytorch_model.bin"], []),
    (["config.json", "tokenizer.model", "model.safetensors"], []),
    (["tokenizer.json", "model.safetensors"], ["has no config.json"]),
    (["config.json", "vocab.json", "model.safetensors"], ["has no tokenizer"]),  # vocab.json alone is half a BPE
    (["config.json", "tokenizer.json"], ["has no weights"]),
    (None, ["is not a directory on this node"]),
])
def test_a_model_directory_needs_config_tokenizer_and_weights(listing, missing):
    got = model_problems("sglang_datagen_model_path", "/models/Qwen3-8B", listing)
    assert len(got) == len(missing)
    for problem, words in zip(got, missing):
        assert problem.startswith("sglang_datagen_model_path=/models/Qwen3-8B ") and words in problem, problem


@pytest.mark.parametrize("listening, wanted, clash", [
    ("127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "127.0.0.2", False),  # two lab nodes on one network: the same port on two loopback addresses
    ("0.0.0.0", "127.0.0.2", True),
    ("::", "gpu1.example.internal", True),
    ("127.0.0.1", "0.0.0.0", True),
])
def test_which_binds_clash(listening, wanted, clash):
    assert binds_clash(listening, wanted) is clash


WANTED = [{"name": "sglang_datagen_router_port", "port": 30000},
          {"name": "sglang_datagen_worker_base_port + 0", "port": 31000}]


def test_a_port_held_by_something_else_is_named_with_its_holder():
    listeners = [{"address": "0.0.0.0", "port": 30000, "pids": [812], "commands": ["jupyter-lab"],
                  "units": ["jupyter.service"]},
                 {"address": "127.0.0.1", "port": 31000, "pids": [], "commands": [], "units": []},
                 {"address": "127.0.0.1", "port": 32000, "pids": [9], "commands": ["x"], "units": [""]}]
    got = port_problems(listeners, "127.0.0.1", WANTED, ["sglang-datagen-"])
    assert got == ["port 30000 (sglang_datagen_router_port) is in use on 0.0.0.0 by pid 812 (jupyter-lab, "
                   "jupyter.service)",
                   "port 31000 (sglang_datagen_worker_base_port + 0) is in use on 127.0.0.1 by a process this node "
                   "cannot see (another container or the host sharing its network?)"]


def test_a_port_held_by_the_roles_own_server_is_no_problem():
    """A re-run finds its own workers on their ports: the role restarts them itself."""
    ours = [{"address": "127.0.0.1", "port": 31000, "pids": [4242], "commands": ["python3"],
             "units": ["sglang-datagen-worker@0.service"]}]
    assert port_problems(ours, "127.0.0.1", WANTED, ["sglang-datagen-"]) == []
    # not ours when one holder is outside the role's units, nor when nothing is named as ours
    shared = [dict(ours[0], pids=[4242, 77], commands=["python3", "nc"], units=["sglang-datagen-worker@0.service",
                                                                                "session-1.scope"])]
    assert len(port_problems(shared, "127.0.0.1", WANTED, ["sglang-datagen-"])) == 1
    assert len(port_problems(ours, "127.0.0.1", WANTED, [])) == 1
