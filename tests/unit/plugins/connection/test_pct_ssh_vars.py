"""pct_ssh warns once per ssh-only variable it ignores, naming what to set instead.

The table is compared with the two plugins' own docs (ansible-core's ssh and
pct_ssh), so a variable added to ansible.builtin.ssh shows up here. The
warnings are seen through the real ansible-playbook: two hosts, two tasks,
one warning per name.
"""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh_vars
from tests.support.inventory import write_inventory
from tests.support.net import free_port
from tests.support.playbook import run_playbook

pytestmark = pytest.mark.processes  # ansible-playbook and ansible-doc


def _doc_vars(doc: dict) -> dict:
    return {v["name"]: name for name, opt in doc["options"].items() for v in opt.get("vars") or [] if "[" not in v["name"]}


def test_table_is_exactly_the_ssh_variables_pct_ssh_does_not_use(pct_ssh_doc):
    from ansible.plugins.connection import ssh

    ssh_vars = _doc_vars(yaml.safe_load(ssh.DOCUMENTATION))
    pct_vars = _doc_vars(pct_ssh_doc)
    used = {name for name, option in pct_vars.items() if option != "ssh_only_vars"}
    assert set(_pct_ssh_vars.SSH_ONLY_VARS) == set(ssh_vars) - used
    # and the plugin declares exactly those names, so Ansible hands them over
    assert {name for name, option in pct_vars.items() if option == "ssh_only_vars"} == set(_pct_ssh_vars.SSH_ONLY_VARS)


def test_every_named_replacement_is_a_pct_ssh_variable(pct_ssh_doc):
    pct_vars = _doc_vars(pct_ssh_doc)
    for name, advice in _pct_ssh_vars.SSH_ONLY_VARS.items():
        for word in advice.replace(",", " ").replace("(", " ").replace(")", " ").split():
            if word.startswith("ansible_"):
                assert word in pct_vars and pct_vars[word] != "ssh_only_vars", (name, word)


def test_messages_name_the_variable_and_the_fix_without_hosts():
    msgs = _pct_ssh_vars.ignored_var_warnings(["ansible_ssh_pipelining", "ansible_user", "ansible_ssh_common_args"])
    assert msgs == [
        "pct_ssh ignores ansible_ssh_common_args, a variable of ansible.builtin.ssh: pct_ssh logs in with paramiko, "
        "not the ssh command, so ssh options do not apply; for a jump host set ansible_paramiko_proxy_command.",
        "pct_ssh ignores ansible_ssh_pipelining, a variable of ansible.builtin.ssh: "
        "set ansible_pct_ssh_pipelining (or ansible_pipelining) instead.",
    ]
    assert _pct_ssh_vars.ignored_var_warnings(["ansible_user", "ansible_pipelining"]) == []


def test_ansible_playbook_warns_once_per_name(tmp_path):
    port = free_port()  # closed: options are read before any connection
    common = dict(
        ansible_connection="gpuops.repurpose.pct_ssh", ansible_host="127.0.0.1", ansible_port=port, ansible_ssh_timeout=3,
        proxmox_vmid=200, ansible_pct_ssh_control_path_dir=str(tmp_path / "cp"),
        ansible_ssh_pipelining=False, ansible_ssh_common_args="-o ProxyJump=bastion.example.internal",
    )
    hosts = {"a": dict(common), "b": dict(common), "plain": {k: v for k, v in common.items() if not k.startswith("ansible_ssh_") or k == "ansible_ssh_timeout"}}
    inv = write_inventory(tmp_path / "inv.json", hosts)
    done = run_playbook("raw_true_twice", inv, timeout=120)
    out = " ".join(done.output.split())  # warnings are wrapped to the terminal width
    assert out.count("pct_ssh ignores ansible_ssh_pipelining") == 1, out[-3000:]
    assert out.count("set ansible_pct_ssh_pipelining (or ansible_pipelining) instead") == 1
    assert out.count("pct_ssh ignores ansible_ssh_common_args") == 1
    assert out.count("pct_ssh ignores") == 2
