# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab's facts: its lane, places, ports, containers, users and nodes, and what runs in the containers.

Everything here is read once, at import, from the lane (tests/lab/lanes.py) and the environment
(GPUOPS_LAB_DIR, GPUOPS_LAB_PORT...). The process helpers come from the collection's
plugins/module_utils/_proc.py and _wait.py, loaded by path (the lab runs on the system python3).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import socket
import sys
import time

# tests/lab: the lab's files (pct, fakegpu, trainer...) and its entry point, lab.py, which every re-run of the lab
# (a lane's `up`, a host's supervisor) starts
HERE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
REPO = os.path.dirname(os.path.dirname(HERE))
LAB_SCRIPT = os.path.join(HERE, "lab.py")


def _load_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def _load_module_util(name: str):
    return _load_file(os.path.join(REPO, "plugins", "module_utils", name + ".py"), "gpuops_lab_" + name.strip("_"))


_proc = _load_module_util("_proc")
# who listens, read from /proc/net/tcp (a probe connection would reach sshd's log): the tests' own reader
_procfs = _load_file(os.path.join(REPO, "tests", "support", "procfs.py"), "gpuops_lab_procfs")
Deadline = _load_module_util("_wait").Deadline


# Which copy of the lab this is (tests/lab/lanes.py): GPUOPS_LAB_LANE, default 0, the README's lab. Every
# place, port, container, user and address below is the lane's; GPUOPS_LAB_DIR/GPUOPS_LAB_PORT still override.
lanes = _load_file(os.path.join(HERE, "lanes.py"), "gpuops_lab_lanes")
LANE = lanes.current()
# tests/lab/pct's own default: a lab elsewhere hands its place to pct (sshd SetEnv, sudo env_keep)
DEFAULT_LAB_DIR = lanes.BASE_DIR
LAB_DIR = os.path.abspath(os.environ.get("GPUOPS_LAB_DIR") or LANE.lab_dir)
CACHE_DIR = os.path.abspath(os.environ.get("GPUOPS_LAB_CACHE", "/var/cache/gpuops-lab"))
LOCK_FILE = "/run/gpuops-lab-%s.lock" % hashlib.sha256(LAB_DIR.encode()).hexdigest()[:8]
LXCPATH = os.path.join(LAB_DIR, "lxc")
SSH_DIR = os.path.join(LAB_DIR, "ssh")
PVE_CONF_DIR = os.path.join(LAB_DIR, "pve", "lxc")
NS_DIR = os.path.join(LAB_DIR, "ns")
HOME_DIR = os.path.join(LAB_DIR, "home")
FAKEGPU_DIR = os.path.join(LAB_DIR, "fakegpu")
# Fault-injection switches read by tests/lab/pct.py (README "Faults"); a test creates and deletes them.
FAULTS_DIR = os.path.join(LAB_DIR, "faults")
# This checkout's tests/lab, at a fixed path: inventories/lab names its files through it,
# so the inventory works wherever it is read from (an AWX import, an exported copy).
FILES_LINK = os.path.join(LAB_DIR, "files")
REBOOT_HANG = os.path.join(FAULTS_DIR, "reboot-hang")
# `lab sshd-restart`'s request to a lab host's supervisor (README "Faults"): while it is there, the exit of the
# sshd it names is a deliberate restart, not a crash
SSHD_RESTART_MAX_DOWN_S = 120.0
STATE_FILE = os.path.join(LAB_DIR, "state.json")
SUPERVISOR_FILE = os.path.join(LAB_DIR, "supervisor.json")
MARKER = os.path.join(LAB_DIR, ".gpuops-lab")
KEY = os.path.join(SSH_DIR, "id_ed25519")
KNOWN_HOSTS = os.path.join(SSH_DIR, "known_hosts")
SSHD_CONFIG = os.path.join(SSH_DIR, "sshd_config")
SUDOERS = LANE.sudoers

