# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``lab up`` and ``lab down`` (one lane, every lane, one node or two), and ``lab unprivileged``.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys

from .containers import ID_RANGE, ID_SHIFT, ct_state, ensure_container, is_unprivileged, lxc, rootfs_cache, wait_booted
from .facts import (
    ALL_CONTAINERS,
    CACHE_DIR,
    CONTAINERS,
    DEFAULT_BEHAVIOUR,
    FILES_LINK,
    HERE,
    HOME_DIR,
    LAB_DIR,
    LAB_SCRIPT,
    LANE,
    LXCPATH,
    MARKER,
    NODES,
    NS_DIR,
    PCT_NARROW_LIST,
    PVE_CONF_DIR,
    REPO,
    STATE_FILE,
    SUDOERS,
    TRAINER_SESSION,
    LabError,
    LabNode,
    lanes,
    log,
    node_of,
)
from .fakegpu import ensure_fakegpu
from .host import Lock, load_json, mountinfo_under, preflight, run, save_state, umount_under
from .sshd import ensure_ssh_files, ensure_supervisor, ensure_users, ssh_argv, stop_supervisor
from .status import status_dict
from .supervisor import end_mount_ns
from .trainer import ensure_decoys, has_session, new_trainer_session, start_trainer, trainer_intact


def ensure_files_link() -> None:
    """FILES_LINK -> this checkout's tests/lab (replaced atomically when another checkout brings the lab up)."""
    if os.path.islink(FILES_LINK) and os.readlink(FILES_LINK) == HERE:
        return
    tmp = FILES_LINK + ".new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(HERE, tmp)
    os.replace(tmp, FILES_LINK)


def cmd_up(args: argparse.Namespace) -> int:
    preflight()
    if args.lanes is not None:
        return cmd_up_lanes(args)
    with Lock():
        os.makedirs(LAB_DIR, mode=0o755, exist_ok=True)
        os.chmod(LAB_DIR, 0o755)
        if not os.path.exists(MARKER):
            with open(MARKER, "w", encoding="utf-8") as handle:
                handle.write("gpuops lab state; 'tests/lab/lab down' removes this directory\n")
        for path in (LXCPATH, PVE_CONF_DIR, NS_DIR):
            os.makedirs(path, mode=0o755, exist_ok=True)
        ensure_files_link()
        lanes.write_inventories(os.path.join(REPO, "inventories"), LANE)
        state = load_json(STATE_FILE)
        cache = rootfs_cache()
        ensure_fakegpu()
        for vmid, hostname in CONTAINERS.items():
            ensure_container(vmid, hostname, cache)
        ensure_ssh_files()
        ensure_users(state)
        save_state(state)
        sup = ensure_supervisor()
        state["supervisor"] = sup
        save_state(state)
        state["boot"] = ensure_gpu_node(state, NODES[1], args.behaviour)
        save_state(state)
        if lab_nodes(args) >= 2:
            ensure_second_node(state, cache, args.behaviour)
    print(json.dumps(status_dict(), indent=1, sort_keys=True))
    return 0


