# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The dflash trainer in a GPU container's tmux session, and the decoys beside it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time

from .containers import ct_exec, ct_init_pid, ct_state, match_ids
from .facts import (
    BEHAVIOURS,
    CT_LAB,
    CT_SIGNAL_AUDIT,
    CT_TORCH_VENV,
    DECOY_SESSIONS,
    DEFAULT_BEHAVIOUR,
    LXCPATH,
    MAIN_CT,
    STEP_RE,
    TORCHRUN,
    TORCHRUN_CKPT,
    TORCHRUN_NPROC,
    TORCHRUN_SCRIPT,
    TORCHRUN_STEP_RE,
    TRAINER_CKPT,
    TRAINER_DATA,
    TRAINER_NPROC,
    TRAINER_SCRIPT,
    TRAINER_SESSION,
    Deadline,
    LabError,
    _proc,
)
from .host import children_map, descendants, kill_refs, proc_ref, ref_alive, save_state
from .torch_venv import ct_torch_venv


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