HOST = "127.0.0.1"
PORT = int(os.environ.get("GPUOPS_LAB_PORT") or LANE.port)
NODE = socket.gethostname().split(".")[0]
CONTAINERS = {LANE.main_ct: lanes.HOSTNAMES["main"], LANE.decoy_ct: lanes.HOSTNAMES["decoy"]}
MAIN_CT = LANE.main_ct
DECOY_CT = LANE.decoy_ct
SUDO_USER = LANE.sudo_user
NOSUDO_USER = LANE.nosudo_user
NARROW_USER = LANE.narrow_user
LAB_USERS = (SUDO_USER, NOSUDO_USER, NARROW_USER)
# the forced-command wrapper the README offers instead of a pct sudo rule, and its list of the user's containers.
# Installed into the lab (root's, mode 0755), as a PVE host admin installs it, and the sudo rule names that copy:
# a checkout's own path can be invisible from the PVE host's sessions (a private /tmp) or another checkout's.
PCT_NARROW_SOURCE = os.path.join(REPO, "examples", "pve-host", "pct-narrow")
PCT_NARROW = os.path.join(LAB_DIR, "bin", "pct-narrow")
PCT_NARROW_LIST = os.path.join("/etc/pct-narrow.d", NARROW_USER)


@dataclasses.dataclass(frozen=True)
class LabNode:
    """One PVE host of the lab: its sshd, its pct view (nodes/<name>/lxc), its GPU container and fake GPUs.

    Node 1 is the lab as it always was (the paths above). Node 2 (`lab up --nodes 2`, or
    GPUOPS_LAB_NODES=2) is a second PVE host: another sshd on loopback (port + 1) in its own
    mount namespace, whose /usr/sbin/pct sees only CT210 and whose nvidia-smi shows its own 8
    fake GPUs, bind-mounted into CT210 at the same path as node 1's into CT200.
    """

    index: int
    name: str  # the PVE node name (pct's 'nodes/<node>/lxc/<vmid>.conf')
    inventory_host: str  # its name in inventories/lab and inventories/lab-fleet
    port: int
    containers: dict
    main_ct: str
    base: str  # where its state lives
    pve_conf_dir: str
    fakegpu_dir: str
    ns_dir: str
    supervisor_file: str
    sshd_config: str
    hostkey: str

    @property
    def sshd_log(self) -> str:
        """The host sshd's log (its stderr, -e): how each connection ended."""
        return os.path.join(self.base, "sshd.log")

    @property
    def pct_env(self) -> dict[str, str]:
        """What this host's pct wrapper sets (pct.py drops it before entering a container): node 1, the defaults."""
        if self.index == 1:
            return {}
        return {"GPUOPS_LAB_PVE_CONF_DIR": self.pve_conf_dir, "GPUOPS_LAB_PVE_NODE": self.name}

    @property
    def smi_env(self) -> dict[str, str]:
        """What this host's nvidia-smi wrapper sets: its own fake GPUs (never given to pct: exec keeps the env); none
        where they are the fakegpu library's default state dir (lane 0's first node)."""
        return {} if self.fakegpu_dir == CT_FAKEGPU_DIR else {"FAKEGPU_DIR": self.fakegpu_dir}


NODE2_DIR = os.path.join(LAB_DIR, "node2")
NODES = {
    1: LabNode(1, NODE, "lab-pve", PORT, dict(CONTAINERS), MAIN_CT, LAB_DIR, PVE_CONF_DIR, FAKEGPU_DIR, NS_DIR,
               SUPERVISOR_FILE, SSHD_CONFIG, os.path.join(SSH_DIR, "ssh_host_ed25519_key")),
    2: LabNode(2, NODE + "-2", "lab-pve2", int(os.environ.get("GPUOPS_LAB_PORT2", str(PORT + 1))),
               {LANE.node2_ct: lanes.HOSTNAMES["node2"]}, LANE.node2_ct, NODE2_DIR, os.path.join(NODE2_DIR, "pve", "lxc"), os.path.join(NODE2_DIR, "fakegpu"),
               os.path.join(NODE2_DIR, "ns"), os.path.join(NODE2_DIR, "supervisor.json"),
               os.path.join(NODE2_DIR, "sshd_config"), os.path.join(SSH_DIR, "ssh_host_ed25519_key-node2")),
}
ALL_CONTAINERS = {vmid: host for node in NODES.values() for vmid, host in node.containers.items()}
GPU_CTS = tuple(node.main_ct for node in NODES.values())


