#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_stop
short_description: Stop a training job with a bounded stop-verify-kill ladder
version_added: 0.1.0
description:
  - Selects one training job (a torchrun-like launcher and all its workers) and stops it by climbing a
    ladder of signals, judging every rung only by whether the processes have exited.
  - Before the first signal it snapshots the whole process tree of the selected roots (PID plus start
    time), including workers in other sessions and process groups, and holds every process by a pidfd,
    so a reused PID can never be signalled.
  - The default ladder is Ctrl-C through tmux (with I(tmux_session)) or SIGINT to the launcher, 45 s;
    then SIGTERM to every process of the snapshot, 30 s; then SIGKILL, I(kill_timeout). SIGCONT to every
    process of the snapshot follows every catchable signal, so a stopped process can act on it (and on the
    SIGTERM its launcher forwards).
  - While files under I(progress_paths) keep changing (a checkpoint being written), a rung keeps waiting
    past its timeout, up to I(max_grace).
  - Never signals PID 1, a container's init, this module's own process or its ancestors, kernel threads,
    or anything matching I(exclude). A I(match) that hits several unrelated jobs is refused unless
    I(allow_broad_match=true).
  - Every wait is bounded. Processes that survive SIGKILL for I(kill_timeout) are reported as
    RV(unkillable) with state and wchan, and the module fails (the host needs attention).
  - Runs inside the container (for example through M(gpuops.repurpose.pct_ssh)) or on the Proxmox VE
    host scoped with I(container). Needs only the Python standard library on the target.
