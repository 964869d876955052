"""tests/lab/pct's command line without containers: real pct's messages and exit codes.

Runs the real script (as root, against an empty lab dir) so argument
handling, VMID validation and the missing-container paths are checked
without the lab being up. The container paths are in test_lab.py.
"""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.support.paths import LAB_DIR

PCT = str(LAB_DIR / "pct")
NODE = socket.gethostname().split(".")[0]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pct refuses non-root callers, as the real one")


@pytest.fixture()
def pct(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, GPUOPS_LAB_DIR=str(tmp_path / "gpuops-lab"))
        return subprocess.run([PCT, *args], capture_output=True, text=True, timeout=30, env=env, check=False)

    return run


def test_missing_container(pct):
    for args in (["status", "999"], ["config", "999"], ["exec", "999", "--", "true"]):
        res = pct(*args)
        assert (res.returncode, res.stdout) == (255, "")
        assert res.stderr == "Configuration file 'nodes/%s/lxc/999.conf' does not exist\n" % NODE


def test_stop_and_push_check_running_first(pct, tmp_path):
    # as in pve-container: these look at the running state before the config
    assert pct("stop", "999").stderr == "CT 999 not running\n"
    assert pct("shutdown", "999").stderr == "CT 999 not running\n"
    assert pct("reboot", "999").stderr == "VM 999 not running\n"
    assert pct("push", "999", str(tmp_path), "/x").stderr == "can only push files to a running CT\n"
    res = pct("pull", "999", "/x", str(tmp_path / "y"))
    assert res.returncode == 255
    assert res.stderr.startswith("can only pull files from a running VM at /usr/share/perl5/PVE/CLI/pct.pm line ")


def test_invalid_vmid_is_a_parameter_error(pct):
    res = pct("exec", "12", "--", "true")
    assert res.returncode == 255
    assert res.stderr == (
        "400 Parameter verification failed.\n"
        "vmid: invalid format - value does not look like a valid VM ID\n"
        "pct exec <vmid> [<extra-args>] [OPTIONS]\n"
    )


def test_argument_errors(pct):
    res = pct("status")
    assert (res.returncode, res.stderr) == (255, "400 not enough arguments\npct status <vmid> [OPTIONS]\n")
    res = pct("status", "200", "--bogus")
    assert res.returncode == 255
    assert res.stderr.splitlines()[:2] == ["Unknown option: bogus", "400 unable to parse option"]
    res = pct("frobnicate")
    assert res.returncode == 255
    assert res.stderr.startswith("ERROR: unknown command 'pct frobnicate'\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
    res = pct("exec", "200", "--keep-env", "maybe", "--", "true")
    assert (res.returncode, res.stderr) == (
        255, "400 unable to parse boolean option\npct exec <vmid> [<extra-args>] [OPTIONS]\n")


def test_list_without_containers_prints_nothing(pct):
    res = pct("list")
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_reboot_hang_fault_keeps_the_checks_before_it(pct, tmp_path):
    """The lab's reboot-hang fault (README "Faults") changes only a running CT's reboot: parameters and a
    stopped CT fail at once, as without it; a malformed --timeout is a parameter error as in pve-common."""
    faults = tmp_path / "gpuops-lab" / "faults"
    faults.mkdir(parents=True)
    (faults / "reboot-hang").write_text("")
    res = pct("reboot", "999", "--timeout", "5")
    assert (res.returncode, res.stdout, res.stderr) == (255, "", "VM 999 not running\n")
    res = pct("reboot", "999", "--timeout", "soon")
    assert (res.returncode, res.stderr) == (255, (
        "400 Parameter verification failed.\n"
        "timeout: type check ('integer') failed - got 'soon'\n"
        "pct reboot <vmid> [OPTIONS]\n"))
    res = pct("reboot", "999", "--timeout", "-1")
    assert res.returncode == 255
    assert res.stderr.splitlines()[1] == "timeout: value must have a minimum value of 0"
