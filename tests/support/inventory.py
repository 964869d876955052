"""Inventories for a test: host variables that reach the lab's containers, written as a JSON inventory.

The checkout's own ``inventories/lab`` (``paths.LAB_INVENTORY``) is what the role tests
use; a test that needs a matrix of hosts (users, pipelining, transfer methods) writes
its own with :func:`write_inventory`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Union

from tests.support.lab import MAIN_CT


def _lab_login(status: dict, connection: str, **extra) -> dict:
    """The PVE host's root login with the lab's key, through CONNECTION; EXTRA overrides."""
    return {
        "ansible_connection": connection,
        "ansible_host": status["host"],
        "ansible_port": status["port"],
        "ansible_user": "root",
        "ansible_ssh_private_key_file": status["key"],
        "ansible_python_interpreter": "/usr/bin/python3",
        **extra,
    }


def pct_ssh_hostvars(status: dict, **extra) -> dict:
    """Host variables for CT200 through ``gpuops.repurpose.pct_ssh`` as the PVE host's root; EXTRA overrides."""
    return _lab_login(status, "gpuops.repurpose.pct_ssh",
                      **{"ansible_pct_ssh_known_hosts_file": status["known_hosts"], "proxmox_vmid": int(MAIN_CT), **extra})


def openssh_hostvars(status: dict, **extra) -> dict:
    """Host variables for the PVE host itself through ``ansible.builtin.ssh`` with the lab's key; EXTRA overrides."""
    common = "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes" % status["known_hosts"]
    return _lab_login(status, "ansible.builtin.ssh", **{"ansible_ssh_common_args": common, **extra})


def write_inventory(path: Union[str, Path], hosts: Dict[str, dict], groups: Dict[str, Dict[str, dict]] = None) -> Path:
    """A JSON inventory at PATH: HOSTS (name -> vars) in ``all``, and GROUPS (group -> {name: vars})."""
    data: dict = {"all": {"hosts": hosts}}
    if groups:
        data["all"]["children"] = {name: {"hosts": members} for name, members in groups.items()}
    path = Path(path)
    path.write_text(json.dumps(data))
    return path