author:
  - gpuops.repurpose contributors (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reports the selection and the plan (RV(plan)); sends nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: Shows the selected running processes before, and those left after.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
    details: Once the job is gone nothing is selected and the module reports no change.
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
    details: Linux only (reads C(/proc)). pidfds need Linux 5.3 and Python 3.9; elsewhere it falls back to 20 ms polling.
options:
  pids:
    description:
      - PIDs of the job's roots (usually the launcher). PIDs that are not running are ignored.
      - PID 1, this module's process and its ancestors are refused.
    type: list
    elements: int
  pid_file:
    description:
      - A file holding the launcher's PID.
      - A missing file selects nothing (the job is gone). An unreadable file or one that does not hold
        one PID is an error. A process that started after the file was written is a reused PID and is
        not selected.
    type: path
  match:
    description:
      - A Python regular expression searched in each process's full command line (arguments joined by
        spaces). The topmost hits become the roots.
      - A hit that is a terminal multiplexer (a tmux server, which keeps the command line of the
        C(tmux new-session ... "torchrun ...") that started it, or a tmux/screen client), an interactive shell
        (a terminal's prompt), or an ancestor of a tmux pane's process is never selected through I(match); it is
        listed in RV(left_out) with the reason. Anchor the regex to the program run (for example
        V(^(\\S*/\)?torchrun\\s)) rather than searching anywhere in a command line.
      - If the hits form several unrelated process trees (different programs, users or parents; for
        example V(python) on a host running networkd-dispatcher, or an editor with the training script
        open) the module fails listing them, unless I(allow_broad_match=true). Several trees of the same
        program, user and parent count as one job (the reparented workers of a dead launcher).
    type: str
  tmux_session:
    description:
      - Name of a tmux session (exact match); every process tree under its panes is selected.
      - When a pane's process is an interactive shell (C(bash), C(-zsh), no script or C(-c)), the shell is left
        running and what runs in it is the job (the shell ignores SIGINT and SIGTERM, and killing it would close
        the pane and its scrollback).
      - A missing session or tmux server selects nothing (not an error).
      - Enables the rung with C(via=tmux), which sends Ctrl-C to each pane.
      - Cannot be combined with I(container), because the container's tmux server is not reachable from the host.
    type: str
  tmux_socket:
    description:
      - Path of the tmux server socket (C(tmux -S)), when the session is not on the default server of the
        user the module runs as.
    type: path
  container:
    description:
      - VMID of a Proxmox VE / LXC container. When the module runs on the host, only processes whose cgroup
        belongs to this container are considered, for every selector.
      - Alone it selects everything in the container but its init, which the broad-match rule refuses unless
        I(allow_broad_match=true).
    type: int
  exclude:
    description:
      - Regular expressions; a process whose command line matches any of them is never selected.
    type: list
    elements: str
    default: []
  allow_broad_match:
    description:
      - Stop everything I(match) hits even when the hits are several unrelated jobs.
    type: bool
    default: false
  ladder:
    description:
      - The rungs, in order. Each is a dict with C(signal) (name like V(SIGINT), V(INT) or number),
        C(timeout) (seconds >= 0), optional C(via=tmux) (Ctrl-C to every pane of I(tmux_session);
        signal must be SIGINT) and optional C(to) (V(launcher) - the roots and their process groups,
        what Ctrl-C in their terminal reaches - or V(all) - every process of the snapshot, launchers
        first). C(to) defaults to V(launcher) for SIGINT and V(all) otherwise.
      - A SIGKILL rung waits at most I(kill_timeout).
      - "Default: C([{signal: SIGINT, timeout: 45, via: tmux}, {signal: SIGTERM, timeout: 30}, {signal: SIGKILL, timeout: 10}])
        (without C(via) when I(tmux_session) is unset; the SIGKILL rung waits I(kill_timeout))."
      - At most one SIGINT rung (Ctrl-C); a torchrun agent restarts its shutdown on a second signal and exits at
        once on a third, orphaning its ranks.
      - When a selected root is a torchrun agent (C(torchrun), C(python -m torch.distributed.run)), a SIGINT rung
        shorter than its shutdown timeout plus half of it (at least 5 s more) is lengthened to that, with a note;
        the agent waits that long for its ranks before killing them, and a signal sent meanwhile would restart the
        wait with SIGTERM, which kills the DataLoader workers and aborts a save in progress. The shutdown timeout is
        read from the agent's C(--shutdown-timeout), else C(PET_SHUTDOWN_TIMEOUT) or
        C(TORCH_ELASTIC_SHUTDOWN_TIMEOUT) in its C(/proc/PID/environ), else 30 s (so 45 s by default).
    type: list
    elements: dict
  gpu_devices:
    description:
      - Shell-style patterns of GPU device files (for example V(/dev/nvidia*)). Processes holding one of them open
        (a C(fuser)-like scan of C(/proc), scoped to I(container) when set; C(nvidia-smi), C(nvidia-persistenced)
        and other driver tools do not count) are what keeps the GPUs busy.
      - With I(gpu_holders=stop) they join the selection as roots (C(how=gpu_holder)), with everything that
        belongs to them; this finds the ranks of a job whose launcher is gone (killed with C(-9), OOM), which keep
        training with their tmux pane closed and match no launcher regex.
      - Whatever I(gpu_holders) says, the module fails naming them when nothing was selected but processes hold
        a GPU device (before any signal), or when any holder remains after the ladder; it never reports success,
        or "nothing to do", while the GPUs are held.
      - Empty list (the default) to not look.
    type: list
    elements: str
    default: []
  gpu_holders:
    description:
      - What to do with processes holding I(gpu_devices) that no other selector selected. V(fail) never signals
        them, the module fails naming them (before any signal when nothing else was selected, else after the
        ladder). V(stop) selects them.
    type: str
    choices: [fail, stop]
    default: fail
  progress_paths:
    description:
      - Files or directories (searched recursively, following symlinks, up to 10000 entries, newest first), typically
        the checkpoint directory, where a save started after a signal shows.
      - A rung other than SIGKILL waits past its timeout (up to I(max_grace) after it started) only for a save that
        started after its signal, that is a selected process writing a file under them that it opened after the
        signal, with the file modified after the signal. Once such a save was seen, the rung keeps waiting while
        entries there appear, are renamed, or change size or modification time within I(progress_stall) seconds,
        or while a selected process still holds a file it opened after the signal (a save that pauses between
        writes for longer than I(progress_stall)).
      - Files that merely keep changing (a job ignoring the signal writing its log through a file it already held
        open) never extend a rung, and no rung is extended while the job is still training (see I(step_regex)).
    type: list
    elements: path
    default: []
  step_regex:
    description:
      - With I(tmux_session), a Python regular expression finding the job's step lines in the panes (its first group,
        else the first number in the hit, is the step). A job whose step counter advances more than one step past
        the one shown at a rung's signal is still training, not shutting down, so that rung gets no grace from
        I(progress_paths) (the periodic checkpoints of a job that ignores the signal are not a shutdown save).
      - Empty string to not read steps.
    type: str
    default: '\bstep\s+(\d+)'
  progress_stall:
    description:
      - Seconds without any change under I(progress_paths) (and no file there held open for writing by the job)
        after which the job counts as no longer progressing.
    type: float
    default: 10
  max_grace:
    description:
      - Longest a rung may wait, in seconds from when it was sent, while progress is seen.
    type: float
    default: 600
  lock_dir:
    description:
      - Directory of the run lock and of the last ladder's record (created when missing). One ladder at a time per
        container and selection (I(pids), I(pid_file), I(match), I(tmux_session), I(tmux_socket), I(container),
        I(gpu_devices)), so the module holds a C(flock) on C(<lock_dir>/training_stop-<key>.lock) from before its
        snapshot to its end (the kernel drops it when the module dies, however it dies), and writes the ladder's
        record (running, then its outcome) to C(<key>.json) next to it.
      - A run that finds the lock held waits for it, up to I(lock_timeout), then reports the ladder it waited for
        in RV(previous); past I(lock_timeout) it fails naming that run (its PID, when it started, its selection)
        and signals nothing. Check mode never waits; it notes a ladder running now.
    type: path
    default: /run/gpuops-repurpose
  lock_timeout:
    description:
      - Longest wait, in seconds, for another ladder on the same selection to end.
    type: float
    default: 300
  kill_timeout:
    description:
      - Longest wait for processes to vanish after SIGKILL. Survivors are then reported as unkillable.
    type: float
    default: 10
