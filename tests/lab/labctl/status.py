# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``lab status``: the lab's facts as JSON, for tests and people (tests/support/lab.py reads it).
"""

from __future__ import annotations

import os
import shlex

from .containers import ct_state, is_unprivileged
from .facts import (
    CONTAINERS,
    CT_FAKEGPU_DIR,
    CT_LAB,
    CT_SIGNAL_AUDIT,
    DECOY_SESSIONS,
    FAKEGPU_DIR,
    FAULTS_DIR,
    GPU_COUNT,
    HOST,
    KEY,
    KNOWN_HOSTS,
    LAB_DIR,
    LANE,
    LOCK_FILE,
    LXCPATH,
    MAIN_CT,
    NARROW_USER,
    NODE,
    NODES,
    NOSUDO_USER,
    PCT_NARROW,
    PORT,
    REBOOT_HANG,
    SSHD_CONFIG,
    STATE_FILE,
    SUDO_USER,
    SUPERVISOR_FILE,
)
from .host import load_json, ref_alive
from .sshd import sshd_restart_request, supervisor_alive
from .trainer import trainer_running, trainer_slot, trainer_status


def status_dict() -> dict:
    state = load_json(STATE_FILE)
    sup = load_json(SUPERVISOR_FILE)
    containers = {vmid: ct_state(vmid) for vmid in CONTAINERS}
    sshd_up = supervisor_alive(sup)
    trainer = state.get("trainer", {})
    rec = trainer.get("pids") or {}
    running = trainer_running(state)

    def ct(ref):
        return ref.get("ct_pid") if ref else None

    def host(ref):
        return ref.get("pid") if ref else None

    fake_cfg = load_json(os.path.join(FAKEGPU_DIR, "config.json"))
    second = second_node_status(state)
    return {
        "up": bool(sshd_up and containers.get(MAIN_CT) == "running"),
        # 2 while the second lab PVE host (`up --nodes 2`) is up; its facts are under node2
        "nodes": 2 if second and second["up"] else 1,
        "node2": second,
        "lab_dir": LAB_DIR,
        # which copy of the lab this is (tests/lab/lanes.py): its port, VMIDs, users, addresses, inventories
        "lane": LANE.facts(),
        "inventory": LANE.inventory("lab"),
        "fleet_inventory": LANE.inventory("lab-fleet"),
        # up/down/trainer hold this flock; a test that must not see CT200's trainer restarted takes it too
        "lock_file": LOCK_FILE,
        "host": HOST,
        "port": PORT,
        "node": NODE,
        "key": KEY,
        "known_hosts": KNOWN_HOSTS,
        # argv prefix for OpenSSH; append USER@HOST and the remote command
        "ssh": ["ssh", "-F", "/dev/null", "-i", KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "UserKnownHostsFile=%s" % KNOWN_HOSTS, "-o", "StrictHostKeyChecking=yes", "-p", str(PORT)],
        "users": {
            "root": {"sudo": None, "note": "key login"},
            SUDO_USER: {"sudo": "NOPASSWD: /usr/sbin/pct", "note": "key login, sudo -n pct only"},
            NOSUDO_USER: {"sudo": None, "note": "key login, no sudo rule (error tests)"},
            NARROW_USER: {"sudo": "NOPASSWD: %s" % PCT_NARROW,
                          "note": "key login, sudo -n of the forced-command wrapper only, for CT%s" % MAIN_CT},
        },
        "pct_narrow": PCT_NARROW,
        "pct": "/usr/sbin/pct",
        "nvidia_smi": "/usr/bin/nvidia-smi",
        "lxcpath": LXCPATH,
        "containers": containers,
        "unprivileged": sorted(vmid for vmid in CONTAINERS if is_unprivileged(vmid)),  # `lab unprivileged on`
        "hostnames": dict(CONTAINERS),
        "sshd": {
            "running": sshd_up,
            "pid": host(sup.get("sshd")),
            "supervisor_pid": host(sup.get("supervisor")),
            "restarts": sup.get("sshd_restarts", 0),  # by `lab sshd-restart`
            "mount_ns": sup.get("mntns"),
            "config": SSHD_CONFIG,
            "log": NODES[1].sshd_log,
        },
        "trainer": trainer_status(trainer, rec, running),
        "decoys": {
            "networkd_dispatcher": "systemd unit networkd-dispatcher.service in CT%s" % MAIN_CT,
            "tmux_sessions": {name: shlex.join(argv) for name, argv in DECOY_SESSIONS.items()},
        },
        "signal_audit": {
            "container_dir": CT_SIGNAL_AUDIT,
            "host_dir": os.path.join(LXCPATH, MAIN_CT, "rootfs", CT_SIGNAL_AUDIT.lstrip("/")),
            "audited": ["fake trainer launcher and workers", "networkd-dispatcher decoy"],
        },
        "faults": {
            "dir": FAULTS_DIR,
            "reboot_hang": REBOOT_HANG,
            "pull_enospc": os.path.join(FAULTS_DIR, "pull-enospc"),
            "pct_before_keep_env": os.path.join(FAULTS_DIR, "pct-before-keep-env"),
            "sshd_restart": sshd_restart_request(NODES[1]),
            "active": sorted(os.listdir(FAULTS_DIR)) if os.path.isdir(FAULTS_DIR) else [],
        },
        "fakegpu": {
            "dir": FAKEGPU_DIR,
            "container_dir": CT_FAKEGPU_DIR,
            "count": fake_cfg.get("count", GPU_COUNT),
            "initialised": bool(fake_cfg),
            "driver_pid": host(sup.get("driver")) if ref_alive(sup.get("driver")) else None,
            "tools": CT_LAB + "/fakegpu",
        },
    }


def second_node_status(state: dict) -> dict | None:
    """The second lab PVE host's facts (the same keys as the top level's), or None when it was never brought up."""
    node = NODES[2]
    if not os.path.isdir(node.base):
        return None
    sup = load_json(node.supervisor_file)
    containers = {vmid: ct_state(vmid) for vmid in node.containers}
    sshd_up = supervisor_alive(sup)
    slot = trainer_slot(state, node.main_ct)
    trainer = slot.get("trainer", {})
    fake_cfg = load_json(os.path.join(node.fakegpu_dir, "config.json"))
    driver = sup.get("driver")
    return {
        "up": bool(sshd_up and containers.get(node.main_ct) == "running"),
        "host": HOST,
        "port": node.port,
        "node": node.name,
        "inventory_host": node.inventory_host,
        "containers": containers,
        "hostnames": dict(node.containers),
        "pve_conf_dir": node.pve_conf_dir,
        "sshd": {
            "running": sshd_up,
            "pid": (sup.get("sshd") or {}).get("pid"),
            "supervisor_pid": (sup.get("supervisor") or {}).get("pid"),
            "restarts": sup.get("sshd_restarts", 0),
            "mount_ns": sup.get("mntns"),
            "config": node.sshd_config,
            "log": node.sshd_log,
        },
        "trainer": trainer_status(trainer, trainer.get("pids") or {}, trainer_running(state, node.main_ct),
                                  node.main_ct),
        "fakegpu": {
            "dir": node.fakegpu_dir,
            "container_dir": CT_FAKEGPU_DIR,
            "count": fake_cfg.get("count", GPU_COUNT),
            "initialised": bool(fake_cfg),
            "driver_pid": driver.get("pid") if ref_alive(driver) else None,
        },
    }
