# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The local CT200 lab: ``lab up | down | status | trainer BEHAVIOUR`` (run as root).

Real parts: LXC containers 200 (ct200) and 201 (ct201) with systemd as init in
a private lxcpath, a real sshd on 127.0.0.1:2222 playing the Proxmox VE host
(its own mount namespace, where tests/lab/pct sits at /usr/sbin/pct and the
fake nvidia-smi at /usr/bin/nvidia-smi), tmux session ``dflash`` in CT200
running the fake trainer, decoy processes. Faked: only the GPUs.

``up`` is idempotent and fast when the lab is there; ``down`` ends only what
the lab started (recorded PIDs checked against their start times, its own
container names under its own lxcpath, its supervisor's mount namespace) and
keeps the rootfs cache. See tests/lab/README.md.

Standard library only; the process helpers come from the collection's
plugins/module_utils/_proc.py and _wait.py.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


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

# ---------------------------------------------------------------- the lab's facts

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


def run(cmd: list[str], timeout: float = 60, check: bool = True, input: bytes | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=timeout, input=input, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise LabError("timed out after %ss: %s" % (timeout, shlex.join(cmd))) from None
    except FileNotFoundError:
        raise LabError("command not found: %s (run scripts/setup)" % cmd[0]) from None
    if check and res.returncode != 0:
        raise LabError("failed (rc %d): %s\n%s%s" % (
            res.returncode, shlex.join(cmd), res.stdout.decode(errors="replace")[-2000:],
            res.stderr.decode(errors="replace")[-2000:]))
    return res


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_if_changed(path: str, text: str, mode: int = 0o644) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text and (os.stat(path).st_mode & 0o7777) == mode:
                return False
    except OSError:
        pass
    atomic_write(path, text, mode)
    return True


def load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def save_state(state: dict) -> None:
    atomic_write(STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------- processes

def proc_ref(pid: int) -> dict | None:
    start = _proc.read_starttime(pid)
    return None if start is None else {"pid": pid, "starttime": start}


def ref_alive(ref: dict | None) -> bool:
    """The recorded process still runs (same PID *and* start time; a zombie is gone)."""
    if not ref:
        return False
    info = _proc.read_process(int(ref["pid"]))
    return info is not None and info.starttime == ref["starttime"] and info.state not in ("Z", "X")


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for info in _proc.iter_processes():
        kids.setdefault(info.ppid, []).append(info.pid)
    return kids


def descendants(pid: int, kids: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        cur = todo.pop()
        out.append(cur)
        todo.extend(kids.get(cur, []))
    return out


def kill_refs(refs: list[dict], timeout: float = 15.0, with_descendants: bool = True) -> list[int]:
    """SIGKILL the recorded processes that are still the same processes, and their trees.

    Descendants are found again on every pass (a respawning launcher can
    fork while we work). Returns what is left alive at the deadline.
    """
    deadline = Deadline(timeout)
    targets = [r for r in refs if ref_alive(r)]
    while True:
        pids = {int(r["pid"]) for r in targets if ref_alive(r)}
        if with_descendants and pids:
            kids = children_map()
            for pid in list(pids):
                pids.update(descendants(pid, kids))
        alive = []
        for pid in pids:
            info = _proc.read_process(pid)
            if info is None or info.state in ("Z", "X"):
                continue
            alive.append(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not alive or deadline.expired():
            return alive
        time.sleep(0.05)


def reap_children_nohang() -> None:
    while True:
        try:
            pid = os.waitpid(-1, os.WNOHANG)[0]
        except ChildProcessError:
            return
        if pid == 0:
            return


def mountinfo_under(path: str) -> list[str]:
    """Mount points at or below path in this mount namespace, deepest first."""
    path = path.rstrip("/")
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt == path or mnt.startswith(path + "/"):
                out.append(mnt)
    return sorted(out, key=len, reverse=True)


def umount_under(path: str) -> None:
    for mnt in mountinfo_under(path):
        run(["umount", "-l", mnt], timeout=30, check=False)


# ---------------------------------------------------------------- lock

class Lock:
    """One lab operation at a time (up/down/trainer); status never waits for it."""

    def __init__(self, timeout: float = 1800) -> None:
        self.timeout = timeout
        self.fd = -1

    def __enter__(self) -> Lock:
        self.fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = Deadline(self.timeout)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if deadline.expired():
                raise LabError("another lab operation holds %s for more than %ss" % (LOCK_FILE, self.timeout))
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


# ---------------------------------------------------------------- preflight

NEEDED = {
    "debootstrap": "debootstrap", "lxc-start": "lxc", "lxc-attach": "lxc", "lxc-info": "lxc",
    "lxc-stop": "lxc", "lxc-wait": "lxc", "unshare": "util-linux", "mount": "mount",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "sudo": "sudo", "visudo": "sudo",
    "useradd": "passwd", "userdel": "passwd", "usermod": "passwd", "cp": "coreutils",
}


def preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (LXC, sshd, users): run it as root")
    missing = sorted({pkg for tool, pkg in NEEDED.items() if shutil.which(tool) is None})
    if not os.path.exists("/usr/sbin/sshd"):
        missing.append("openssh-server")
    if missing:
        raise LabError("missing packages %s: run scripts/setup" % ", ".join(missing))
    if LAB_DIR in ("/", "") or not os.path.basename(LAB_DIR).startswith("gpuops-lab"):
        raise LabError("GPUOPS_LAB_DIR=%s: its last component must start with 'gpuops-lab'" % LAB_DIR)


# ---------------------------------------------------------------- rootfs cache

def cache_key() -> str:
    spec = {"suite": SUITE, "variant": VARIANT, "mirror": MIRROR, "packages": sorted(PACKAGES), "v": 1}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_cache() -> str:
    """The pristine debootstrap tree for this package list, built once (never booted)."""
    path = os.path.join(CACHE_DIR, "rootfs-%s-%s" % (SUITE, cache_key()))
    if os.path.exists(os.path.join(path, ".gpuops-lab-complete")):
        return path
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp = path + ".partial"
    if os.path.exists(tmp):
        umount_under(tmp)
        shutil.rmtree(tmp)
    log("building the rootfs cache with debootstrap (about a minute): %s" % path)
    try:
        run(["debootstrap", "--variant=" + VARIANT, "--include=" + ",".join(PACKAGES), SUITE, tmp, MIRROR],
            timeout=1500)
    except LabError:
        umount_under(tmp)
        raise
    umount_under(tmp)
    with open(os.path.join(tmp, ".gpuops-lab-complete"), "w", encoding="utf-8") as handle:
        json.dump({"suite": SUITE, "variant": VARIANT, "mirror": MIRROR, "packages": sorted(PACKAGES)}, handle)
    os.rename(tmp, path)
    return path


# ---------------------------------------------------------------- containers

def lxc(tool: str, vmid: str, *args: str) -> list[str]:
    return [tool, "-P", LXCPATH, "-n", vmid, *args]


def ct_state(vmid: str) -> str:
    if not os.path.isfile(os.path.join(LXCPATH, vmid, "config")):
        return "absent"
    res = run(lxc("lxc-info", vmid, "-s", "-H"), timeout=20, check=False)
    state = res.stdout.decode().strip().lower()
    return state if state in ("running", "stopped") else (state or "unknown")


def ct_init_pid(vmid: str) -> int | None:
    res = run(lxc("lxc-info", vmid, "-p", "-H"), timeout=20, check=False)
    try:
        return int(res.stdout.decode().strip())
    except ValueError:
        return None


def ct_exec(vmid: str, argv: list[str], timeout: float = 60, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = lxc("lxc-attach", vmid, "--clear-env")
    for key, value in dict(CT_ENV, **(env or {})).items():
        cmd += ["--set-var", "%s=%s" % (key, value)]
    return run(cmd + ["--", *argv], timeout=timeout, check=check)


def lxc_config(vmid: str, hostname: str, fakegpu_dir: str = FAKEGPU_DIR, unprivileged: bool = False) -> str:
    cdir = os.path.join(LXCPATH, vmid)
    lines = [
        "# gpuops lab container %s, written by tests/lab/lab (rewritten on every up)" % vmid,
        "lxc.uts.name = %s" % hostname,
        "lxc.rootfs.path = dir:%s" % os.path.join(cdir, "rootfs"),
        # share the host's network: loopback to the lab's services, pip/apt inside. An unprivileged container
        # gets a network namespace of its own with only its loopback: the kernel lets a user namespace mount
        # sysfs (which systemd needs) only in a network namespace it owns.
        "lxc.net.0.type = %s" % ("empty" if unprivileged else "none"),
        "lxc.apparmor.profile = unconfined",
        "lxc.include = /usr/share/lxc/config/common.conf",
    ]
    if unprivileged:  # as pve-container's LXC.pm update_lxc_config writes an unprivileged CT's config
        lines += ["lxc.include = /usr/share/lxc/config/userns.conf",
                  "lxc.idmap = u 0 %d %d" % (ID_SHIFT, ID_RANGE), "lxc.idmap = g 0 %d %d" % (ID_SHIFT, ID_RANGE)]
    lines += [
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        # Proxmox VE's cgroup layout (pve-container LXC.pm update_lxc_config): the container in lxc/VMID, its
        # processes in the inner cgroup lxc/VMID/ns, the monitor in lxc.monitor/VMID; what the collection reads
        # to see a frozen container
        "lxc.cgroup.dir.monitor = lxc.monitor/%s" % vmid,
        "lxc.cgroup.dir.container = lxc/%s" % vmid,
        "lxc.cgroup.dir.container.inner = ns",
        "lxc.init.cmd = /lib/systemd/systemd",
        "lxc.log.file = %s" % os.path.join(cdir, "lxc.log"),
        "lxc.log.level = WARN",
        "lxc.mount.entry = %s %s none bind,create=dir 0 0" % (fakegpu_dir, CT_FAKEGPU_DIR.lstrip("/")),
    ]
    for name in ["nvidia%d" % i for i in range(GPU_COUNT)] + ["nvidiactl"]:
        lines.append("lxc.mount.entry = %s dev/%s none bind,create=file 0 0" % (
            os.path.join(fakegpu_dir, "dev", name), name))
    return "\n".join(lines) + "\n"


def pve_config(vmid: str, hostname: str, unprivileged: bool = False) -> str:
    """What /etc/pve/nodes/<node>/lxc/<vmid>.conf of a GPU node looks like (read by tests/lab/pct)."""
    big = vmid in GPU_CTS
    lines = [
        "arch: amd64",
        "cores: %d" % (32 if big else 4),
        "features: nesting=1",
        "hostname: %s" % hostname,
        "memory: %d" % (262144 if big else 8192),
        "net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:00:%02X:%02X,ip=dhcp,type=veth" % (
            int(vmid) // 256, int(vmid) % 256),
        "onboot: 1",
        "ostype: debian",
        "rootfs: local-lvm:vm-%s-disk-0,size=%s" % (vmid, "500G" if big else "32G"),
        "swap: 0",
    ]
    if unprivileged:
        lines.append("unprivileged: 1")
    if big:
        lines.append("lxc.cgroup2.devices.allow: c 195:* rwm")
        lines.append("lxc.cgroup2.devices.allow: c 508:* rwm")
        for name in ["nvidia%d" % i for i in range(GPU_COUNT)] + ["nvidiactl", "nvidia-uvm"]:
            lines.append("lxc.mount.entry: /dev/%s dev/%s none bind,optional,create=file" % (name, name))
    return "\n".join(lines) + "\n"


def customize_rootfs(rootfs: str, hostname: str) -> None:
    """Per-container files; idempotent, safe while the container runs."""
    write_if_changed(os.path.join(rootfs, "etc/hostname"), hostname + "\n")
    write_if_changed(os.path.join(rootfs, "etc/hosts"),
                     "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" % hostname)
    mid = os.path.join(rootfs, "etc/machine-id")
    try:
        with open(mid, encoding="ascii") as handle:
            has_id = len(handle.read().strip()) == 32
    except OSError:
        has_id = False
    if not has_id:
        atomic_write(mid, uuid.uuid4().hex + "\n", 0o444)
    # the networkd-dispatcher decoy, as a real systemd service
    decoys = os.path.join(HERE, "decoys")
    with open(os.path.join(decoys, "networkd-dispatcher.py"), encoding="utf-8") as handle:
        # the shebang makes ps show '/usr/bin/python3 /usr/bin/networkd-dispatcher ...', as on Debian
        write_if_changed(os.path.join(rootfs, "usr/bin/networkd-dispatcher"),
                         "#!/usr/bin/python3\n" + handle.read(), 0o755)
    unit = os.path.join(rootfs, "etc/systemd/system/networkd-dispatcher.service")
    shutil.copyfile(os.path.join(decoys, "networkd-dispatcher.service"), unit)
    write_if_changed(os.path.join(rootfs, "etc/default/networkd-dispatcher"),
                     'networkd_dispatcher_args="--run-startup-triggers"\n')
    wants = os.path.join(rootfs, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    link = os.path.join(wants, "networkd-dispatcher.service")
    if not os.path.islink(link):
        os.symlink("/etc/systemd/system/networkd-dispatcher.service", link)
    # the fake driver's tools where the real ones live
    smi = os.path.join(rootfs, "usr/bin/nvidia-smi")
    if not os.path.islink(smi):
        if os.path.exists(smi):
            os.unlink(smi)
        os.symlink(CT_LAB + "/fakegpu/nvidia-smi", smi)
    os.makedirs(os.path.join(rootfs, CT_FAKEGPU_DIR.lstrip("/")), exist_ok=True)
    os.makedirs(os.path.join(rootfs, TRAINER_CKPT.lstrip("/")), exist_ok=True)
    sync_lab_files(rootfs)


def _tree_files(top: str) -> dict[str, str]:
    """Relative path -> absolute path of the regular files to copy (no caches, no tests)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "tests")]
        for name in filenames:
            if name.endswith(".pyc") or name.startswith("test_"):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                out[os.path.relpath(path, top)] = path
    return out


def sync_lab_files(rootfs: str) -> None:
    """Mirror tests/lab/trainer, tests/lab/fakegpu and tests/lab/torchrun_job into /opt/lab/ in the container.

    File by file with an atomic rename, and only what changed: tools in the
    container (nvidia-smi every few seconds) never see a missing file.
    """
    for name in ("trainer", "fakegpu", "torchrun_job"):
        src_top = os.path.join(HERE, name)
        if not os.path.isdir(src_top):
            continue
        dest_top = os.path.join(rootfs, CT_LAB.lstrip("/"), name)
        want = _tree_files(src_top)
        for rel, src in want.items():
            dest = os.path.join(dest_top, rel)
            with open(src, "rb") as handle:
                data = handle.read()
            mode = os.stat(src).st_mode & 0o777
            try:
                with open(dest, "rb") as handle:
                    if handle.read() == data and (os.stat(dest).st_mode & 0o777) == mode:
                        continue
            except OSError:
                pass
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = "%s.lab-%d" % (dest, os.getpid())
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        if os.path.isdir(dest_top):
            for rel in set(_tree_files(dest_top)) - set(want):
                os.unlink(os.path.join(dest_top, rel))


def ensure_container(vmid: str, hostname: str, cache: str, node: LabNode = NODES[1], unprivileged: bool = False) -> None:
    """Container VMID created from CACHE if it is not, privileged (as `up` leaves every container) or
    UNPRIVILEGED, its files and configs as the lab writes them."""
    cdir = os.path.join(LXCPATH, vmid)
    rootfs = os.path.join(cdir, "rootfs")
    done = os.path.join(cdir, ".created")
    if not os.path.exists(done):
        if os.path.exists(cdir):
            if ct_state(vmid) == "running":
                raise LabError("container %s is half-created but running; run 'lab down' first" % vmid)
            umount_under(cdir)
            shutil.rmtree(cdir)
        os.makedirs(cdir, mode=0o755)
        log("creating container %s (%s) from %s" % (vmid, hostname, os.path.basename(cache)))
        run(["cp", "-a", "--reflink=auto", cache, rootfs], timeout=600)
        os.unlink(os.path.join(rootfs, ".gpuops-lab-complete"))
        customize_rootfs(rootfs, hostname)
        with open(done, "w", encoding="utf-8") as handle:
            handle.write(os.path.basename(cache) + "\n")
    else:
        customize_rootfs(rootfs, hostname)
    convert_container(vmid, unprivileged)
    match_ids(vmid)  # what customize_rootfs wrote, as the container's root
    write_if_changed(os.path.join(cdir, "config"), lxc_config(vmid, hostname, node.fakegpu_dir, unprivileged))
    if ct_state(vmid) == "stopped":
        clear_stale_cgroups(vmid)
    os.makedirs(node.pve_conf_dir, mode=0o755, exist_ok=True)
    write_if_changed(os.path.join(node.pve_conf_dir, "%s.conf" % vmid), pve_config(vmid, hostname, unprivileged))


# ---------------------------------------------------------------- unprivileged containers
# An unprivileged CT as Proxmox VE makes one: its root is host uid/gid 100000, its ids 0-65535 mapped to
# 100000-165535 (pve-container LXC.pm's default lxc.idmap), its rootfs owned accordingly. `lab unprivileged on`
# turns a lab container into one (the rootfs shifted in place, the mark file records it); `off` and `up` turn
# it back. Shifting only ids in the range that is not yet shifted makes it idempotent: files the lab writes
# from the host later (lab files, checkpoints dirs) are shifted by calling it again.
ID_SHIFT = 100000
ID_RANGE = 65536
UNPRIVILEGED_MARK = ".unprivileged"


def is_unprivileged(vmid: str) -> bool:
    return os.path.exists(os.path.join(LXCPATH, vmid, UNPRIVILEGED_MARK))


def shift_ids(root: str, delta: int) -> int:
    """Every file under ROOT owned in the unshifted range moved by DELTA (+ID_SHIFT into the container's
    user namespace, -ID_SHIFT back); how many changed. Set-id bits, which chown clears, are put back."""
    low = 0 if delta > 0 else ID_SHIFT
    changed = 0

    def moved(value: int) -> int:
        return value + delta if low <= value < low + ID_RANGE else value

    for top, dirs, files in os.walk(root):
        for path in [top] + [os.path.join(top, name) for name in dirs + files]:
            st = os.lstat(path)
            uid, gid = moved(st.st_uid), moved(st.st_gid)
            if (uid, gid) == (st.st_uid, st.st_gid):
                continue
            os.lchown(path, uid, gid)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))
            changed += 1
    return changed


def match_ids(vmid: str) -> None:
    """An unprivileged container's files the lab wrote from the host, owned by the container's ids."""
    if is_unprivileged(vmid):
        shift_ids(os.path.join(LXCPATH, vmid, "rootfs"), ID_SHIFT)


def convert_container(vmid: str, unprivileged: bool) -> None:
    """Container VMID made UNPRIVILEGED or not: stopped (the lab's own lxc-stop, not pct: no lock or HA applies)
    and its rootfs shifted. The mark exists from before the shift in until after the shift back, so an
    interrupted conversion either way is finished by the next `up` (which converts back) or `on`."""
    if is_unprivileged(vmid) == unprivileged:
        return
    if ct_state(vmid) == "running":
        run(lxc("lxc-stop", vmid, "--timeout", "30"), timeout=90)
    mark = os.path.join(LXCPATH, vmid, UNPRIVILEGED_MARK)
    rootfs = os.path.join(LXCPATH, vmid, "rootfs")
    if unprivileged:
        # the torch venv is hard links into the cache (ct_torch_venv): dropped, copied again when a test needs it
        shutil.rmtree(os.path.join(rootfs, CT_TORCH_VENV.lstrip("/")), ignore_errors=True)
        with open(mark, "w", encoding="ascii") as handle:
            handle.write("u 0 %d %d\n" % (ID_SHIFT, ID_RANGE))
        shift_ids(rootfs, ID_SHIFT)
    else:
        shift_ids(rootfs, -ID_SHIFT)
        os.unlink(mark)
    log("CT%s is now %sprivileged" % (vmid, "un" if unprivileged else ""))


def clear_stale_cgroups(vmid: str, root: str = "/sys/fs/cgroup") -> None:
    """Remove the empty cgroups a stopped CT left behind, so that its next start can create them.

    The PVE layout names the cgroups without LXC's '-N' fallback (lxc.cgroup.dir.*), so a CT
    whose monitor was killed (a machine's processes killed between two CI runs) leaves
    lxc/VMID and lxc.monitor/VMID behind, and lxc-start fails with "Failed to create monitor
    cgroup". Only empty directories go: a cgroup that still holds a process is left, and named.
    """
    held = []
    for controller in sorted(os.listdir(root)):
        for rel in ("lxc.monitor/%s" % vmid, "lxc/%s" % vmid):
            top = os.path.join(root, controller, rel)
            if not os.path.isdir(top):
                continue
            for path, _dirs, _files in os.walk(top, topdown=False):  # children before their parent
                try:
                    os.rmdir(path)
                except OSError:
                    held.append(path)
    if held:
        log("CT%s is stopped but %d of its cgroups still hold processes, e.g. %s" % (vmid, len(held), held[0]))


def wait_booted(vmid: str, timeout: float = 120) -> str:
    deadline = Deadline(timeout)
    last = ""
    while not deadline.expired():
        res = ct_exec(vmid, ["systemctl", "is-system-running"], timeout=20, check=False)
        last = (res.stdout.decode().strip() or res.stderr.decode().strip())
        if last in ("running", "degraded"):
            return last
        time.sleep(0.3)
    raise LabError("container %s did not finish booting within %ss (systemctl is-system-running: %s)" % (
        vmid, timeout, last))


# ---------------------------------------------------------------- the PVE host (sshd)

def ensure_ssh_files(node: LabNode = NODES[1]) -> None:
    os.makedirs(SSH_DIR, mode=0o755, exist_ok=True)
    os.chmod(SSH_DIR, 0o755)
    hostkey = node.hostkey
    if not os.path.exists(hostkey):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuops-lab-host", "-f", hostkey])
    if not os.path.exists(KEY):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuops-lab-client", "-f", KEY])
    with open(KEY + ".pub", encoding="ascii") as handle:
        client_pub = handle.read().strip()
    write_if_changed(os.path.join(SSH_DIR, "authorized_keys"), client_pub + "\n")
    # every lab host whose key exists: a one-node 'up' keeps a second host reachable
    known = []
    for each in NODES.values():
        if os.path.exists(each.hostkey + ".pub"):
            with open(each.hostkey + ".pub", encoding="ascii") as handle:
                host_pub = " ".join(handle.read().split()[:2])
            known += ["[%s]:%d %s\n" % (name, each.port, host_pub) for name in (HOST, "localhost")]
    write_if_changed(KNOWN_HOSTS, "".join(known))
    config = "\n".join([
        "# gpuops lab: the fake Proxmox VE host %s (written by tests/lab/lab)" % node.name,
        "Port %d" % node.port,
        "ListenAddress %s" % HOST,
        "HostKey %s" % hostkey,
        "PidFile %s" % os.path.join(SSH_DIR, "sshd.pid" if node.index == 1 else "sshd-node%d.pid" % node.index),
        "AuthorizedKeysFile %s" % os.path.join(SSH_DIR, "authorized_keys"),
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "AllowUsers root %s" % " ".join(LAB_USERS),
        "StrictModes yes",
        "X11Forwarding no",
        "PrintMotd no",
        "UseDNS no",
        "MaxStartups 64:30:256",
        "MaxSessions 64",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp internal-sftp",
    ])
    # SHLVL=1: Debian's bash sources ~/.bashrc for a command sshd runs when SHLVL < 2, and this machine's
    # root may have an interactive one (a build machine's pyenv init costs 0.33 s per command, most of a
    # pct_ssh exec). A PVE host's root has Debian's plain .bashrc; the lab's host should not pay for ours.
    setenv = ["SHLVL=1"]
    if LAB_DIR != DEFAULT_LAB_DIR:
        setenv.append("GPUOPS_LAB_DIR=%s" % LAB_DIR)  # tests/lab/pct finds a non-default lab dir
    config += "\nSetEnv %s\n" % " ".join(setenv)  # sshd takes the first SetEnv line only: one line
    write_if_changed(node.sshd_config, config)
    # sshd's privilege separation dir: Debian's init creates it at boot, a fresh
    # machine without a booted sshd has none, and `sshd -t` already needs it.
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    run(["/usr/sbin/sshd", "-t", "-f", node.sshd_config])


def ensure_users(state: dict) -> None:
    created = state.setdefault("users_created", [])
    for user in LAB_USERS:
        home = os.path.join(HOME_DIR, user)
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            entry = None
        if entry is None:
            os.makedirs(HOME_DIR, mode=0o755, exist_ok=True)
            run(["useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash", "--user-group",
                 "--comment", "gpuops lab", user])
            created.append(user)
            save_state(state)
        elif user not in created and entry.pw_dir != home:
            raise LabError("user %s exists and was not created by the lab (home %s); remove it or pick "
                           "another machine" % (user, entry.pw_dir))
        elif user not in created:
            created.append(user)  # left by a lab whose state was lost: same home, so ours
        # '*' = no password but not locked: sshd (UsePAM no) refuses '!' accounts
        run(["usermod", "-p", "*", user])
    rule = "# gpuops lab (tests/lab/lab): removed by 'lab down'\n%s ALL=(root) NOPASSWD: /usr/sbin/pct\n" % SUDO_USER
    rule += "%s ALL=(root) NOPASSWD: %s\n" % (NARROW_USER, PCT_NARROW)
    for user in (SUDO_USER, NARROW_USER):  # pct decodes non-ASCII arguments with this (README: a real host's rule)
        rule += 'Defaults:%s env_keep += "LC_CTYPE"\n' % user
    if LAB_DIR != DEFAULT_LAB_DIR:
        for user in (SUDO_USER, NARROW_USER):
            rule += 'Defaults:%s env_keep += "GPUOPS_LAB_DIR"\n' % user
    os.makedirs(os.path.dirname(PCT_NARROW), mode=0o755, exist_ok=True)
    with open(PCT_NARROW_SOURCE, encoding="utf-8") as handle:
        write_if_changed(PCT_NARROW, handle.read(), mode=0o755)
    # the narrow user may reach CT200 only
    os.makedirs(os.path.dirname(PCT_NARROW_LIST), mode=0o755, exist_ok=True)
    write_if_changed(PCT_NARROW_LIST, MAIN_CT + "\n")
    tmp = SUDOERS + ".lab-new"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(rule)
    os.chmod(tmp, 0o440)
    run(["visudo", "-c", "-q", "-f", tmp])
    os.replace(tmp, SUDOERS)


def ssh_argv(user: str, argv: list[str], timeout: int = 15, port: int = PORT) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-i", KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "UserKnownHostsFile=%s" % KNOWN_HOSTS, "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=%d" % timeout, "-p", str(port), "%s@%s" % (user, HOST), "--", shlex.join(argv)]


def wrapper_env(node: LabNode) -> dict:
    """What the host's tool wrappers set (recorded: a supervisor started with other wrappers is restarted)."""
    out = {}
    if node.pct_env:
        out["pct"] = node.pct_env
    if node.smi_env:
        out["nvidia-smi"] = node.smi_env
    return out


# Bumped when supervise() learns something a command relies on (2: `sshd-restart`): `up` restarts a
# supervisor started by an older lab.py even from the same checkout.
SUPERVISOR_PROTOCOL = 2


def sshd_restart_request(node: LabNode) -> str:
    return os.path.join(FAULTS_DIR, "sshd-restart" if node.index == 1 else "sshd-restart-node%d" % node.index)


def supervisor_alive(sup: dict) -> bool:
    return ref_alive(sup.get("supervisor")) and ref_alive(sup.get("sshd"))


def port_open(port: int = PORT) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=2) as conn:
            conn.settimeout(2)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def sshd_config_digest(node: LabNode) -> str:
    """The written sshd_config's digest (recorded: sshd reads its config once, so a changed one needs a new sshd)."""
    with open(node.sshd_config, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def ensure_supervisor(node: LabNode = NODES[1]) -> dict:
    sup = load_json(node.supervisor_file)
    # The lab host's pct and nvidia-smi are this checkout's files: a lab brought up
    # from another checkout (an older clone, CI's fresh one) must not keep serving its code.
    same_checkout = (sup.get("checkout") == HERE and sup.get("wrapper_env", {}) == wrapper_env(node)
                     and sup.get("protocol") == SUPERVISOR_PROTOCOL
                     and sup.get("sshd_config") == sshd_config_digest(node))
    if supervisor_alive(sup) and port_open(node.port) and same_checkout:
        return sup
    if ref_alive(sup.get("supervisor")):
        if same_checkout:
            log("restarting the lab's sshd supervisor")
        else:
            log("the lab host serves %s's tools or an older sshd_config: restarting it from %s" % (
                sup.get("checkout") or "another checkout", HERE))
        stop_supervisor(sup)
    if port_open(node.port):
        raise LabError("%s:%d is taken by a process the lab did not start; free it or set %s" % (
            HOST, node.port, "GPUOPS_LAB_PORT" if node.index == 1 else "GPUOPS_LAB_PORT%d" % node.index))
    os.makedirs(node.ns_dir, exist_ok=True)
    logf = open(os.path.join(node.base, "supervisor.log"), "ab")
    try:
        os.unlink(node.supervisor_file)
    except FileNotFoundError:
        pass
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, os.path.realpath(__file__), "_supervise",
         "--node", str(node.index)],
        stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
        env=dict(os.environ, GPUOPS_LAB_DIR=LAB_DIR, GPUOPS_LAB_PORT=str(PORT),
                 GPUOPS_LAB_HOST_MNTNS=os.readlink("/proc/self/ns/mnt")))
    logf.close()
    deadline = Deadline(30)
    while not deadline.expired():
        sup = load_json(node.supervisor_file)
        if sup.get("ready") and port_open(node.port):
            break
        if proc.poll() is not None:
            raise LabError("the lab supervisor exited (rc %s); see %s" % (
                proc.returncode, os.path.join(node.base, "supervisor.log")))
        time.sleep(0.1)
    else:
        raise LabError("sshd did not come up on %s:%d within 30s; see %s/supervisor.log" % (
            HOST, node.port, node.base))
    return sup


def stop_supervisor(sup: dict, timeout: float = 20) -> None:
    ref = sup.get("supervisor")
    if ref_alive(ref):
        os.kill(int(ref["pid"]), signal.SIGTERM)
        deadline = Deadline(timeout)
        while ref_alive(ref) and not deadline.expired():
            time.sleep(0.05)
    left = [r for r in (sup.get("supervisor"), sup.get("sshd"), sup.get("driver")) if ref_alive(r)]
    if left:
        kill_refs(left, timeout=10)


def overlay_mark(ns_dir: str) -> str:
    """What a lab host's mount table shows and no other namespace's does: its overlays' upper layers."""
    return "upperdir=%s/" % ns_dir


def mntns_members(ns: str, mark: str | None = None) -> list[int]:
    """Live PIDs in mount namespace NS ('mnt:[inode]').

    The kernel hands a freed namespace's inode number to the next namespace it
    creates, so a recorded NS names somebody else's namespace once the lab's has
    ended: a container started beside the lab (the clean room) got it, and `down`
    SIGKILLed it. With MARK (overlay_mark), a process counts only if its mount
    table shows MARK too, which only the lab host's namespace mounts.
    """
    out = []
    for pid in _proc.list_pids():
        try:
            if os.readlink("/proc/%d/ns/mnt" % pid) != ns:
                continue
            info = _proc.read_process(pid)
            if info is None or info.state in ("Z", "X"):
                continue
            if mark is not None:
                with open("/proc/%d/mountinfo" % pid, encoding="utf-8", errors="replace") as handle:
                    if mark not in handle.read():
                        continue
            out.append(pid)
        except OSError:
            continue
    return out


# ------------------------------------------------ the supervisor (inside its mount namespace)

class _Stop(Exception):
    pass


def _overlay_file(target_dir: str, name: str, source: str, tag: str, ns_dir: str = NS_DIR,
                  env: dict[str, str] | None = None) -> None:
    """Show source at target_dir/name in this mount namespace only; nothing is written to target_dir.

    An overlay whose upper layer holds a two-line wrapper that execs the
    checkout's file: edits to the source take effect at once, tools that find
    their library next to their realpath (the fake nvidia-smi) keep working, and
    target_dir/name is a regular file like the real one. A symlink would not do:
    a checkout under a 0700 directory (mktemp -d) makes it dangle for a non-root
    login such as pveops, which then sees no pct before sudo runs it as root.
    The wrapper sets ``env`` itself (after sudo has cleaned the environment): a
    second lab host's pct then reads its own container configs.
    """
    upper = os.path.join(ns_dir, tag + ".upper")
    work = os.path.join(ns_dir, tag + ".work")
    for path in (upper, work):
        if os.path.exists(path):
            shutil.rmtree(path)
        os.makedirs(path)
    wrapper = os.path.join(upper, name)
    with open(wrapper, "w", encoding="utf-8") as f:
        prefix = "/usr/bin/env %s " % " ".join(shlex.quote("%s=%s" % kv) for kv in sorted(env.items())) if env else ""
        f.write("#!/bin/sh\nexec %s%s \"$@\"\n" % (prefix, shlex.quote(source)))
    os.chmod(wrapper, 0o755)
    run(["mount", "-t", "overlay", "overlay", "-o",
         "lowerdir=%s,upperdir=%s,workdir=%s" % (target_dir, upper, work), target_dir])


def _is_lxc_monitor(pid: int) -> bool:
    info = _proc.read_process(pid)
    return bool(info and info.cmdline and info.cmdline[0].startswith("[lxc monitor]"))


def deliberate_restart(node: LabNode, exited: dict | None) -> float | None:
    """The gap (seconds) `lab sshd-restart` asked for, when its request names EXITED (the sshd just reaped);
    None for a crash. The request is consumed."""
    path = sshd_restart_request(node)
    request = load_json(path)
    if not request or request.get("sshd") != exited:
        return None
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return min(SSHD_RESTART_MAX_DOWN_S, max(0.0, float(request.get("down_for", 0))))


def supervise(node: LabNode = NODES[1]) -> int:
    """PID 'init' of a lab host: owns the mount namespace, reaps orphans, runs sshd and the GPU driver."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    my_ns = os.readlink("/proc/self/ns/mnt")
    if my_ns == os.environ.get("GPUOPS_LAB_HOST_MNTNS"):
        log("supervise: not in a private mount namespace; refusing to touch /usr")
        return 2
    _overlay_file("/usr/sbin", "pct", os.path.join(HERE, "pct"), "usr-sbin", node.ns_dir, node.pct_env)
    smi = os.path.join(HERE, "fakegpu", "nvidia-smi")
    if os.path.exists(smi):
        _overlay_file("/usr/bin", "nvidia-smi", smi, "usr-bin", node.ns_dir, node.smi_env)

    def on_signal(*_):
        raise _Stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def start_sshd() -> subprocess.Popen:
        logf = open(node.sshd_log, "ab")
        proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", node.sshd_config], stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=logf, close_fds=True)
        logf.close()
        return proc

    def start_driver() -> subprocess.Popen | None:
        lib = os.path.join(HERE, "fakegpu", "fakegpu.py")
        if not os.path.exists(lib) or not os.path.exists(os.path.join(node.fakegpu_dir, "config.json")):
            return None
        logf = open(os.path.join(node.fakegpu_dir, "driver.log"), "ab")
        proc = subprocess.Popen([sys.executable, lib, "driver"], stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=logf, close_fds=True, env=dict(os.environ, FAKEGPU_DIR=node.fakegpu_dir))
        logf.close()
        return proc

    info: dict = {"supervisor": proc_ref(os.getpid()), "mntns": my_ns, "checkout": HERE,
                  "wrapper_env": wrapper_env(node), "protocol": SUPERVISOR_PROTOCOL, "sshd_restarts": 0,
                  "sshd_config": sshd_config_digest(node)}
    sshd = driver = None
    restarts: list[float] = []
    restart_at = 0.0  # while sshd is None: when the deliberate restart's gap ends (monotonic)
    try:
        sshd = start_sshd()
        driver = start_driver()
        info["sshd"] = proc_ref(sshd.pid)
        info["driver"] = proc_ref(driver.pid) if driver else None
        info["ready"] = True
        atomic_write(node.supervisor_file, json.dumps(info, indent=1) + "\n")
        while True:
            if sshd is None:  # a deliberate restart's gap: the listener is down, orphans are still reaped
                if time.monotonic() >= restart_at:
                    sshd = start_sshd()
                    info["sshd"] = proc_ref(sshd.pid)
                    info["sshd_restarts"] += 1
                    atomic_write(node.supervisor_file, json.dumps(info, indent=1) + "\n")
                    continue
                try:
                    pid = os.waitpid(-1, os.WNOHANG)[0]
                except ChildProcessError:
                    pid = 0
                if pid == 0:
                    time.sleep(min(0.05, max(0.0, restart_at - time.monotonic())))
                    continue
            else:
                try:
                    pid = os.waitpid(-1, 0)[0]  # reaps sshd sessions' orphans and lxc monitors too
                except ChildProcessError:
                    time.sleep(1)
                    continue
            if sshd is not None and pid == sshd.pid:
                down_for = deliberate_restart(node, info["sshd"])
                if down_for is not None:
                    # as systemd's `restart ssh` (KillMode=process): the listener is replaced, the sessions it
                    # forked live on (now our children: we are their subreaper)
                    sshd = None
                    restart_at = time.monotonic() + down_for
                    info["sshd"] = None
                    atomic_write(node.supervisor_file, json.dumps(info, indent=1) + "\n")
                    continue
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < 60] + [now]
                if len(restarts) > 5:
                    log("supervise: sshd keeps dying; giving up (see sshd.log)")
                    break
                sshd = start_sshd()
                info["sshd"] = proc_ref(sshd.pid)
                atomic_write(node.supervisor_file, json.dumps(info, indent=1) + "\n")
            elif driver is not None and pid == driver.pid:
                driver = None
                info["driver"] = None
                atomic_write(node.supervisor_file, json.dumps(info, indent=1) + "\n")
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # End everything this namespace still runs: sshd, its sessions, the driver, orphans we adopted.
    deadline = Deadline(10)
    sent_kill = False
    while True:
        reap_children_nohang()
        # lxc monitors stay: their containers outlive a supervisor restart ('down' stops them first)
        mine = [p for p in mntns_members(my_ns) if p != os.getpid() and not _is_lxc_monitor(p)]
        if not mine:
            break
        sig = signal.SIGTERM
        if deadline.remaining() < 5:
            sig = signal.SIGKILL
            sent_kill = True
        for pid in mine:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if deadline.expired() and sent_kill:
            break
        time.sleep(0.1)
    reap_children_nohang()
    try:
        os.unlink(node.supervisor_file)
    except FileNotFoundError:
        pass
    return 0


# ---------------------------------------------------------------- fake GPUs

def ensure_fakegpu(fakegpu_dir: str = FAKEGPU_DIR) -> None:
    lib = os.path.join(HERE, "fakegpu", "fakegpu.py")
    if not os.path.exists(os.path.join(fakegpu_dir, "config.json")):
        run([sys.executable, lib, "--dir", fakegpu_dir, "init", "--count", str(GPU_COUNT)])
    # A state dir that exists keeps its config (tests change it); the bind mounts need every device file.
    _load_file(lib, "gpuops_lab_fakegpu").ensure_devices(fakegpu_dir, GPU_COUNT)


# ---------------------------------------------------------------- the trainer and decoys

def tmux(vmid: str, *args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    return ct_exec(vmid, ["tmux", *args], timeout=timeout, check=check)


def kill_tmux_server(vmid: str, timeout: float = 10) -> None:
    """End the container's tmux server and wait until it is gone.

    `kill-server` returns once the server has the request, not once it has exited: a `new-session` in
    that gap reaches the dying server and fails with "server exited unexpectedly". Gone is when a client
    can no longer reach it ("no server running" / "error connecting").
    """
    tmux(vmid, "kill-server", check=False)
    deadline = Deadline(timeout)
    while not deadline.expired():
        res = tmux(vmid, "list-sessions", check=False)
        err = res.stderr.decode(errors="replace")
        if res.returncode != 0 and ("no server running" in err or "error connecting" in err):
            return
        time.sleep(0.1)
    raise LabError("CT%s's tmux server was still up %.0f s after kill-server" % (vmid, timeout))


def has_session(vmid: str, name: str) -> bool:
    return tmux(vmid, "has-session", "-t", "=" + name, check=False).returncode == 0


def decoy_audited(vmid: str) -> bool:
    """The running networkd-dispatcher decoy records its signals (started from the unit that asks it to)."""
    res = ct_exec(vmid, ["systemctl", "show", "-p", "MainPID", "--value", "networkd-dispatcher.service"], check=False)
    pid = res.stdout.decode().strip()
    audit = os.path.join(LXCPATH, vmid, "rootfs", CT_SIGNAL_AUDIT.lstrip("/"), "networkd-dispatcher.%s.jsonl" % pid)
    return pid.isdigit() and pid != "0" and os.path.exists(audit)


def ensure_decoys(vmid: str) -> None:
    res = ct_exec(vmid, ["systemctl", "is-active", "networkd-dispatcher.service"], check=False)
    if res.stdout.decode().strip() != "active":
        ct_exec(vmid, ["systemctl", "daemon-reload"])
        ct_exec(vmid, ["systemctl", "enable", "--now", "networkd-dispatcher.service"])
    elif not decoy_audited(vmid):
        # started before the unit asked for the signal audit: once, restart it from the current unit
        ct_exec(vmid, ["systemctl", "daemon-reload"])
        ct_exec(vmid, ["systemctl", "restart", "networkd-dispatcher.service"])
    for name, argv in DECOY_SESSIONS.items():
        if not has_session(vmid, name):
            tmux(vmid, "new-session", "-d", "-s", name, "-x", "160", "-y", "48", shlex.join(argv))


def host_proc_in_ct(vmid: str, ct_pid: int) -> int | None:
    """The host PID of the container's process ct_pid."""
    for info in _proc.iter_processes():
        if info.nspid and info.nspid[-1] == ct_pid and len(info.nspid) > 1:
            if _proc.container_vmid_from_cgroup(info.cgroup) == int(vmid):
                return info.pid
    return None


def _ct_ref(pid: int) -> dict:
    info = _proc.read_process(pid)
    return dict(proc_ref(pid) or {}, ct_pid=info.nspid[-1] if info and info.nspid else None)


def trainer_record(vmid: str, behaviour: str = DEFAULT_BEHAVIOUR) -> dict:
    """PIDs (host and container) of the dflash pane's process, the launcher and its workers.

    The fake trainer: the pane is a shell, the launcher its child, the workers below it. torchrun: the
    pane's process is the agent itself (the command was given to `new-session`), its children are the
    ranks (each in its own session, as torchrun starts them) and theirs the DataLoader workers.
    """
    res = tmux(vmid, "display-message", "-p", "-t", "=" + TRAINER_SESSION + ":", "#{pane_pid}", check=False)
    try:
        pane_ct = int(res.stdout.decode().strip())
    except ValueError:
        return {}
    pane = host_proc_in_ct(vmid, pane_ct)
    if pane is None:
        return {}
    kids = children_map()
    rec: dict = {"pane": dict(proc_ref(pane) or {}, ct_pid=pane_ct), "launcher": None, "workers": []}
    if behaviour == TORCHRUN:
        rec["launcher"] = rec["pane"]
        rec["workers"] = [_ct_ref(pid) for pid in sorted(kids.get(pane, []))]
        rec["loader_workers"] = [_ct_ref(pid) for rank in sorted(kids.get(pane, []))
                                 for pid in sorted(kids.get(rank, []))]
        return rec
    for pid in sorted(descendants(pane, kids)):
        info = _proc.read_process(pid)
        if info is None or not any(arg.endswith("fake_trainer.py") for arg in info.cmdline):
            continue
        ref = dict(proc_ref(pid) or {}, ct_pid=info.nspid[-1] if info.nspid else None)
        if rec["launcher"] is None and info.ppid == pane:
            rec["launcher"] = ref
        else:
            rec["workers"].append(ref)
    return rec


def trainer_refs(rec: dict) -> list[dict]:
    refs = [rec.get("pane"), rec.get("launcher")] + list(rec.get("workers") or []) + list(rec.get("loader_workers") or [])
    return [r for r in refs if r and r.get("pid")]


def trainer_slot(state: dict, vmid: str) -> dict:
    """Where a GPU container's trainer is recorded: CT200's at the top of the state (as always), others under ctVMID."""
    return state if vmid == MAIN_CT else state.setdefault("ct" + vmid, {})


def stray_trainer_refs(vmid: str) -> list[dict]:
    """Processes in container VMID running the lab's trainers or a fake GPU holder that the lab did not record:
    a job the way back (restore_training) started again, its ranks left behind, a `fakegpu.py hold` of a killed test."""
    scripts = (TRAINER_SCRIPT, TORCHRUN_SCRIPT, CT_LAB + "/fakegpu/fakegpu.py")
    init = ct_init_pid(vmid) if ct_state(vmid) == "running" else None
    if init is None:
        return []
    # this lab's container only: its init's PID namespace (a cgroup path names a VMID that another lab on this
    # machine, a clean room's, uses too)
    try:
        pidns = os.readlink("/proc/%d/ns/pid" % init)
    except OSError:
        return []
    refs = []
    for info in _proc.iter_processes():
        try:
            if os.readlink("/proc/%d/ns/pid" % info.pid) != pidns:
                continue
        except OSError:
            continue
        argv = info.cmdline
        # run by python (never the `vi fake_trainer.py` decoy, which only has the script open): the trainer, its
        # workers and a fake GPU holder (the script at argv[1], or [2] after -u), or torchrun running its job
        python = bool(argv) and os.path.basename(argv[0]).startswith("python")
        if python and (any(arg in scripts for arg in argv[1:3])
                       or (len(argv) > 1 and argv[1].endswith("/torchrun") and TORCHRUN_SCRIPT in argv)):
            refs.append({"pid": info.pid, "starttime": info.starttime})
    return refs


def stop_trainer(state: dict, vmid: str = MAIN_CT) -> None:
    slot = trainer_slot(state, vmid)
    rec = slot.get("trainer", {}).get("pids") or {}
    left = kill_refs(trainer_refs(rec) + stray_trainer_refs(vmid))
    if left:
        raise LabError("trainer processes survived SIGKILL: %s" % left)
    if ct_state(vmid) == "running" and has_session(vmid, TRAINER_SESSION):
        tmux(vmid, "kill-session", "-t", "=" + TRAINER_SESSION, check=False)
    slot.setdefault("trainer", {})["pids"] = {}


def new_trainer_session(vmid: str = MAIN_CT) -> None:
    # the pane's shell (and so the trainer typed into it) gets the signal audit's directory
    tmux(vmid, "new-session", "-d", "-s", TRAINER_SESSION, "-x", "200", "-y", "50", "-c",
         os.path.dirname(TRAINER_CKPT), "-e", "GPUOPS_LAB_SIGNAL_AUDIT=" + CT_SIGNAL_AUDIT)


VENV_MARKER = ".gpuops-lab-complete"


def torch_venv_cache(timeout: float = 1800) -> str:
    """The PyTorch (CPU) venv for CT200, made with the containers' own python3; built once, cached.

    Built in a throwaway hard-link copy of the rootfs cache (the tree CT200 is copied from: its
    python3, its libc), chrooted in a private mount namespace: no lab, container or lock of the lab is
    involved, so it can be built ahead (`lab torch-venv`) or on first use of the torchrun behaviour. The
    wheels (torch's CPU build from pip's find-links, its dependencies) are fetched on the host by the
    system pip with its own configuration and installed with `--no-index`. Every step is bounded; an
    interrupted build is started again. Keyed by torch version and rootfs.
    """
    cache = os.path.join(CACHE_DIR, "ct-torch-venv-%s-%s" % (TORCH_VERSION, cache_key()))
    if os.path.exists(os.path.join(cache, VENV_MARKER)):
        return cache
    os.makedirs(CACHE_DIR, exist_ok=True)
    fd = os.open(os.path.join(CACHE_DIR, ".ct-torch-venv.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = Deadline(timeout)
        while True:  # one build at a time (bounded)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    raise LabError("another build of %s took more than %ss" % (cache, timeout)) from None
                time.sleep(1)
        if os.path.exists(os.path.join(cache, VENV_MARKER)):
            return cache
        root = cache + ".build"
        if os.path.exists(root):
            shutil.rmtree(root)
        log("building the torch %s venv for the containers (once, a few minutes): %s" % (TORCH_VERSION, cache))
        run(["cp", "-al", rootfs_cache(), root], timeout=300)  # new directories, shared (unmodified) files
        try:
            wheels = os.path.join(root, CT_TORCH_WHEELS.lstrip("/"))
            run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                 "--only-binary=:all:", "--dest", wheels, "torch==" + TORCH_VERSION], timeout=1200)
            if not [name for name in os.listdir(wheels) if name.startswith("torch-%s+cpu-" % TORCH_VERSION)]:
                raise LabError("pip found no CPU build of torch %s (torch-%s+cpu-*.whl in pip's find-links); a "
                               "CUDA build would pull gigabytes of nvidia-* wheels: put the CPU wheel there"
                               % (TORCH_VERSION, TORCH_VERSION))
            env = "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"
            script = " && ".join([
                "mount -t proc proc %s/proc" % shlex.quote(root),
                "mount --rbind /dev %s/dev" % shlex.quote(root),
                "chroot %s %s python3 -m venv %s" % (shlex.quote(root), env, CT_TORCH_VENV),
                "chroot %s %s %s/bin/pip install --quiet --disable-pip-version-check --no-index --find-links %s "
                "torch==%s" % (shlex.quote(root), env, CT_TORCH_VENV, CT_TORCH_WHEELS, TORCH_VERSION),
                "chroot %s %s %s/bin/python -c 'import torch.distributed, torch; assert torch.version.cuda is None'"
                % (shlex.quote(root), env, CT_TORCH_VENV),
            ])
            # the mounts live in this private namespace only and end with it
            run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script], timeout=1500)
            venv = os.path.join(root, CT_TORCH_VENV.lstrip("/"))
            with open(os.path.join(venv, VENV_MARKER), "w", encoding="utf-8") as handle:
                handle.write("torch %s for %s (rootfs %s)\n" % (TORCH_VERSION, CT_TORCH_VENV, cache_key()))
            shutil.rmtree(cache, ignore_errors=True)
            os.rename(venv, cache)
        finally:
            umount_under(root)
            shutil.rmtree(root, ignore_errors=True)
        return cache
    finally:
        os.close(fd)


def ct_torch_venv(vmid: str) -> str:
    """Put the cached torch venv into the container (hard links: a second or so); its path there."""
    dest = os.path.join(LXCPATH, vmid, "rootfs", CT_TORCH_VENV.lstrip("/"))
    if os.path.exists(os.path.join(dest, VENV_MARKER)):
        return CT_TORCH_VENV
    cache = torch_venv_cache()
    if os.path.exists(dest):
        shutil.rmtree(dest)  # an interrupted copy: start again
    # hard links share their owner with the cache: an unprivileged container's shifted ids would reach it
    if is_unprivileged(vmid) or run(["cp", "-al", cache, dest], timeout=300, check=False).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)  # the cache on another filesystem: a real copy
        run(["cp", "-a", "--reflink=auto", cache, dest], timeout=600)
    return CT_TORCH_VENV


def trainer_command(behaviour: str, ckpt_every: int = 0) -> str:
    every = ["--ckpt-every", str(ckpt_every)] if ckpt_every else []
    if behaviour == TORCHRUN:
        # --hold: each rank keeps /dev/nvidiaN open, as a CUDA rank does (the role's GPU-holder check sees it)
        return shlex.join([CT_TORCH_VENV + "/bin/torchrun", "--standalone", "--nproc_per_node=%d" % TORCHRUN_NPROC,
                           TORCHRUN_SCRIPT, "--ckpt-dir", TORCHRUN_CKPT, "--hold", "/dev/nvidia%d",
                           "--num-workers", "2", "--step-sleep", "0.2", "--data", TRAINER_DATA] + every)
    return shlex.join(["python3", TRAINER_SCRIPT, "--behaviour", behaviour, "--nproc", str(TRAINER_NPROC),
                       "--ckpt-dir", TRAINER_CKPT, "--data", TRAINER_DATA] + every)


def start_trainer(state: dict, behaviour: str, timeout: float = 60, vmid: str = MAIN_CT, ckpt_every: int = 0) -> None:
    if behaviour not in BEHAVIOURS:
        raise LabError("unknown behaviour %r; pick one of %s" % (behaviour, ", ".join(BEHAVIOURS)))
    slot = trainer_slot(state, vmid)
    rootfs = os.path.join(LXCPATH, vmid, "rootfs")
    script = TORCHRUN_SCRIPT if behaviour == TORCHRUN else TRAINER_SCRIPT
    if not os.path.exists(os.path.join(rootfs, script.lstrip("/"))):
        raise LabError("no %s in CT%s: tests/lab/%s is missing" % (
            script, vmid, os.path.relpath(script, CT_LAB)))
    stop_trainer(state, vmid)
    if behaviour == TORCHRUN:
        ct_torch_venv(vmid)
    if behaviour == TORCHRUN or slot.get("tmux_server") == TORCHRUN:
        # torchrun: the job's session must start the server (which then keeps its command line), as on
        # the incident's node. Any other behaviour: back to the baseline server that 'up' starts. Only
        # the lab's own server in CT200 ends here; the decoy sessions are recreated on the new one.
        kill_tmux_server(vmid)
        slot.pop("tmux_server", None)
    ckpt = TORCHRUN_CKPT if behaviour == TORCHRUN else TRAINER_CKPT
    os.makedirs(os.path.join(rootfs, ckpt.lstrip("/")), exist_ok=True)
    data = os.path.join(rootfs, TRAINER_DATA.lstrip("/"))
    if not os.path.exists(data):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        with open(data, "w", encoding="utf-8") as handle:
            handle.write('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    match_ids(vmid)
    cmd = trainer_command(behaviour, ckpt_every)
    if behaviour == TORCHRUN:
        timeout = max(timeout, 180)  # importing torch in two ranks on a busy 2-core machine
        tmux(vmid, "new-session", "-d", "-s", TRAINER_SESSION, "-x", "200", "-y", "50", "-c",
             os.path.dirname(TRAINER_CKPT), cmd)
        slot["tmux_server"] = TORCHRUN
        step_re = TORCHRUN_STEP_RE
    else:
        # A shell in the pane and the command typed into it, as the operator did; Ctrl-C then
        # reaches the launcher through the terminal, and the shell stays when training ends.
        new_trainer_session(vmid)
        tmux(vmid, "send-keys", "-t", "=" + TRAINER_SESSION + ":", "-l", cmd)
        tmux(vmid, "send-keys", "-t", "=" + TRAINER_SESSION + ":", "Enter")
        step_re = STEP_RE
    slot["trainer"] = {"behaviour": behaviour, "command": cmd, "pids": {}, "started": time.time()}
    save_state(state)
    deadline = Deadline(timeout)
    pane = ""
    while not deadline.expired():
        res = tmux(vmid, "capture-pane", "-p", "-t", "=" + TRAINER_SESSION + ":", "-S", "-200", check=False)
        pane = res.stdout.decode(errors="replace")
        if step_re.search(pane):
            break
        if res.returncode != 0 and behaviour == TORCHRUN and not has_session(vmid, TRAINER_SESSION):
            raise LabError("torchrun exited before its first step line (its pane closed); run it by hand in "
                           "CT%s to see why: %s" % (vmid, cmd))
        time.sleep(0.2)
    else:
        raise LabError("no step lines in tmux session %s within %ss; pane shows:\n%s" % (
            TRAINER_SESSION, timeout, pane[-1500:]))
    # workers may still be starting when the first step prints: record until all are there (bounded)
    want = TORCHRUN_NPROC if behaviour == TORCHRUN else TRAINER_NPROC
    loaders = 2 * TORCHRUN_NPROC if behaviour == TORCHRUN else 0  # --num-workers 2 per rank

    def complete(rec: dict) -> bool:
        return len(rec.get("workers", [])) >= want and len(rec.get("loader_workers", [])) >= loaders

    deadline = Deadline(10)
    rec = trainer_record(vmid, behaviour)
    while not complete(rec) and not deadline.expired():
        time.sleep(0.2)
        rec = trainer_record(vmid, behaviour)
    slot["trainer"]["pids"] = rec
    save_state(state)


def trainer_intact(state: dict, vmid: str = MAIN_CT) -> bool:
    """The lab's trainer runs as started: pane process, launcher and every worker alive."""
    rec = trainer_slot(state, vmid).get("trainer", {}).get("pids") or {}
    refs = [rec.get("pane"), rec.get("launcher")] + list(rec.get("workers") or [])
    return bool(rec.get("workers")) and all(ref_alive(r) for r in refs)


def trainer_running(state: dict, vmid: str = MAIN_CT) -> bool:
    rec = trainer_slot(state, vmid).get("trainer", {}).get("pids") or {}
    return ref_alive(rec.get("launcher")) or any(ref_alive(w) for w in rec.get("workers") or [])


# ---------------------------------------------------------------- commands

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
    return subprocess.run([sys.executable, os.path.realpath(__file__), *argv], env=env, timeout=timeout,
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


def end_mount_ns(ns: str | None, ns_dir: str) -> None:
    """SIGKILL whatever still runs in a lab host's mount namespace (only the lab enters it); bounded.

    By then the namespace has usually ended with its supervisor and NS may be another's: only members that
    show the lab's overlays (mntns_members' MARK) are signalled."""
    if not ns:
        return
    mark = overlay_mark(ns_dir)
    deadline = Deadline(15)
    members = mntns_members(ns, mark)
    while members and not deadline.expired():
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        members = mntns_members(ns, mark)
    if members:
        raise LabError("processes %s still run in the lab's mount namespace" % members)


def trainer_status(trainer: dict, rec: dict, running: bool, vmid: str = MAIN_CT) -> dict:
    """The trainer's part of `status`. torchrun: no shell in the pane (the agent is the pane's process,
    `launcher`), `workers` are the ranks and `loader_workers` their DataLoader workers."""
    torchrun = trainer.get("behaviour") == TORCHRUN

    def pids(key: str) -> dict:
        out = {"pane_shell": None if torchrun else (rec.get("pane") or {}).get(key),
               "launcher": (rec.get("launcher") or {}).get(key),
               "workers": [w.get(key) for w in rec.get("workers") or []]}
        if torchrun:
            out["loader_workers"] = [w.get(key) for w in rec.get("loader_workers") or []]
        return out

    status = {
        "container": int(vmid),
        "tmux_session": TRAINER_SESSION,
        "behaviour": trainer.get("behaviour"),
        "command": trainer.get("command"),
        "script": TORCHRUN_SCRIPT if torchrun else TRAINER_SCRIPT,
        "ckpt_dir": TORCHRUN_CKPT if torchrun else TRAINER_CKPT,
        "nproc": TORCHRUN_NPROC if torchrun else TRAINER_NPROC,
        "running": running,
        "pids": pids("ct_pid"),
        "host_pids": pids("pid"),
    }
    if torchrun:
        status["venv"] = CT_TORCH_VENV
    return status


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


def lab_sshd(node: LabNode, sup: dict) -> dict:
    """The lab host's listening sshd, as its supervisor recorded it, cross-checked with sshd's own pid file and
    command line: the only process `sshd-restart` signals."""
    ref = sup.get("sshd")
    if not supervisor_alive(sup):
        raise LabError("the lab host %s's sshd is not running: run 'tests/lab/lab up%s' first" % (
            node.name, "" if node.index == 1 else " --nodes 2"))
    if sup.get("protocol") != SUPERVISOR_PROTOCOL:
        raise LabError("the lab host %s's supervisor predates sshd-restart: run 'tests/lab/lab up' from this "
                       "checkout (it restarts the supervisor)" % node.name)
    pid_file = os.path.join(SSH_DIR, "sshd.pid" if node.index == 1 else "sshd-node%d.pid" % node.index)
    try:
        with open(pid_file, encoding="ascii") as handle:
            written = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        written = None
    info = _proc.read_process(int(ref["pid"]))
    # the listener's title (setproctitle): "sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."
    if written != ref["pid"] or info is None or " -f %s " % node.sshd_config not in " ".join(info.cmdline) + " ":
        raise LabError("the sshd recorded for %s (pid %s) is not the one in %s (%s) or runs another config: "
                       "nothing signalled; run 'tests/lab/lab up'" % (node.name, ref["pid"], pid_file, written))
    return ref


def sshd_restart(node: LabNode, down_for: float, stop_timeout: float = 10.0, start_timeout: float = 30.0) -> dict:
    """Restart the lab host's sshd as `systemctl restart ssh` does on a PVE host (Debian's ssh.service:
    KillMode=process, so SIGTERM to the listener only; sshd's SIGTERM handler closes the listening sockets and
    exits, the session processes it forked go on), then a new listener, after DOWN_FOR seconds with none.
    Every wait bounded; the facts of the restart."""
    if not 0 <= down_for <= SSHD_RESTART_MAX_DOWN_S:
        raise LabError("--down-for %s: give the seconds without a listener, from 0 to %d" % (
            down_for, SSHD_RESTART_MAX_DOWN_S))
    old = lab_sshd(node, load_json(node.supervisor_file))
    request = sshd_restart_request(node)
    os.makedirs(FAULTS_DIR, exist_ok=True)
    atomic_write(request, json.dumps({"sshd": old, "down_for": down_for}) + "\n")
    try:
        os.kill(int(old["pid"]), signal.SIGTERM)  # ref checked just above; the supervisor reaps it
        stop = Deadline(stop_timeout)
        while ref_alive(old):  # not `listening`: without a gap the new listener may already be there
            if stop.expired():
                raise LabError("sshd (pid %s) still runs %ss after SIGTERM" % (old["pid"], stop_timeout))
            time.sleep(0.01)
        stopped_at = time.time()
        start = Deadline(down_for + start_timeout)
        while True:
            sup = load_json(node.supervisor_file)
            new = sup.get("sshd")
            if new and new != old and ref_alive(new) and _procfs.listening(node.port, HOST):
                break
            if start.expired():
                raise LabError("no new sshd listened on %s:%d within %ss of the old one's exit; see %s" % (
                    HOST, node.port, down_for + start_timeout, os.path.join(node.base, "supervisor.log")))
            time.sleep(0.01)
        up_at = time.time()
    finally:
        try:
            os.unlink(request)  # not consumed: the supervisor never saw that sshd exit
        except FileNotFoundError:
            pass
    return {"node": node.index, "port": node.port, "old_pid": old["pid"], "new_pid": new["pid"],
            "stopped_at": stopped_at, "up_at": up_at, "down_s": round(up_at - stopped_at, 3)}


def cmd_sshd_restart(args: argparse.Namespace) -> int:
    preflight()
    # no lab Lock: a test holding it (so that no `up` or `trainer` changes CT200 meanwhile) injects this fault
    print(json.dumps(sshd_restart(NODES[args.node], args.down_for), indent=1, sort_keys=True))
    return 0


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
