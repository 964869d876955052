# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Proxmox VE states a test switches on a lab container: a backup's lock and freeze, HA management.
"""

from __future__ import annotations

import argparse
import json
import os

from .containers import ct_state, lxc
from .facts import LabError, node_of
from .host import preflight, run, write_if_changed


def set_config_lock(vmid: str, lock: str | None) -> None:
    """Set (or with None clear) the ``lock:`` line of container VMID's Proxmox config, as vzdump's lock_vm and
    unlock_vm do (pve-container src/PVE/VZDump/LXC.pm)."""
    path = os.path.join(node_of(vmid).pve_conf_dir, "%s.conf" % vmid)
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if not line.startswith("lock:")]
    if lock is not None:
        lines.append("lock: %s" % lock)
    write_if_changed(path, "\n".join(sorted(lines)) + "\n")


def cmd_backup(args: argparse.Namespace) -> int:
    """A backup as vzdump runs one, from the container's point of view: ``begin`` locks the config (lock: backup)
    and, in suspend mode, freezes the container (PVE::LXC::freeze, pve-container VZDump/LXC.pm suspend_vm);
    ``end`` thaws it and removes the lock."""
    preflight()
    vmid = args.ct
    if ct_state(vmid) == "absent":
        raise LabError("CT%s does not exist: run 'tests/lab/lab up' first" % vmid)
    if args.action == "begin":
        set_config_lock(vmid, "backup")
        if args.mode == "suspend":
            run(lxc("lxc-freeze", vmid), timeout=60)
    else:
        run(lxc("lxc-unfreeze", vmid), timeout=60, check=False)
        set_config_lock(vmid, None)
    print(json.dumps({"ct": vmid, "lock": "backup" if args.action == "begin" else None,
                      "frozen": args.action == "begin" and args.mode == "suspend"}, sort_keys=True))
    return 0


def cmd_ha(args: argparse.Namespace) -> int:
    """Make container VMID HA-managed (``on``: pct start/stop/shutdown only queue a request with the lab's HA
    manager, which acts a moment later; ``--error``: a resource in the error state, never acted on) or not
    (``off``), as ``ha-manager add|remove ct:VMID`` does (the lab's resources.cfg: tests/lab/pct ``ha_managed``)."""
    preflight()
    path = os.path.join(os.path.dirname(node_of(args.ct).pve_conf_dir), "ha-resources")
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.split()[:2] != ["ct:", args.ct]]
    except FileNotFoundError:
        lines = []
    if args.action == "on":
        lines.append("ct: %s%s" % (args.ct, " state=error" if args.error else ""))
    write_if_changed(path, "".join(line + "\n" for line in lines))
    print(json.dumps({"ct": args.ct, "ha": args.action == "on", "error": bool(args.error)}, sort_keys=True))
    return 0
