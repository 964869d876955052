# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The ``lab`` command line: its subcommands and what each runs.
"""

from __future__ import annotations

import argparse
import json
import os

from .containers import ct_state, sync_lab_files, wait_booted
from .facts import BEHAVIOURS, DECOY_CT, GPU_CTS, LANE, LXCPATH, MAIN_CT, NO_TRAINER, NODES, STATE_FILE, LabError, log
from .host import Lock, load_json, preflight, save_state
from .lifecycle import cmd_down, cmd_unprivileged, cmd_up
from .pve import cmd_backup, cmd_ha
from .sshd import sshd_restart
from .status import status_dict
from .supervisor import supervise
from .torch_venv import torch_venv_cache
from .trainer import ensure_decoys, start_trainer, stop_trainer


def cmd_status(args: argparse.Namespace) -> int:
    print(json.dumps(status_dict(), indent=1, sort_keys=True))
    return 0


def cmd_trainer(args: argparse.Namespace) -> int:
    preflight()
    vmid = args.ct
    with Lock():
        if ct_state(vmid) != "running":
            raise LabError("CT%s is not running: run 'tests/lab/lab up%s' first" % (
                vmid, "" if vmid == MAIN_CT else " --nodes 2"))
        state = load_json(STATE_FILE)
        wait_booted(vmid)  # e.g. right after a test's 'pct reboot 200'
        if args.behaviour == NO_TRAINER:
            # the GPUs free for the data half alone, which refuses to serve beside a job that holds them
            stop_trainer(state, vmid)
            save_state(state)
        else:
            sync_lab_files(os.path.join(LXCPATH, vmid, "rootfs"))
            start_trainer(state, args.behaviour, vmid=vmid, ckpt_every=args.ckpt_every)
        ensure_decoys(vmid)  # a container restart takes the decoy tmux sessions with it
    status = status_dict()
    print(json.dumps(status["trainer"] if vmid == MAIN_CT else status["node2"]["trainer"], indent=1, sort_keys=True))
    return 0


def cmd_sshd_restart(args: argparse.Namespace) -> int:
    preflight()
    # no lab Lock: a test holding it (so that no `up` or `trainer` changes CT200 meanwhile) injects this fault
    print(json.dumps(sshd_restart(NODES[args.node], args.down_for), indent=1, sort_keys=True))
    return 0


def cmd_torch_venv(args: argparse.Namespace) -> int:
    preflight()
    print(torch_venv_cache())
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="lab", description="The local CT200 lab (run as root).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build/start everything (idempotent); prints the status JSON")
    p_up.add_argument("--behaviour", choices=BEHAVIOURS, help="(re)start the trainer(s) with this behaviour")
    p_up.add_argument("--nodes", type=int, choices=(1, 2), default=None,
                      help="2: also the second PVE host (port + 1) with CT210 and its own 8 fake GPUs "
                           "(default $GPUOPS_LAB_NODES or 1; a one-node up leaves a second node as it is)")
    p_up.add_argument("--lanes", type=int, default=None, metavar="N",
                      help="bring up lanes 0..N-1, N independent copies of the lab (tests/lab/lanes.py; "
                           "$GPUOPS_LAB_LANE picks the lane of every other command)")
    p_down = sub.add_parser("down", help="end everything the lab started and remove its state (keeps the rootfs "
                            "cache)")
    p_down.add_argument("--all", action="store_true", help="every lane whose lab directory exists")
    sub.add_parser("status", help="print the lab's facts as JSON")
    p_tr = sub.add_parser("trainer", help="(re)start the dflash trainer with BEHAVIOUR and wait for step lines")
    p_tr.add_argument("behaviour", choices=BEHAVIOURS + (NO_TRAINER,))
    p_tr.add_argument("--ckpt-every", type=int, default=0, metavar="N",
                      help="the trainer also saves a checkpoint every N steps (the way back resumes from one)")
    p_tr.add_argument("--ct", choices=GPU_CTS, default=MAIN_CT,
                      help="the GPU container (%s: the second node's)" % LANE.node2_ct)
    p_bk = sub.add_parser("backup", help="begin or end a backup of a container as vzdump does it: lock: backup, "
                          "and in suspend mode the container frozen until the end")
    p_bk.add_argument("action", choices=("begin", "end"))
    p_bk.add_argument("--mode", choices=("suspend", "snapshot"), default="suspend",
                      help="suspend (default): also freeze the container; snapshot: the lock only")
    p_bk.add_argument("--ct", choices=[MAIN_CT, DECOY_CT, LANE.node2_ct], default=MAIN_CT)
    p_ha = sub.add_parser("ha", help="make a container HA-managed (pct start/stop/shutdown then only queue a "
                          "request, acted on a moment later) or not")
    p_ha.add_argument("action", choices=("on", "off"))
    p_ha.add_argument("--error", action="store_true", help="a resource in the error state: never acted on")
    p_ha.add_argument("--ct", choices=[MAIN_CT, DECOY_CT, LANE.node2_ct], default=MAIN_CT)
    p_un = sub.add_parser("unprivileged", help="make a container unprivileged as Proxmox VE makes one (ids mapped "
                          "to host 100000-165535, its own network namespace) or privileged again, as up leaves it")
    p_un.add_argument("action", choices=("on", "off"))
    p_un.add_argument("--ct", choices=[MAIN_CT, DECOY_CT, LANE.node2_ct], default=MAIN_CT)
    sub.add_parser("torch-venv", help="build the containers' cached torch venv (else built on first 'trainer torchrun')")
    p_rs = sub.add_parser("sshd-restart", help="restart the lab PVE host's sshd as `systemctl restart ssh` does "
                          "(the listener replaced, established sessions kept); prints what happened as JSON")
    p_rs.add_argument("--down-for", type=float, default=0.0, metavar="S",
                      help="keep the host without a listener for S seconds before the new sshd starts (default 0)")
    p_rs.add_argument("--node", type=int, choices=sorted(NODES), default=1, help="the lab host (2: port + 1)")
    p_sup = sub.add_parser("_supervise", help=argparse.SUPPRESS)
    p_sup.add_argument("--node", type=int, choices=sorted(NODES), default=1)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "_supervise":
            return supervise(NODES[args.node])
        return {"up": cmd_up, "down": cmd_down, "status": cmd_status, "trainer": cmd_trainer,
                "torch-venv": cmd_torch_venv, "sshd-restart": cmd_sshd_restart, "backup": cmd_backup,
                "ha": cmd_ha, "unprivileged": cmd_unprivileged}[args.cmd](args)
    except LabError as exc:
        log("error: %s" % exc)
        return 1
