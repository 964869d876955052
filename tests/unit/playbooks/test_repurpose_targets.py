"""playbooks/repurpose_ct200.yml pointed at a host that is not a container: refused by name, never re-offered.

A PVE host in the play (``-e repurpose_hosts=pve_hosts``) used to fail on "missing required argument
stop_training_pve_host", and the fleet summary's re-run line sent the operator at the PVE host again. The PVE
host here is a placeholder reached with the local connection: the validation pass refuses it on the controller
before any connection is made, so nothing is touched anywhere.
"""

from __future__ import annotations

import json

import pytest

from tests.support.playbook import run_playbook
from tests.support.stop_training import REPURPOSE_PLAYBOOK

pytestmark = pytest.mark.processes


def test_a_pve_host_in_the_play_is_named_as_not_a_container(tmp_path):
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {
        "pve_hosts": {"hosts": {"pve1.example.internal": {"ansible_connection": "local"}}},
        "training_containers": {"hosts": {}}}}}))
    done = run_playbook(REPURPOSE_PLAYBOOK, inventory, [{"repurpose_hosts": "pve_hosts"}], timeout=300)
    out = " ".join(done.output.split())
    assert done.rc != 0, out[-3000:]
    assert ("pve1.example.internal is not a container: it has no proxmox_vmid (or stop_training_vmid) and no "
            "stop_training_pve_host, and it is in pve_hosts") in out, out[-3000:]
    assert "never at a PVE host" in out and "missing required argument" not in out, out[-3000:]
    assert "FLEET: 0 of 1 container(s)" in out and "pve1.example.internal (not a container): FAILED" in out, out[-3000:]
    assert "--limit pve1.example.internal" not in out, out[-3000:]