def node_of(vmid: str) -> LabNode:
    return next(node for node in NODES.values() if vmid in node.containers)


SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = os.environ.get("GPUOPS_LAB_MIRROR", "http://deb.debian.org/debian")
# What CT200 needs: systemd as init, python3 (+venv for the SGLang role), tmux
# for the dflash session, procps/psmisc (ps, watch, fuser), an editor for the decoy.
PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "tmux", "procps",
    "psmisc", "vim-tiny", "ca-certificates",
)

# In the containers (the fakegpu library's default state dir, so no env is needed there).
CT_FAKEGPU_DIR = "/var/lib/gpuops-lab/fakegpu"
CT_LAB = "/opt/lab"
GPU_COUNT = 8
TRAINER_SESSION = "dflash"
TRAINER_SCRIPT = CT_LAB + "/trainer/fake_trainer.py"
TRAINER_CKPT = "/root/dflash/checkpoints"
TRAINER_NPROC = 8
# The training set both trainers are started on (`--data`); the way back points that argument at the merged set.
TRAINER_DATA = "/root/dflash/data/train-v1.jsonl"
# The signal audit (tests/lab/trainer/signal_audit.py): the fake trainer and the networkd-dispatcher decoy
# record every signal they receive there, one file per process (the decoy's unit sets the same directory).
CT_SIGNAL_AUDIT = "/var/log/gpuops-lab/signals"
BEHAVIOURS = ("graceful", "slow_checkpoint", "stubborn", "orphans", "respawn", "torchrun")
NO_TRAINER = "none"  # `lab trainer none`: the trainer stopped, nothing started
DEFAULT_BEHAVIOUR = "graceful"
STEP_RE = re.compile(r"^step \d+ \|", re.M)
# The `torchrun` behaviour: not the fake trainer but a real DDP job (tests/lab/torchrun_job/train.py:
# gloo on CPU, DataLoader workers, atomic torch.save checkpoints), launched the incident's way with the
# command on `tmux new-session`, so the tmux server keeps torchrun's command line. PyTorch comes from a
# venv made with CT200's own python3, built on first use and cached under CACHE_DIR (never by `up`).
TORCHRUN = "torchrun"
TORCH_VERSION = os.environ.get("GPUOPS_TORCH_VERSION", "2.13.0")
CT_TORCH_VENV = "/opt/torch-venv-%s" % TORCH_VERSION
CT_TORCH_WHEELS = "/opt/torch-wheels-%s" % TORCH_VERSION
TORCHRUN_SCRIPT = CT_LAB + "/torchrun_job/train.py"
TORCHRUN_CKPT = "/root/dflash/torchrun-checkpoints"
TORCHRUN_NPROC = 2  # ranks (each with 2 DataLoader workers); this lab runs on a couple of CPU cores
TORCHRUN_STEP_RE = re.compile(r"^step \d+ loss ", re.M)
DECOY_SESSIONS = {
    "edit": ["vi", TRAINER_SCRIPT],
    "monitor": ["watch", "-n", "5", "nvidia-smi"],
}
CT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/bash",
    "TERM": "xterm-256color",
    "LANG": "C.UTF-8",
}

PR_SET_CHILD_SUBREAPER = 36


class LabError(Exception):
    """A lab step failed; the message says which and what to do."""


_T0 = time.monotonic()


def log(msg: str) -> None:
    sys.stderr.write("lab [%5.1fs]: %s\n" % (time.monotonic() - _T0, msg))
    sys.stderr.flush()
