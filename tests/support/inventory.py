"""Inventories for a test: host variables that reach the lab's containers, written as a JSON inventory.

The checkout's own ``inventories/lab`` (``paths.LAB_INVENTORY``) is what the role tests
use; a test that needs a matrix of hosts (users, pipelining, transfer methods) writes
its own with :func:`write_inventory`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Union


def pct_ssh_hostvars(status: dict, **extra) -> dict:
    """Host variables for CT200 through ``gpuops.repurpose.pct_ssh`` as the PVE host's root; EXTRA overrides."""
    hostvars = dict(
        ansible_connection="gpuops.repurpose.pct_ssh",
        ansible_host=status["host"],
        ansible_port=status["port"],
        ansible_user="root",
        ansible_ssh_private_key_file=status["key"],
        ansible_pct_ssh_known_hosts_file=status["known_hosts"],
        ansible_python_interpreter="/usr/bin/python3",
        proxmox_vmid=200,
    )
    hostvars.update(extra)
    return hostvars


def openssh_hostvars(status: dict, **extra) -> dict:
    """Host variables for the PVE host itself through ``ansible.builtin.ssh`` with the lab's key; EXTRA overrides."""
    hostvars = dict(
        ansible_connection="ansible.builtin.ssh",
        ansible_host=status["host"],
        ansible_port=status["port"],
        ansible_user="root",
        ansible_ssh_private_key_file=status["key"],
        ansible_ssh_common_args="-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        % status["known_hosts"],
        ansible_python_interpreter="/usr/bin/python3",
    )
    hostvars.update(extra)
    return hostvars


def write_inventory(path: Union[str, Path], hosts: Dict[str, dict], groups: Dict[str, Dict[str, dict]] = None) -> Path:
    """A JSON inventory at PATH: HOSTS (name -> vars) in ``all``, and GROUPS (group -> {name: vars})."""
    data: dict = {"all": {"hosts": hosts}}
    if groups:
        data["all"]["children"] = {name: {"hosts": members} for name, members in groups.items()}
    path = Path(path)
    path.write_text(json.dumps(data))
    return path