notes:
  - The keystroke rung is never trusted on its own; a C(^C) in a pane proves nothing. Success is judged only
    by the processes exiting (zombies count as exited; a zombie leader whose threads still run does not).
  - The launcher is always signalled before or with its workers, so a respawning launcher cannot restart them.
  - Processes the job starts after the snapshot (children of its live members) join before each later rung.
  - Once the ladder has started it finishes on its own when the connection that started the module dies (a dead SSH
    link, a killed C(pct exec)). A hangup (SIGHUP) or a closed output (SIGPIPE) is caught, never obeyed half-way, and
    the outcome is recorded under I(lock_dir). The next run reports it in RV(previous) and its notes (what was stopped,
    by which rung, when) instead of only saying that nothing was selected.
seealso:
  - module: gpuops.repurpose.gpu_free_wait
  - module: gpuops.repurpose.proxmox_ct_exec
"""

EXAMPLES = r"""
- name: Stop the DFlash training in tmux session dflash, never losing the checkpoint being written
  gpuops.repurpose.training_stop:
    tmux_session: dflash
    progress_paths:
      - /data/ckpt/dflash

- name: Only look (check mode prints the selection and the plan)
  gpuops.repurpose.training_stop:
    match: 'torchrun .*train_dflash\.py'
  check_mode: true

- name: Last rung from the Proxmox VE host, scoped to CT 200
  gpuops.repurpose.training_stop:
    container: 200
    match: 'train_dflash\.py'
    exclude:
      - '^(vim|nano|less) '
    ladder:
      - {signal: SIGTERM, timeout: 20}
      - {signal: SIGKILL, timeout: 10}

- name: A custom ladder
  gpuops.repurpose.training_stop:
    pid_file: /run/train/launcher.pid
    ladder:
      - {signal: INT, timeout: 60}
      - {signal: SIGTERM, timeout: 30, to: all}
      - {signal: 9, timeout: 5}
  register: stop

