"""Copies that pct push/pull fail the way a real Proxmox VE host's do, through pct_ssh against the lab.

pve-container's ``pct push`` and ``pct pull`` exit 0 when the copy fails: the reason is on stderr (a file that
cannot be created) or nowhere at all (File::Copy's result is never checked, so a full disk cuts the copy short
in silence), and a failed pull leaves its destination behind, empty. The lab's pct does the same
(tests/lab/README.md "Fidelity"). Each case here must fail its task naming the reason, and a failed fetch must
leave no file on the controller. The disks are real: tmpfs mounts inside CT200, one without a free inode and one
without free space; only the PVE host's full disk is the lab's ``pull-enospc`` fault.
"""

from __future__ import annotations

import os

import pytest

from tests.support.inventory import pct_ssh_hostvars
from tests.support.playbook import run_json_play

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

PLAYBOOK = "pct_ssh_copy_checks"
SOURCE_BYTES = 256 * 1024  # four times the 64 KiB disk


@pytest.fixture(scope="module")
def outcome(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pct_ssh_copy_checks")
    src = tmp / "source.bin"
    src.write_bytes(os.urandom(SOURCE_BYTES))
    fetched = tmp / "fetched" / "hostname"
    fetched.parent.mkdir()
    common = {"it_src": str(src)}
    os.makedirs(os.path.dirname(lab["faults"]["pull_enospc"]), exist_ok=True)  # the play switches it on and off
    hosts = {
        "setup": pct_ssh_hostvars(lab, it_inodes=2),
        # the copy's temporary directory takes the disk's last inode: pct push cannot create the file
        "push_noinode": pct_ssh_hostvars(lab, ansible_remote_tmp="/mnt/gpuops-noinode", ansible_pipelining=True, **common),
        "push_tiny": pct_ssh_hostvars(lab, ansible_remote_tmp="/mnt/gpuops-tiny", ansible_pipelining=True, **common),
        "push_tiny_cat": pct_ssh_hostvars(lab, ansible_remote_tmp="/mnt/gpuops-tiny", ansible_pipelining=True,
                                          ansible_pct_ssh_transfer_method="cat", **common),
        "fetch_enospc": pct_ssh_hostvars(lab, it_fetch=str(fetched), it_fault=lab["faults"]["pull_enospc"]),
    }
    return run_json_play(tmp, hosts, PLAYBOOK, timeout=240), fetched


def copy_result(outcome, host: str) -> dict:
    return outcome[0]["copy"][host]


def test_a_push_that_pct_reports_only_on_stderr_fails_the_task_naming_it(outcome):
    r = copy_result(outcome, "push_noinode")
    assert r.get("failed"), r
    assert "pct_ssh: pct push to /mnt/gpuops-noinode/" in r["msg"], r["msg"]
    assert "failed to create file: /mnt/gpuops-noinode/" in r["msg"] and "No space left on device" in r["msg"], r["msg"]


def test_a_push_cut_short_in_silence_fails_the_task_naming_the_sizes(outcome):
    r = copy_result(outcome, "push_tiny")
    assert r.get("failed"), r
    assert "pct_ssh: pct push to /mnt/gpuops-tiny/" in r["msg"], r["msg"]
    assert "the source %d (truncated: is the destination's disk full?)" % SOURCE_BYTES in r["msg"], r["msg"]


def test_a_cat_copy_onto_a_full_disk_fails_the_task_naming_cat_s_error(outcome):
    r = copy_result(outcome, "push_tiny_cat")
    assert r.get("failed"), r
    assert "pct_ssh: writing /mnt/gpuops-tiny/" in r["msg"] and "No space left on device" in r["msg"], r["msg"]


def test_a_pull_that_pct_reports_only_on_stderr_fails_the_fetch_and_leaves_no_file(outcome):
    results, fetched = outcome
    r = results["fetch"]["fetch_enospc"]
    assert r.get("failed"), r
    assert "pct_ssh: pct pull of /etc/hostname in container" in r["msg"], r["msg"]
    assert "failed to create file: /tmp/.pct_ssh-" in r["msg"] and "No space left on device" in r["msg"], r["msg"]
    assert not fetched.exists(), "a failed fetch left %s" % fetched
    # once the disk has room again, the same fetch works
    assert results["fetch again"]["fetch_enospc"].get("changed"), results["fetch again"]
    assert fetched.with_name("hostname.again").read_text().strip()
