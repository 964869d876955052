"""gpu_node_info's reading of a node, against the lab's fake nvidia-smi (a real process, real CSV) and this
machine's real Python interpreters."""

from __future__ import annotations

import sys

import pytest
from fakegpu_harness import NVIDIA_SMI, FakeGpus

from ansible_collections.gpuops.repurpose.plugins.module_utils._node.info import glibc_version, read_node

PARAMS = {"nvidia_smi_path": NVIDIA_SMI, "timeout": 30, "cuda_major": None, "glibc": None, "python_path": None,
          "python_min": None, "python_max": None}


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    fake = FakeGpus(str(tmp_path), driver=False)
    monkeypatch.setenv("FAKEGPU_DIR", fake.dir)
    yield fake
    fake.close()


def test_reads_the_gpus_and_the_driver_and_finds_nothing_missing(gpus):
    found = read_node(dict(PARAMS, cuda_major=13, glibc="2.34", python_path=sys.executable, python_min="3.11",
                           python_max="3.13"))
    assert found["gpu_count"] == 8 and [g["index"] for g in found["gpus"]] == list(range(8))
    assert found["driver_version"] == "580.95.05" and found["nvidia_smi_error"] == ""
    assert found["glibc_version"] == glibc_version() != ""
    assert found["python_version"].startswith("%d.%d." % sys.version_info[:2]) and found["python_venv"] is True
    assert found["problems"] == []


def test_an_r570_driver_cannot_run_a_cuda_13_build(gpus):
    gpus.config(driver_version="570.124.06", cuda_version="12.8")
    found = read_node(dict(PARAMS, cuda_major=13))
    assert found["driver_version"] == "570.124.06"
    assert found["problems"] == ["NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds"]
    assert read_node(dict(PARAMS, cuda_major=12))["problems"] == []


def test_a_driver_that_is_not_loaded_is_named(gpus):
    gpus.config(mode="no_driver")
    found = read_node(dict(PARAMS, cuda_major=13))
    assert found["gpus"] == [] and found["driver_version"] == ""
    assert found["problems"] == ["the NVIDIA driver could not be read: " + found["nvidia_smi_error"]]
    assert "rc 9" in found["nvidia_smi_error"], found["nvidia_smi_error"]


def test_an_interpreter_that_is_not_there_is_named(gpus, tmp_path):
    missing = str(tmp_path / "python3.12")
    found = read_node(dict(PARAMS, python_path=missing, python_min="3.11"))
    assert found["python_version"] == "" and found["python_venv"] is False
    assert found["problems"] == ["%s did not run (%s)" % (missing, found["python_error"])], found