- name: Say which rung it took
  ansible.builtin.debug:
    msg: "stopped by {{ stop.stopped_by }} after {{ stop.elapsed }} s"
"""

RETURN = r"""
selected:
  description: The snapshot taken before the first signal, launchers first.
  returned: always
  type: list
  elements: dict
  sample:
    - {pid: 32244, ppid: 3012, pgid: 32244, sid: 3012, uid: 0, user: root, starttime: 912345, depth: 0,
       state: S, how: tmux_session, cmdline: "python3 -m torch.distributed.run --nproc-per-node 8 train.py"}
  contains:
    how:
      description: >-
        Why it was selected: C(pids), C(pid_file), C(match), C(tmux_session), C(container), C(gpu_holder) for roots and hits;
        C(child), C(group), C(session) for members reached from them.
      type: str
      returned: always
plan:
  description: The rungs that would be (or were) climbed, as text.
  returned: always
  type: list
  elements: str
  sample: ["Ctrl-C via tmux, wait 45s", "SIGTERM to every process, wait 30s", "SIGKILL to every process, wait 10s"]
rungs:
  description: One entry per rung climbed, with the signal, targets (PIDs, or tmux pane ids), when it was sent and
    when its wait ended (seconds since the module started), how long it waited, how much of that came from progress
    (C(extended_by)), which PIDs exited, which had already gone, how many were left (C(remaining)), and whether the
    wait was extended because the job held a file under I(progress_paths) open for writing (C(held_open)).
  returned: always
  type: list
  elements: dict
  sample:
    - {signal: SIGINT, via: tmux, to: launcher, timeout: 45, targets: ["%0"], sent_at: 0.012, ended_at: 3.525, waited: 3.51,
       extended_by: 0, exited: [32244, 32250], already_gone: [], errors: [], remaining: 0, held_open: false}
stopped_by:
  description: The rung after which no selected process was left, as C(SIGNAL) or C(SIGINT via tmux); null when nothing
    was selected or processes survived.
  returned: always
  type: str
  sample: SIGTERM
stopped_by_index:
  description: Index in the ladder of RV(stopped_by).
  returned: always
  type: int
  sample: 1
survivors:
  description: PIDs still running when the ladder ended (empty on success).
  returned: always
  type: list
  elements: int
unkillable:
  description: Processes that survived SIGKILL for I(kill_timeout), with state, wchan and command line.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, ppid: 1, state: D, wchan: nv_wait_event, cmdline: "python3 train.py", uid: 0}]
late_children:
  description: PIDs born to the job after the snapshot and stopped with it.
  returned: always
  type: list
  elements: int
gpu_holders:
  description: Processes holding I(gpu_devices) that were not selected (before the ladder), or that still hold
    them after it; empty on success.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 5120, name: python3, cmdline: "python3 -u train.py", gpu: 0, device: /dev/nvidia0}]
left_out:
  description: Processes I(match) hit but that are never selected through it, with the reason (a tmux server,
    a tmux/screen client, an interactive shell, an ancestor of a tmux pane's process).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4100, why: "a tmux server, which runs every session on the node",
            cmdline: "tmux new-session -d -s dflash torchrun --standalone train.py"}]
previous:
  description: The record of the last ladder climbed for this selection (by an earlier run, possibly one that was
    waited for, or one nobody watched because its ansible-playbook was killed), read before this run's snapshot.
    C(state) is C(done), C(failed), C(running) (still going; check mode only) or C(interrupted) (its process died
    part-way); with C(pid), C(started), C(finished), C(selected), C(stopped_by), C(survivors), C(msg), and what it
    stopped (C(stopped), C(stopped_count)), its C(rungs) (signal, when sent, how many exited) and C(hangups) (SIGHUP or
    SIGPIPE caught because its connection died; the ladder finished on its own). Null when there is none.
  returned: always
  type: dict
  sample: {state: done, pid: 4242, started: 1767225600.1, finished: 1767225671.9, selected: [5120, 5121],
           stopped_by: SIGKILL, survivors: [], msg: "", stopped_count: 2, hangups: [SIGHUP],
           stopped: [{pid: 5120, cmdline: "torchrun --nproc-per-node 8 train.py"}, {pid: 5121, cmdline: "python -u train.py"}],
           rungs: [{signal: SIGTERM, via: null, sent_at: 0.01, exited: 0}, {signal: SIGKILL, via: null, sent_at: 30.02, exited: 2}]}
