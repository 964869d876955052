# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab's lanes: independent copies of the CT200 lab on one machine, so lab tests run side by side.

Lane 0 is the lab the README describes (``/var/lib/gpuops-lab``, the PVE host on port 2222, CT200,
CT201, the second node's CT210, the users ``pveops``/``pvenosudo``/``pvenarrow``, ``inventories/lab``). Lane L
(1..MAX_LANES-1) is the same lab shifted so that no two lanes share a lock, a port, a path, a
container, a user or a tmux server:

- its state under ``/var/lib/gpuops-lab-laneL`` (so its own lock, fake GPUs, lxcpath, keys);
- its PVE hosts' sshd on ``2222 + 10*L`` (node 2: one more);
- its containers ``200 + 1000*L`` (CT1200, CT1201 and the second node's CT1210 for lane 1): each
  container runs its own systemd and tmux server;
- its users ``pveops-lL``/``pvenosudo-lL``/``pvenarrow-lL`` and its sudo rule file;
- its datagen services (workers, router, metrics) bound to ``127.0.L.1`` (node 2: ``127.0.L.2``):
  the containers share the machine's network, so the role's default ports stay apart by address,
  as two machines' would.

A lane's inventories are the checkout's ``inventories/lab`` and ``inventories/lab-fleet`` rendered
with that lane's facts (:func:`render_inventory`), written by ``lab up`` under the lane's directory;
for lane 0 the rendering is the identity. Which lane a process uses: ``GPUOPS_LAB_LANE`` (default 0).

Standard library only: the lab (``tests/lab/labctl``, run by the system python3) and the tests both load it.
"""

from __future__ import annotations

import dataclasses
import os
import re

LANE_ENV = "GPUOPS_LAB_LANE"
MAX_LANES = 8
BASE_DIR = "/var/lib/gpuops-lab"
BASE_PORT = 2222
PORT_STRIDE = 10  # node 1 at base + stride*L, node 2 one above it
VMID_STRIDE = 1000
# the lab's containers in lane 0, by role: the GPU container, the stopped decoy, the second node's GPU container
BASE_VMIDS = {"main": 200, "decoy": 201, "node2": 210}
HOSTNAMES = {"main": "ct200", "decoy": "ct201", "node2": "ct210"}
BASE_SUDO_USER = "pveops"
BASE_NOSUDO_USER = "pvenosudo"
BASE_NARROW_USER = "pvenarrow"
BASE_SUDOERS = "/etc/sudoers.d/gpuops-lab"
# what the checkout's lab inventories name, replaced by a lane's own (render_inventory)
INVENTORIES = ("lab", "lab-fleet")


class LaneError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Lane:
    index: int
    lab_dir: str
    port: int  # node 1's PVE host (sshd); node 2's is port + 1
    vmids: dict  # role ("main", "decoy", "node2") -> VMID (str)
    sudo_user: str  # key login, sudo NOPASSWD for pct only
    nosudo_user: str  # key login, no sudo rule
    narrow_user: str  # key login, sudo NOPASSWD for the forced-command wrapper examples/pve-host/pct-narrow only
    sudoers: str
    datagen_hosts: tuple  # the address each node's datagen services bind (node 1, node 2)

    @property
    def port2(self) -> int:
        return self.port + 1

    @property
    def main_ct(self) -> str:
        return self.vmids["main"]

    @property
    def decoy_ct(self) -> str:
        return self.vmids["decoy"]

    @property
    def node2_ct(self) -> str:
        return self.vmids["node2"]

    def inventory(self, name: str = "lab") -> str:
        """Where ``lab up`` writes this lane's copy of the checkout's ``inventories/NAME``."""
        return os.path.join(self.lab_dir, "inventories", name)

    def facts(self) -> dict:
        """What ``lab status`` prints under ``lane``."""
        return {
            "index": self.index,
            "lab_dir": self.lab_dir,
            "port": self.port,
            "port2": self.port2,
            "vmids": dict(self.vmids),
            "hostnames": {self.vmids[role]: name for role, name in HOSTNAMES.items()},
            "users": {"sudo": self.sudo_user, "nosudo": self.nosudo_user, "narrow": self.narrow_user},
            "sudoers": self.sudoers,
            "datagen_hosts": list(self.datagen_hosts),
            "inventories": {name: self.inventory(name) for name in INVENTORIES},
        }


def lane_index(raw: str | None) -> int:
    """GPUOPS_LAB_LANE's value as a lane number (unset or empty: 0)."""
    if raw is None or raw.strip() == "":
        return 0
    try:
        index = int(raw)
    except ValueError:
        index = -1
    if not 0 <= index < MAX_LANES:
        raise LaneError("%s=%r: a lane is a number from 0 to %d" % (LANE_ENV, raw, MAX_LANES - 1))
    return index


def lane(index: int, base_dir: str = BASE_DIR, base_port: int = BASE_PORT) -> Lane:
    """Lane INDEX's facts, lane 0 being at BASE_DIR and BASE_PORT."""
    if not 0 <= index < MAX_LANES:
        raise LaneError("lane %d: a lane is a number from 0 to %d" % (index, MAX_LANES - 1))
    suffix = "" if index == 0 else "-lane%d" % index
    user_suffix = "" if index == 0 else "-l%d" % index
    return Lane(
        index=index,
        lab_dir=base_dir.rstrip("/") + suffix,
        port=base_port + PORT_STRIDE * index,
        vmids={role: str(vmid + VMID_STRIDE * index) for role, vmid in BASE_VMIDS.items()},
        sudo_user=BASE_SUDO_USER + user_suffix,
        nosudo_user=BASE_NOSUDO_USER + user_suffix,
        narrow_user=BASE_NARROW_USER + user_suffix,
        sudoers=BASE_SUDOERS + suffix,
        datagen_hosts=("127.0.%d.1" % index, "127.0.%d.2" % index),
    )


def current(environ: dict | None = None) -> Lane:
    """The lane this process uses: GPUOPS_LAB_LANE (default 0)."""
    env = os.environ if environ is None else environ
    return lane(lane_index(env.get(LANE_ENV)))


def render_inventory(text: str, target: Lane) -> str:
    """The checkout's lab inventory text (hosts.yml or a group_vars file) with lane 0's facts replaced by TARGET's.

    Only values are replaced, each where its key says what it is: the lab directory's paths, the PVE hosts'
    ports, the containers' VMIDs and the datagen addresses. For lane 0 the text comes back unchanged.
    """
    base = lane(0)
    if target.index == 0:
        return text
    vmid_of = {base.vmids[role]: target.vmids[role] for role in base.vmids}
    port_of = {str(base.port): str(target.port), str(base.port2): str(target.port2)}
    host_of = dict(zip(base.datagen_hosts, target.datagen_hosts))
    out = re.sub(re.escape(base.lab_dir) + r"(?=/)", target.lab_dir, text)
    out = re.sub(r"(?m)^(\s*ansible_port:\s*)(\d+)\s*$", lambda m: m.group(1) + port_of.get(m.group(2), m.group(2)),
                 out)
    out = re.sub(r"(?m)^(\s*proxmox_vmid:\s*)(\d+)\s*$", lambda m: m.group(1) + vmid_of.get(m.group(2), m.group(2)),
                 out)
    out = re.sub(r"(?m)^(\s*sglang_datagen_host:\s*)(\S+)\s*$",
                 lambda m: m.group(1) + host_of.get(m.group(2), m.group(2)), out)
    header = "# lane %d of the lab: written by tests/lab/lab up from the checkout's inventory (do not edit)\n" % (
        target.index)
    return header + out


def write_inventories(checkout_inventories: str, target: Lane) -> dict:
    """Render every file of the checkout's lab inventories into TARGET's directory (symlinks kept as they are).
    Returns {name: path}. Files that are not in the checkout's any more are removed."""
    written = {}
    for name in INVENTORIES:
        src_top = os.path.join(checkout_inventories, name)
        dest_top = target.inventory(name)
        want = set()
        for dirpath, _dirs, files in os.walk(src_top):
            rel_dir = os.path.relpath(dirpath, src_top)
            os.makedirs(os.path.join(dest_top, rel_dir), mode=0o755, exist_ok=True)
            for fname in files:
                src = os.path.join(dirpath, fname)
                rel = os.path.normpath(os.path.join(rel_dir, fname))
                dest = os.path.join(dest_top, rel)
                want.add(rel)
                if os.path.islink(src):
                    link = os.readlink(src)
                    if not (os.path.islink(dest) and os.readlink(dest) == link):
                        if os.path.lexists(dest):
                            os.unlink(dest)
                        os.symlink(link, dest)
                    continue
                with open(src, encoding="utf-8") as handle:
                    text = render_inventory(handle.read(), target)
                if os.path.islink(dest) or not os.path.isfile(dest) or _read(dest) != text:
                    tmp = dest + ".new"
                    with open(tmp, "w", encoding="utf-8") as handle:
                        handle.write(text)
                    os.replace(tmp, dest)
        for dirpath, _dirs, files in os.walk(dest_top):
            for fname in files:
                rel = os.path.normpath(os.path.relpath(os.path.join(dirpath, fname), dest_top))
                if rel not in want:
                    os.unlink(os.path.join(dirpath, fname))
        written[name] = dest_top
    return written


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()
