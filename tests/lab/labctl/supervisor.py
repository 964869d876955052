# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A lab PVE host's supervisor, inside its own mount namespace: the overlays that put tests/lab/pct and the fake
nvidia-smi in place, sshd and the fake GPU driver run and reaped, and the end of that namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from .facts import (
    HERE,
    NODES,
    NS_DIR,
    PR_SET_CHILD_SUBREAPER,
    SSHD_RESTART_MAX_DOWN_S,
    Deadline,
    LabError,
    LabNode,
    _proc,
    log,
)
from .host import atomic_write, load_json, proc_ref, reap_children_nohang, run
from .sshd import SUPERVISOR_PROTOCOL, sshd_config_digest, sshd_restart_request, wrapper_env


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
