# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A lab PVE host's sshd: its keys, users and sudo rules, its supervisor's start and stop, and its restart as
``systemctl restart ssh`` restarts a PVE host's (``lab sshd-restart``, README "Faults").
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time

from .facts import (
    DEFAULT_LAB_DIR,
    FAULTS_DIR,
    HERE,
    HOME_DIR,
    HOST,
    KEY,
    KNOWN_HOSTS,
    LAB_DIR,
    LAB_SCRIPT,
    LAB_USERS,
    MAIN_CT,
    NARROW_USER,
    NODES,
    PCT_NARROW,
    PCT_NARROW_LIST,
    PCT_NARROW_SOURCE,
    PORT,
    SSH_DIR,
    SSHD_RESTART_MAX_DOWN_S,
    SUDO_USER,
    SUDOERS,
    Deadline,
    LabError,
    LabNode,
    _proc,
    _procfs,
    log,
)
from .host import atomic_write, kill_refs, load_json, ref_alive, run, save_state, write_if_changed


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
        ["unshare", "--mount", "--propagation", "private", sys.executable, LAB_SCRIPT, "_supervise",
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