lock_waited:
  description: Seconds this run waited for another ladder on the same selection.
  returned: always
  type: float
  sample: 0.0
notes:
  description: Things worth knowing about the selection (missing tmux session, PIDs not running, a reused PID).
  returned: always
  type: list
  elements: str
pidfd:
  description: Whether processes were held by pidfds (false means the polling fallback was used).
  returned: always
  type: bool
elapsed:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 3.62
"""

import fcntl  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import (  # noqa: E402
    DEFAULT_IGNORE_PROCESSES,
    classify_holders,
    scan_holders,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._ladder import (  # noqa: E402
    LadderError,
    ProcessSet,
    describe_process,
    fit_to_torchrun,
    parse_ladder,
    run_ladder,
    stat_children,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_environ  # noqa: E402
from ansible_collections.gpuops.repurpose.plugins.module_utils._runlock import (  # noqa: E402
    RunLock,
    RunLockError,
    describe_holder,
    describe_previous,
    lock_key,
    outcome_fields,
    shield_from_hangup,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._select import (  # noqa: E402
    SelectError,
    command_of,
    compile_regex,
    late_children,
    read_tpgid,
    snapshot,
    tmux_panes,
    tmux_send_keys_argv,
    tmux_step,
    torchrun_shutdown_timeout,
)

SELECTORS = ["pids", "pid_file", "match", "tmux_session", "container"]


def _user(uid):
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _member_dict(member):
    info = member.info
    return {
        "pid": info.pid, "ppid": info.ppid, "pgid": info.pgid, "sid": info.sid, "uid": info.uid,
        "user": _user(info.uid), "starttime": info.starttime, "state": info.state, "depth": member.depth,
        "how": member.how, "cmdline": command_of(info) or "[%s]" % info.comm,
    }


def _diff_lines(entries):
    return "".join("%d %s\n" % (e["pid"], e["cmdline"]) for e in entries)


def _check_numbers(module):
    for option in ("max_grace", "kill_timeout", "progress_stall"):
        value = module.params[option]
        if value is None or not math.isfinite(value) or value < 0:
            module.fail_json(msg="%s: must be a finite number of seconds >= 0, got %r" % (option, value))
    for pid in module.params["pids"] or []:
        if pid <= 0:
            module.fail_json(msg="pids: %r is not a PID; give positive integers" % pid)
    if module.params["container"] is not None and module.params["container"] < 100:
        module.fail_json(msg="container: %r is not a Proxmox VMID (100 or more)" % module.params["container"])
    if module.params["tmux_session"] is not None and not module.params["tmux_session"].strip():
        module.fail_json(msg="tmux_session: must be a session name, got an empty string")


def _gpu_holders(params, ignore_pids=()):
    """Processes holding params['gpu_devices'] in scope, one dict per pid (driver tools and ``ignore_pids`` left out)."""
    if not params["gpu_devices"]:
        return []
    found = scan_holders(params["gpu_devices"], exclude_pids={os.getpid()})
    counted, _ignored = classify_holders(found, None, DEFAULT_IGNORE_PROCESSES, params["container"])
    by_pid = {}
    for holder in counted:
        if holder.pid not in ignore_pids:
            by_pid.setdefault(holder.pid, {"pid": holder.pid, "name": holder.name, "cmdline": holder.cmdline,
                                           "gpu": holder.gpu, "device": holder.device})
    return [by_pid[pid] for pid in sorted(by_pid)]


def _holders_text(holders):
    return "; ".join("pid %(pid)d %(name)s on %(device)s: %(cmdline)s" % h for h in holders[:20]) + (
        " ... and %d more" % (len(holders) - 20) if len(holders) > 20 else "")


LOCK_KEY_OPTIONS = ("pids", "pid_file", "match", "tmux_session", "tmux_socket", "container", "gpu_devices")


def _selection_text(params):
    return ", ".join("%s=%s" % (option, params[option]) for option in LOCK_KEY_OPTIONS if params[option])


def _locked_elsewhere(lock):
    """Check mode's peek: is a ladder holding the lock now? (never waits, never takes it for long)"""
    try:
        fd = os.open(lock.lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def main():
    started = time.monotonic()
    module = AnsibleModule(
        argument_spec=dict(
            pids=dict(type="list", elements="int"),
            pid_file=dict(type="path"),
            match=dict(type="str"),
            tmux_session=dict(type="str"),
            tmux_socket=dict(type="path"),
            container=dict(type="int"),
            exclude=dict(type="list", elements="str", default=[]),
            allow_broad_match=dict(type="bool", default=False),
            ladder=dict(type="list", elements="dict"),
            progress_paths=dict(type="list", elements="path", default=[]),
            progress_stall=dict(type="float", default=10.0),
            step_regex=dict(type="str", default=r"\bstep\s+(\d+)"),
            gpu_devices=dict(type="list", elements="str", default=[]),
            gpu_holders=dict(type="str", default="fail", choices=["fail", "stop"]),
            max_grace=dict(type="float", default=600.0),
            kill_timeout=dict(type="float", default=10.0),
            lock_dir=dict(type="path", default="/run/gpuops-repurpose"),
            lock_timeout=dict(type="float", default=300.0),
        ),
        required_one_of=[SELECTORS],
        mutually_exclusive=[["tmux_session", "container"]],
        supports_check_mode=True,
    )
    params = module.params
    result = dict(changed=False, selected=[], plan=[], rungs=[], stopped_by=None, stopped_by_index=None,
                  survivors=[], unkillable=[], late_children=[], notes=[], left_out=[], gpu_holders=[], previous=None, lock_waited=0.0, pidfd=False,
                  elapsed=0.0)
    lock = RunLock(params["lock_dir"], lock_key({option: params[option] for option in LOCK_KEY_OPTIONS}))
    climbing = []  # set once this run recorded a ladder as running: its outcome is recorded at the end
    hangups = []  # r14c: signals caught while the ladder ran unattended (its connection died)

    def finish(failed_msg=None):
        result["elapsed"] = round(time.monotonic() - started, 4)
        if climbing:
            try:
                # r14c: outcome_fields keeps what was stopped and by which rungs, for a re-run to report
                lock.record(dict(climbing[0], state="failed" if failed_msg else "done", msg=failed_msg or "",
                                 finished=time.time(), survivors=result["survivors"],
                                 gpu_holders=[h["pid"] for h in result["gpu_holders"]], elapsed=result["elapsed"],
                                 **outcome_fields(result["selected"], result["rungs"], result["stopped_by"], hangups)))
            except OSError as exc:
                result["notes"].append("could not record this ladder's outcome in %s: %s" % (lock.state_path, exc))
        lock.release()
        if failed_msg:
            module.fail_json(msg=failed_msg, **result)
        module.exit_json(**result)

    _check_numbers(module)
    try:
        rungs = parse_ladder(params["ladder"], tmux=bool(params["tmux_session"]), kill_timeout=params["kill_timeout"])
        step_regex = compile_regex("step_regex", params["step_regex"]) if params["tmux_session"] and params["step_regex"] else None
        if module.check_mode:
            holder = lock.holder() if _locked_elsewhere(lock) else None
            if holder is not None:
                result["notes"].append("a ladder is running now for this selection: %s" % describe_holder(holder, time.time()))
        else:
            # before the snapshot: a second run sees the job as the first ladder left it
            lock.acquire(params["lock_timeout"], {"pid": os.getpid(), "started": time.time(),
                                                  "selection": _selection_text(params)})
            result["lock_waited"] = round(lock.waited, 3)
            if lock.waited_for:
                result["notes"].append("waited %.1fs for %s" % (lock.waited, lock.waited_for))
        result["previous"] = lock.previous()
        holders_before = _gpu_holders(params)
        selection = snapshot(
            pids=params["pids"] or [], pid_file=params["pid_file"], match=params["match"],
            tmux_session=params["tmux_session"], tmux_socket=params["tmux_socket"], container=params["container"],
            exclude=params["exclude"], allow_broad_match=params["allow_broad_match"],
            gpu_holders=[h["pid"] for h in holders_before] if params["gpu_holders"] == "stop" else [],
        )
    except (LadderError, SelectError, RunLockError) as exc:
        lock.release()
        module.fail_json(msg=str(exc), **result)
    members = sorted(selection.members.values(), key=lambda m: (m.depth, m.pid))
    shutdown_timeouts = [value for value in (
        torchrun_shutdown_timeout(m.info.cmdline, read_environ(m.pid)) for m in members if m.depth == 0) if value is not None]
    rungs, fit_notes = fit_to_torchrun(rungs, max(shutdown_timeouts) if shutdown_timeouts else None)
    result["plan"] = [rung.describe() for rung in rungs]
    result["notes"] = result["notes"] + selection.notes + fit_notes
    result["left_out"] = [{"pid": pid, "why": why, "cmdline": cmd} for pid, (why, cmd) in sorted(selection.left_out.items())]
    result["selected"] = [_member_dict(m) for m in members]
    if selection.refused:
        finish(selection.refused)
    unselected = [h for h in holders_before if h["pid"] not in selection.members]
    if unselected and not members:
        # never "nothing to do" while something holds the GPUs: with the launcher gone (killed -9, OOM)
        # these are its orphaned ranks, training on with their tmux pane closed
        result["gpu_holders"] = unselected
        finish("nothing was selected, but %d process(es) hold GPU devices (%s), likely the orphaned ranks of a "
               "launcher that is gone: %s. Nothing was signalled. Select them (pids, match), or set gpu_holders: "
               "stop to stop every GPU holder%s." % (
                   len(unselected), ", ".join(params["gpu_devices"]), _holders_text(unselected),
                   " in CT %d" % params["container"] if params["container"] else ""))
    if unselected:
        result["notes"].append("%d process(es) outside the selection hold GPU devices: %s" % (
            len(unselected), _holders_text(unselected)))
    if not members:
        previous = result["previous"]
        if previous and previous.get("state") in ("done", "failed", "interrupted"):
            # r14c: what the earlier run did, even if nobody saw it (its connection died mid-ladder)
            result["notes"].append("nothing selected now; " + describe_previous(previous))
        finish()
    if module._diff:
        result["diff"] = dict(before=_diff_lines(result["selected"]), after="")
    if module.check_mode:
        result["changed"] = True
        finish()

    roots = [m for m in members if m.depth == 0]
    root_pgids = {m.info.pgid for m in roots}
    for m in roots:
        tpgid = read_tpgid(m.pid)
        if tpgid > 0 and any(o.info.pgid == tpgid for o in members):
            root_pgids.add(tpgid)

    climbing.append({"pid": os.getpid(), "started": time.time(), "selection": _selection_text(params),
                     "selected": [m.pid for m in members]})
    # r14c: from here the ladder finishes on its own even if the connection that started it dies
    shield_from_hangup(hangups)
    try:
        lock.record(dict(climbing[0], state="running"))
    except OSError as exc:
        result["notes"].append("could not record this ladder in %s: %s" % (lock.state_path, exc))
    procs = ProcessSet()
    result["pidfd"] = procs.use_pidfd
    for m in members:
        procs.add(m.pid, m.info.starttime, m.depth, m.info.pgid)

    def send_keys():
        # panes are listed again: a pane may have closed since the snapshot
        panes, note = tmux_panes(params["tmux_session"], params["tmux_socket"])
        sent, errors = [], [note] if note else []
        for pane in panes:
            argv = tmux_send_keys_argv(pane.pane_id, "C-c", params["tmux_socket"])
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                errors.append("%s: %s" % (pane.pane_id, exc))
                continue
            if done.returncode == 0:
                sent.append(pane.pane_id)
            else:
                errors.append("%s: %s" % (pane.pane_id, done.stderr.decode(errors="replace").strip()))
        return sent, errors

    excludes = [compile_regex("exclude", pattern) for pattern in params["exclude"]]
    step_probe = None
    if step_regex is not None:

        def step_probe():
            return tmux_step(tmux_panes(params["tmux_session"], params["tmux_socket"])[0], step_regex, params["tmux_socket"])

    def find_children(parents):
        return late_children(stat_children(parents), selection.seen, excludes)

    try:
        outcome = run_ladder(
            rungs, procs, root_pgids=root_pgids,
            # Ctrl-C in a pane reaches only what runs in it: a job found otherwise (orphaned ranks
            # found as GPU holders, the pane left at its prompt) gets SIGINT to its launchers instead
            send_keys=send_keys if any(m.how == "tmux_session" for m in members) else None, progress_paths=params["progress_paths"],
            progress_stall=params["progress_stall"], max_grace=params["max_grace"], find_children=find_children,
            started=started, step_probe=step_probe,
        )
    finally:
        procs.close()
    result["changed"] = outcome.signalled
    result["rungs"] = [r.as_dict() for r in outcome.rungs]
    result["late_children"] = outcome.late_children
    if outcome.stopped_by is not None:
        rung = outcome.rungs[outcome.stopped_by]  # as climbed: a Ctrl-C rung with no pane left sent SIGINT itself
        result["stopped_by"] = rung.signal + (" via tmux" if rung.via == "tmux" else "")
        result["stopped_by_index"] = outcome.stopped_by
    elif not outcome.rungs:
        result["notes"].append("every selected process exited before the first signal")
    result["survivors"] = outcome.survivors
    if module._diff:
        left = [e for e in result["selected"] if e["pid"] in set(outcome.survivors)]
        result["diff"] = dict(before=_diff_lines(result["selected"]), after=_diff_lines(left))
    if outcome.survivors:
        details = [describe_process(pid) for pid in outcome.survivors]
        for entry in details:
            if entry["pid"] in outcome.denied:
                entry["error"] = outcome.denied[entry["pid"]]
        if outcome.denied:
            # not the host's fault: this module lacks the right to signal them
            result["unkillable"] = details
            finish("%d process(es) could not be signalled (%s); run the module as root (become: true) or as the "
                   "job's user" % (len(outcome.denied), "; ".join(
                       "pid %d: %s" % item for item in sorted(outcome.denied.items()))))
        killed = any(r.signal == "SIGKILL" for r in outcome.rungs)
        if killed:
            result["unkillable"] = details
            finish("%d process(es) survived SIGKILL for %ss (kill_timeout); the host needs attention "
                   "(processes stuck in the kernel, e.g. in the GPU driver): %s" % (
                       len(details), params["kill_timeout"],
                       "; ".join("pid %(pid)s state %(state)s wchan %(wchan)s: %(cmdline)s" % d for d in details)))
        finish("the ladder ended with %d process(es) still running (%s); add a SIGKILL rung or longer timeouts" % (
            len(details), ", ".join(str(d["pid"]) for d in details)))
    holders_after = _gpu_holders(params)
    if holders_after:
        result["gpu_holders"] = holders_after
        finish("the selected processes are gone, but %d process(es) outside the selection still hold GPU devices: "
               "%s" % (len(holders_after), _holders_text(holders_after)))
    finish()


if __name__ == "__main__":
    main()