def lane_command(index: int, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """This program run for lane INDEX (its own process: every fact of a lane is read once, at start)."""
    env = dict(os.environ, **{lanes.LANE_ENV: str(index)})
    for key in ("GPUOPS_LAB_DIR", "GPUOPS_LAB_PORT", "GPUOPS_LAB_PORT2"):  # they would put every lane in one place
        env.pop(key, None)
    return subprocess.run([sys.executable, LAB_SCRIPT, *argv], env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, check=False)


def cmd_up_lanes(args: argparse.Namespace) -> int:
    """`up --lanes N`: lanes 0..N-1 brought up one after the other (the first builds the rootfs cache the others
    copy); prints {"lanes": [each lane's status]}."""
    if not 1 <= args.lanes <= lanes.MAX_LANES:
        raise LabError("--lanes must be 1 to %d, got %d" % (lanes.MAX_LANES, args.lanes))
    out = []
    for index in range(args.lanes):
        argv = ["up"] + (["--behaviour", args.behaviour] if args.behaviour else []) + (
            ["--nodes", str(args.nodes)] if args.nodes else [])
        log("lane %d: up" % index)
        done = lane_command(index, argv, timeout=3600)
        if done.returncode != 0:
            raise LabError("lane %d: 'up' failed (exit %d); its messages are above" % (index, done.returncode))
        out.append(json.loads(done.stdout))
    print(json.dumps({"lanes": out}, indent=1, sort_keys=True))
    return 0


def existing_lanes() -> list[int]:
    """The lanes whose lab directory is there (what `down --all` takes down)."""
    return [index for index in range(lanes.MAX_LANES) if os.path.exists(lanes.lane(index).lab_dir)]


def cmd_down_all(args: argparse.Namespace) -> int:
    rc = 0
    for index in existing_lanes():
        log("lane %d: down" % index)
        if lane_command(index, ["down"], timeout=600).returncode != 0:
            rc = 1
    return rc


def lab_nodes(args: argparse.Namespace) -> int:
    """How many lab PVE hosts `up` brings up: --nodes, else GPUOPS_LAB_NODES, else 1 (the README's lab)."""
    raw = args.nodes if getattr(args, "nodes", None) is not None else os.environ.get("GPUOPS_LAB_NODES", "1")
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count not in (1, 2):
        raise LabError("--nodes/GPUOPS_LAB_NODES must be 1 or 2, got %r" % raw)
    return count


def ensure_gpu_node(state: dict, node: LabNode, behaviour: str | None) -> str:
    """The node's GPU container started through its own PVE host's pct, booted, its trainer and decoys running."""
    vmid = node.main_ct
    # the lab's own sanity check of the PVE host: root over ssh runs pct
    if ct_state(vmid) != "running":
        log("starting CT%s through the lab host %s's pct" % (vmid, node.name))
        run(ssh_argv("root", ["pct", "start", vmid], port=node.port), timeout=90)
    else:  # a backup a test began and never ended (`lab backup begin`): no command would run in it
        run(lxc("lxc-unfreeze", vmid), timeout=60, check=False)
    boot = wait_booted(vmid)
    trainer_ok = trainer_intact(state, vmid) and has_session(vmid, TRAINER_SESSION)
    # The dflash session first: the tmux server keeps the argv of the session that started
    # it, and it should read like the operator's 'tmux new -s dflash', not like a decoy.
    if not has_session(vmid, TRAINER_SESSION):
        new_trainer_session(vmid)
    ensure_decoys(vmid)
    if os.path.exists(os.path.join(HERE, "trainer", "fake_trainer.py")):
        if behaviour or not trainer_ok:
            chosen = behaviour or DEFAULT_BEHAVIOUR  # a restart returns to the baseline
            log("starting the %s trainer in CT%s's tmux session %s" % (chosen, vmid, TRAINER_SESSION))
            start_trainer(state, chosen, vmid=vmid)
            ensure_decoys(vmid)  # leaving the torchrun behaviour restarts the tmux server
    else:
        log("tests/lab/trainer/fake_trainer.py does not exist yet: no trainer started")
    return boot


def ensure_second_node(state: dict, cache: str, behaviour: str | None) -> None:
    """The second PVE host: its sshd (port + 1, own mount namespace, own pct view), CT210, its 8 fake GPUs."""
    node = NODES[2]
    for path in (node.base, node.pve_conf_dir, node.ns_dir):
        os.makedirs(path, mode=0o755, exist_ok=True)
    ensure_fakegpu(node.fakegpu_dir)
    for vmid, hostname in node.containers.items():
        ensure_container(vmid, hostname, cache, node)
    ensure_ssh_files(node)  # known_hosts names every lab host's key
    slot = state.setdefault("node2", {})
    slot["supervisor"] = ensure_supervisor(node)
    save_state(state)
    slot["boot"] = ensure_gpu_node(state, node, behaviour)
    save_state(state)


def cmd_down(args: argparse.Namespace) -> int:
    preflight()
    if args.all:
        return cmd_down_all(args)
    if not os.path.exists(LAB_DIR):
        log("nothing to do: %s does not exist" % LAB_DIR)
        return 0
    if not os.path.exists(MARKER):
        raise LabError("%s has no %s marker: not a lab directory, refusing to remove it" % (
            LAB_DIR, os.path.basename(MARKER)))
    with Lock():
        state = load_json(STATE_FILE)
        for vmid in ALL_CONTAINERS:
            if ct_state(vmid) == "running":
                log("stopping container %s" % vmid)
                run(lxc("lxc-stop", vmid, "--kill"), timeout=60, check=False)
                run(lxc("lxc-wait", vmid, "-s", "STOPPED", "-t", "30"), timeout=40, check=False)
        for node in NODES.values():
            sup = load_json(node.supervisor_file) or (state if node.index == 1 else state.get("node2") or {}).get(
                "supervisor") or {}
            if not sup:
                continue
            log("stopping the lab host %s (sshd supervisor)" % node.name)
            stop_supervisor(sup)
            log("supervisor stopped")
            end_mount_ns(sup.get("mntns"), node.ns_dir)
        left = [vmid for vmid in ALL_CONTAINERS if ct_state(vmid) == "running"]
        if left:
            raise LabError("containers %s still running after lxc-stop --kill" % left)
        for path in (SUDOERS, PCT_NARROW_LIST):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        for user in state.get("users_created", []):
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                continue
            if entry.pw_dir.startswith(HOME_DIR + "/"):
                run(["userdel", "--force", user], timeout=30, check=False)
        umount_under(LAB_DIR)
        if mountinfo_under(LAB_DIR):
            raise LabError("mounts remain under %s: %s" % (LAB_DIR, mountinfo_under(LAB_DIR)))
        shutil.rmtree(LAB_DIR)
    log("down: containers stopped and removed, sshd ended, users and sudo rule removed (cache kept in %s)"
        % CACHE_DIR)
    return 0


def cmd_unprivileged(args: argparse.Namespace) -> int:
    """Make container VMID unprivileged as Proxmox VE makes one (``on``: its ids mapped to host 100000-165535,
    ``unprivileged: 1`` in its config, its own network namespace) or privileged again (``off``, as `up` leaves
    it). A GPU container comes back started, booted, with its trainer and decoys; another keeps its state."""
    preflight()
    vmid = args.ct
    node = node_of(vmid)
    with Lock():
        state = load_json(STATE_FILE)
        was_running = ct_state(vmid) == "running"
        ensure_container(vmid, node.containers[vmid], rootfs_cache(), node, unprivileged=args.action == "on")
        if vmid == node.main_ct:
            boot = ensure_gpu_node(state, node, None)
            (state if node.index == 1 else state.setdefault("node2", {}))["boot"] = boot
            save_state(state)
        elif was_running and ct_state(vmid) != "running":
            run(ssh_argv("root", ["pct", "start", vmid], port=node.port), timeout=90)
            wait_booted(vmid)
    print(json.dumps({"ct": vmid, "unprivileged": is_unprivileged(vmid),
                      "idmap": "0 %d %d" % (ID_SHIFT, ID_RANGE) if is_unprivileged(vmid) else None}, sort_keys=True))
    return 0
