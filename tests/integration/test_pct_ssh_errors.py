"""Bad inputs through pct_ssh against the lab: each ends in its documented error, with nothing run.

One ansible-playbook run, one inventory host per case, each trying to create a
marker file in CT200 (or CT201). Afterwards the markers are looked for through
a good connection, and CT201 must still be stopped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.inventory import pct_ssh_hostvars as base_vars
from tests.support.lab import DECOY_CT, MAIN_CT, NOSUDO_USER, SUDO_USER, lab_status, require_stopped
from tests.support.playbook import run_json_play

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]


def cases(status: dict, tmp: Path) -> dict:
    wrong_key = tmp / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    empty_known = tmp / "empty_known_hosts"
    empty_known.write_text("")
    return {
        "vmid_injection": (base_vars(status, proxmox_vmid=f"{MAIN_CT}; reboot"), ["proxmox_vmid"]),
        "vmid_missing": (base_vars(status, proxmox_vmid=999), ["container 999 does not exist on 127.0.0.1"]),
        "ct_stopped": (base_vars(status, proxmox_vmid=int(DECOY_CT)),
                       [f"container {DECOY_CT} on", "is stopped", "ensure_running"]),
        "wrong_key": (base_vars(status, ansible_ssh_private_key_file=str(wrong_key), ansible_pct_ssh_look_for_keys=False),
                      ["login to the Proxmox VE host 127.0.0.1:%s as root failed" % status["port"]]),
        "unknown_host_key": (base_vars(status, ansible_pct_ssh_known_hosts_file=str(empty_known)),
                             ["is not in %s" % empty_known, "SHA256:", "host_key_auto_add"]),
        "sudo_rule_missing": (base_vars(status, ansible_user=NOSUDO_USER),
                              [f"host user {NOSUDO_USER} may not run pct",
                               f"`{NOSUDO_USER} ALL=(root) NOPASSWD: /usr/sbin/pct`"]),
        "unreachable": (base_vars(status, ansible_port=1), ["cannot reach the Proxmox VE host 127.0.0.1:1"]),
        # the lab host has no doas, as a stock Proxmox VE install has no sudo: named, never blamed on pct_path
        "become_missing": (base_vars(status, ansible_user=SUDO_USER, proxmox_become_method="doas"),
                           ["has no doas (a stock Proxmox VE install ships none)", f"host user {SUDO_USER} cannot run pct",
                            f"`permit nopass {SUDO_USER} as root cmd /usr/sbin/pct`"]),
    }


@pytest.fixture(scope="module")
def outcome(lab, tmp_path_factory):
    status = lab
    require_stopped(status)
    tmp = tmp_path_factory.mktemp("pct_ssh_errors")
    table = cases(status, tmp)
    recorded = tmp / "recorded_known_hosts"
    hosts = {name: dict(v[0]) for name, v in table.items()}
    # the one good case: accept and record an unknown host key when told to
    hosts["auto_add"] = base_vars(status, ansible_pct_ssh_known_hosts_file=str(recorded), ansible_pct_ssh_host_key_auto_add=True)
    results = run_json_play(tmp, hosts, "pct_ssh_errors", timeout=240)
    return table, results, recorded, status


@pytest.mark.parametrize(
    "case", ["vmid_injection", "vmid_missing", "ct_stopped", "wrong_key", "unknown_host_key", "sudo_rule_missing", "unreachable",
             "become_missing"]
)
def test_documented_error(outcome, case):
    table, results = outcome[:2]
    r = results["try"][case]
    assert r.get("failed") or r.get("unreachable"), r
    for fragment in table[case][1]:
        assert fragment in r["msg"], r["msg"]


def test_nothing_ran_for_any_bad_input(outcome):
    results = outcome[1]
    found = sorted(os.path.basename(f["path"]) for f in results["markers"]["auto_add"]["files"])
    assert found == ["pct_ssh_marker_auto_add"]


def test_unknown_host_key_accepted_and_recorded_only_when_asked(outcome):
    results, recorded, status = outcome[1:]
    assert results["try"]["auto_add"]["rc"] == 0
    line = recorded.read_text().split()
    assert line[0] == "[%s]:%s" % (status["host"], status["port"])
    known = open(status["known_hosts"]).read()
    assert line[2] in known  # the very key the lab's known_hosts holds


def test_stopped_container_was_not_started(outcome):
    assert lab_status()["containers"][DECOY_CT] == "stopped"
