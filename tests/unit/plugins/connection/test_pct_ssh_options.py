"""Option handling of the pct_ssh connection plugin, through the real ansible CLIs.

Bad input must fail before any connection is opened. One ansible-playbook run
covers every case in parallel (one inventory host per case); the hosts point
at a closed port, so a case that reached the network would fail differently.
"""

from __future__ import annotations

import pytest

from tests.support.inventory import write_inventory
from tests.support.net import free_port
from tests.support.playbook import ansible_env, run_playbook

pytestmark = pytest.mark.processes  # ansible-playbook and ansible-doc

CASES = {
    "semicolon": ({"proxmox_vmid": "200; reboot"}, "proxmox_vmid"),
    "subshell": ({"proxmox_vmid": "$(reboot)"}, "proxmox_vmid"),
    "too_small": ({"proxmox_vmid": 99}, "proxmox_vmid must be between 100 and 999999999"),
    "unset": ({}, "set proxmox_vmid"),
    "bad_method": ({"proxmox_vmid": 200, "ansible_user": "pveops", "proxmox_become_method": " "}, "pct_become_method"),
    "unreachable": ({"proxmox_vmid": 200}, "cannot reach the Proxmox VE host 127.0.0.1"),
    "unreachable_direct": ({"proxmox_vmid": 200, "ansible_pct_ssh_control_persist": 0}, "cannot reach the Proxmox VE host 127.0.0.1"),
    # paramiko reports these as errors that read like an unreachable host: refused first, naming the variable
    "key_missing": ({"proxmox_vmid": 200, "ansible_ssh_private_key_file": "{tmp}/id_missing"},
                    "ansible_ssh_private_key_file={tmp}/id_missing does not exist on the controller"),
    "key_public": ({"proxmox_vmid": 200, "ansible_ssh_private_key_file": "{tmp}/id_ed25519.pub"},
                   "ansible_ssh_private_key_file={tmp}/id_ed25519.pub is a public key; point it at the private key "
                   "({tmp}/id_ed25519)"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pct_ssh_opts")
    (tmp / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample user@controller\n")
    port = free_port()  # nothing listens there
    hosts = {}
    for name, (variables, _dummy) in CASES.items():
        hosts[name] = dict(
            {key: str(value).replace("{tmp}", str(tmp)) if isinstance(value, str) else value
             for key, value in variables.items()},
            ansible_connection="gpuops.repurpose.pct_ssh",
            ansible_host="127.0.0.1",
            ansible_port=port,
            ansible_ssh_timeout=3,
            ansible_pct_ssh_control_path_dir=str(tmp / "cp"),
        )
    inv = write_inventory(tmp / "inventory.json", hosts)
    run = run_playbook("raw_must_not_run", inv, json_results=True, env=ansible_env(ANSIBLE_FORKS="10"), timeout=120)
    return run.results["try"], tmp


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_input_has_its_message(results, case):
    found, tmp = results
    msg = found[case]["msg"]
    assert CASES[case][1].replace("{tmp}", str(tmp)) in msg, msg
    if case != "unreachable" and case != "unreachable_direct":
        assert "cannot reach" not in msg  # refused before reaching the network


def test_documented_defaults(pct_ssh_doc):
    opts = pct_ssh_doc["options"]
    assert opts["host_key_checking"]["default"] is True
    assert opts["host_key_auto_add"]["default"] is False
    assert opts["pct_path"]["default"] == "/usr/sbin/pct"
    assert opts["proxmox_become_method"]["default"] == "sudo"
    assert opts["command_timeout"]["default"] == 3600
    assert opts["pty"]["default"] is False
    assert [v["name"] for v in opts["vmid"]["vars"]] == ["proxmox_vmid"]


def test_host_login_is_not_ansibles_remote_user(pct_ssh_doc):
    """ActionBase expands ~ in the home of the connection's remote_user; inside the container that is root.

    The host login is consumed from the usual names under another option, and
    the plugin's default_user (the user commands run as in the container) is root.
    """
    opts = pct_ssh_doc["options"]
    assert "remote_user" not in opts
    assert {"ansible_user", "ansible_ssh_user"} <= {v["name"] for v in opts["pve_user"]["vars"]}
    assert [k["name"] for k in opts["pve_user"]["keyword"]] == ["remote_user"]
    from ansible_collections.gpuops.repurpose.plugins.connection.pct_ssh import Connection

    assert Connection.default_user == "root"
