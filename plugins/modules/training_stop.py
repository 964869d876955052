#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_stop
short_description: Stop a training job with a bounded stop-verify-kill ladder
version_added: 1.0.0
description:
  - Selects one training job (a torchrun-like launcher and all its workers) and stops it by climbing a
    ladder of signals, judging every rung only by whether the processes have exited.
  - Before the first signal it snapshots the whole process tree of the selected roots (PID plus start
    time), including workers in other sessions and process groups, and holds every process by a pidfd,
    so a reused PID can never be signalled.
  - The default ladder is Ctrl-C through tmux (with O(tmux_session)) or SIGINT to the launcher, 45 s;
    then SIGTERM to every process of the snapshot, 30 s; then SIGKILL, O(kill_timeout). SIGCONT to every
    process of the snapshot follows every catchable signal, so a stopped process can act on it (and on the
    SIGTERM its launcher forwards).
  - While files under O(progress_paths) keep changing (a checkpoint being written), a rung keeps waiting
    past its timeout, up to O(max_grace).
  - Never signals PID 1, a container's init, this module's own process or its ancestors, kernel threads,
    or anything matching O(exclude). A O(match) that hits several unrelated jobs is refused unless
    O(allow_broad_match=true).
  - Every wait is bounded. Processes that survive SIGKILL for O(kill_timeout) are reported as
    RV(unkillable) with state and wchan, and the module fails (the host needs attention).
  - Runs inside the container (for example through P(gpuops.repurpose.pct_ssh#connection)) or on the Proxmox VE
    host scoped with O(container). Needs only the Python standard library on the target.
author:
  - gpuops.repurpose maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Reports the selection and the plan (RV(plan)); sends nothing.
  diff_mode:
    support: full
    details: Shows the selected running processes before, and those left after.
  idempotent:
    support: full
    details: Once the job is gone nothing is selected and the module reports no change.
  platform:
    support: full
    platforms: linux
    details: Linux only (reads C(/proc)). pidfds need Linux 5.3 and Python 3.9; elsewhere it falls back to 20 ms polling.
requirements:
  - Linux (it reads C(/proc) and uses pidfds where the kernel has them).
  - C(tmux) on the target for O(tmux_session).
  - C(pct) on the Proxmox VE host for O(container).
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
        (a terminal's prompt), or an ancestor of a tmux pane's process is never selected through O(match); it is
        listed in RV(left_out) with the reason. Anchor the regex to the program run (for example
        V(^(\\S*/\)?torchrun\\s)) rather than searching anywhere in a command line.
      - If the hits form several unrelated process trees (different programs, users or parents; for
        example V(python) on a host running networkd-dispatcher, or an editor with the training script
        open) the module fails listing them, unless O(allow_broad_match=true). Several trees of the same
        program, user and parent count as one job (the reparented workers of a dead launcher).
    type: str
  tmux_session:
    description:
      - Name of a tmux session (exact match); every process tree under its panes is selected.
      - When a pane's process is an interactive shell (C(bash), C(-zsh), no script or C(-c)), the shell is left
        running and what runs in it is the job (the shell ignores SIGINT and SIGTERM, and killing it would close
        the pane and its scrollback).
      - A missing session or tmux server selects nothing (not an error).
      - Enables the rung with O(ladder[].via=tmux), which sends Ctrl-C to each pane.
      - Cannot be combined with O(container), because the container's tmux server is not reachable from the host.
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
        O(allow_broad_match=true).
    type: int
  exclude:
    description:
      - Regular expressions; a process whose command line matches any of them is never selected.
    type: list
    elements: str
    default: []
  allow_broad_match:
    description:
      - Stop everything O(match) hits even when the hits are several unrelated jobs.
    type: bool
    default: false
  ladder:
    description:
      - The rungs, in order, tried until no selected process is left. Success is judged only by the processes
        exiting.
      - A SIGKILL rung waits at most O(kill_timeout).
      - "Default: C([{signal: SIGINT, timeout: 45, via: tmux}, {signal: SIGTERM, timeout: 30}, {signal: SIGKILL, timeout: 10}])
        (without O(ladder[].via) when O(tmux_session) is unset; the SIGKILL rung waits O(kill_timeout))."
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
    suboptions:
      signal:
        description:
          - Signal of this rung, a name (V(SIGINT), V(INT)) or a number (V(9)). Required in every rung.
          - SIGSTOP and other signals that do not end a process are refused.
        type: raw
      timeout:
        description:
          - Seconds to wait for the selected processes to exit after this rung (a finite number >= 0). Required in
            every rung.
        type: raw
      via:
        description:
          - V(tmux) sends Ctrl-C to every pane of O(tmux_session) instead of a signal (so O(tmux_session) must be
            set, and the rung's signal must be SIGINT). Success is still judged by the processes, never by the pane.
        type: str
        choices: [tmux]
      to:
        description:
          - V(launcher) signals the roots and their process groups (what Ctrl-C in their terminal reaches), V(all)
            every process of the snapshot, launchers first.
          - Defaults to V(launcher) for SIGINT and V(all) otherwise.
        type: str
        choices: [launcher, all]
  gpu_devices:
    description:
      - Shell-style patterns of GPU device files (for example V(/dev/nvidia*)). Processes holding one of them open
        (a C(fuser)-like scan of C(/proc), scoped to O(container) when set; C(nvidia-smi), C(nvidia-persistenced)
        and other driver tools do not count) are what keeps the GPUs busy.
      - With O(gpu_holders=stop) they join the selection as roots (C(how=gpu_holder)), with everything that
        belongs to them; this finds the ranks of a job whose launcher is gone (killed with C(-9), OOM), which keep
        training with their tmux pane closed and match no launcher regex.
      - Whatever O(gpu_holders) says, the module fails naming them when nothing was selected but processes hold
        a GPU device (before any signal), or when any holder remains after the ladder; it never reports success,
        or "nothing to do", while the GPUs are held.
      - Empty list (the default) to not look.
    type: list
    elements: str
    default: []
  gpu_holders:
    description:
      - What to do with processes holding O(gpu_devices) that no other selector selected. V(fail) never signals
        them, the module fails naming them (before any signal when nothing else was selected, else after the
        ladder). V(stop) selects them.
    type: str
    choices: [fail, stop]
    default: fail
  progress_paths:
    description:
      - Files or directories (searched recursively, following symlinks, up to 10000 entries, newest first), typically
        the checkpoint directory, where a save started after a signal shows.
      - A rung other than SIGKILL waits past its timeout (up to O(max_grace) after it started) only for a save that
        started after its signal, that is a selected process writing a file under them that it opened after the
        signal, with the file modified after the signal. Once such a save was seen, the rung keeps waiting while
        entries there appear, are renamed, or change size or modification time within O(progress_stall) seconds,
        or while a selected process still holds a file it opened after the signal (a save that pauses between
        writes for longer than O(progress_stall)).
      - Files that merely keep changing (a job ignoring the signal writing its log through a file it already held
        open) never extend a rung, and no rung is extended while the job is still training (see O(step_regex)).
    type: list
    elements: path
    default: []
  step_regex:
    description:
      - With O(tmux_session), a Python regular expression finding the job's step lines in the panes (its first group,
        else the first number in the hit, is the step). A job whose step counter advances more than one step past
        the one shown at a rung's signal is still training, not shutting down, so that rung gets no grace from
        O(progress_paths) (the periodic checkpoints of a job that ignores the signal are not a shutdown save).
      - Empty string to not read steps.
    type: str
    default: '\bstep\s+(\d+)'
  progress_stall:
    description:
      - Seconds without any change under O(progress_paths) (and no file there held open for writing by the job)
        after which the job counts as no longer progressing.
    type: float
    default: 10
  max_grace:
    description:
      - Longest a rung may wait, in seconds from when it was sent, while progress is seen.
    type: float
    default: 600
  checkpoint_patterns:
    description:
      - Shell-style patterns of the checkpoint names among the entries of O(progress_paths) (files, or directories
        for a torch DCP or Hugging Face C(save_pretrained) checkpoint).
      - The newest one that is whole is returned as RV(checkpoint), judged without torch (see RV(checkpoint)); newer
        ones that are not whole are listed in RV(checkpoint_skipped) with the reason.
    type: list
    elements: str
    default: ['*']
  record_dir:
    description:
      - Directory of the launch records (created root-only, mode 0700). When the ladder stops a job found through
        O(tmux_session), the module writes C(<record_dir>/<tmux_session>.json) (mode 0600, atomically) for
        M(gpuops.repurpose.training_start). It holds the launcher's argv, working directory and user, the tmux
        session and window, an allow-listed part of its environment (see O(record_env)), the last step line, the
        newest whole checkpoint, and when and by which rung the job was stopped.
      - A run that stops nothing keeps the record there is. Check mode writes nothing.
      - Empty string to write no record.
    type: str
    default: /var/lib/gpuops/launch
  record_env:
    description:
      - Names (or shell-style patterns) of environment variables of the launcher to keep in the launch record, on
        top of C(CUDA_VISIBLE_DEVICES), C(NCCL_*), C(MASTER_*), C(OMP_NUM_THREADS), C(PYTHONPATH), C(PATH) and
        C(VIRTUAL_ENV).
      - A name that looks like a secret (containing C(TOKEN), C(KEY), C(SECRET) or C(PASSWORD), in any case) is
        never written, whatever this list says.
    type: list
    elements: str
    default: []
  lock_dir:
    description:
      - Directory of the run lock and of the last ladder's record (created when missing). One ladder at a time per
        container and selection (O(pids), O(pid_file), O(match), O(tmux_session), O(tmux_socket), O(container),
        O(gpu_devices)), so the module holds a C(flock) on C(<lock_dir>/training_stop-<key>.lock) from before its
        snapshot to its end (the kernel drops it when the module dies, however it dies), and writes the ladder's
        record (running, then its outcome) to C(<key>.json) next to it.
      - A run that finds the lock held waits for it, up to O(lock_timeout), then reports the ladder it waited for
        in RV(previous); past O(lock_timeout) it fails naming that run (its PID, when it started, its selection)
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
    the outcome is recorded under O(lock_dir). The next run reports it in RV(previous) and its notes (what was stopped,
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
        Why it was selected: V(pids), V(pid_file), V(match), V(tmux_session), V(container), V(gpu_holder) for roots and hits;
        V(child), V(group), V(session) for members reached from them.
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
    wait was extended because the job held a file under O(progress_paths) open for writing (C(held_open)).
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
  description: Processes that survived SIGKILL for O(kill_timeout), with state, wchan and command line.
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
  description: Processes holding O(gpu_devices) that were not selected (before the ladder), or that still hold
    them after it; empty on success.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 5120, name: python3, cmdline: "python3 -u train.py", gpu: 0, device: /dev/nvidia0}]
left_out:
  description: Processes O(match) hit but that are never selected through it, with the reason (a tmux server,
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
  description: Seconds this run waited for another ladder on the same selection; 0 when none held the lock.
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
checkpoint:
  description:
    - The newest whole checkpoint among the entries of O(progress_paths) that match O(checkpoint_patterns); null
      when there is none (or no O(progress_paths)).
    - Judged without torch. A C(torch.save) zip archive whose central directory reads and whose members fit the
      file; a safetensors file whose header parses and whose tensors fit the file; a torch DCP directory
      (C(.metadata) and every shard it names); a Hugging Face C(save_pretrained) directory with every file its index
      names; other checkpoint directories with every file in them whole. Files of other formats count as whole
      unless partial.
    - Partial, and never the last checkpoint, are empty files, names ending C(.tmp), C(.partial) or C(.incomplete)
      (or holding C(.tmp.), or starting C(tmp-checkpoint-)), and, while a process of the job may still write
      (check mode, or survivors), files modified in the last two seconds.
    - Newest means the highest step in the name (the number after C(step), else the last number), then the
      modification time (one job's steps only grow).
  returned: always
  type: dict
  sample: {path: /data/ckpt/dflash/ckpt-step000700.pt, whole: true, kind: torch-zip, why: "", step: 700,
           mtime: 1767225600.5, size: 1048576}
checkpoint_skipped:
  description: Checkpoints newer than RV(checkpoint) that are not whole, newest first, each with C(why).
  returned: always
  type: list
  elements: dict
  sample: [{path: /data/ckpt/dflash/ckpt-step000710.pt, whole: false, kind: torch-zip, step: 710,
            why: "truncated: no zip end record at the end of the file (524288 bytes)"}]
launch_record:
  description: The launch record this run wrote (see O(record_dir)), with its C(path); null when it wrote none.
  returned: always
  type: dict
  sample: {path: /var/lib/gpuops/launch/dflash.json, tmux_session: dflash, tmux_window: train,
           argv: [torchrun, --nproc-per-node, "8", train.py, --data, /data/train.jsonl], cwd: /root/dflash,
           user: root, uid: 0, env: {CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"}, step_line: "step 700 | loss 1.23",
           step: 700, checkpoint: {path: /data/ckpt/dflash/ckpt-step000700.pt, step: 700}, checkpoint_skipped: [],
           stopped_at: 1767225671.9, stopped_by: SIGINT via tmux, version: 1}
elapsed:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 3.62
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.job import SELECTORS, stop_job

# type raw: a signal is a name or a number, and a timeout given as a bool or a word gets the ladder's own error
# (naming the rung and the fix) rather than being read as 1.0; _stop.ladder.parse_ladder checks both
RUNG_OPTIONS = dict(
    signal=dict(type="raw"),
    timeout=dict(type="raw"),
    via=dict(type="str", choices=["tmux"]),
    to=dict(type="str", choices=["launcher", "all"]),
)


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
            ladder=dict(type="list", elements="dict", options=RUNG_OPTIONS),
            progress_paths=dict(type="list", elements="path", default=[]),
            progress_stall=dict(type="float", default=10.0),
            step_regex=dict(type="str", default=r"\bstep\s+(\d+)"),
            gpu_devices=dict(type="list", elements="str", default=[]),
            gpu_holders=dict(type="str", default="fail", choices=["fail", "stop"]),
            max_grace=dict(type="float", default=600.0),
            kill_timeout=dict(type="float", default=10.0),
            lock_dir=dict(type="path", default="/run/gpuops-repurpose"),
            lock_timeout=dict(type="float", default=300.0),
            checkpoint_patterns=dict(type="list", elements="str", default=["*"]),
            record_dir=dict(type="str", default="/var/lib/gpuops/launch"),
            record_env=dict(type="list", elements="str", default=[]),
        ),
        required_one_of=[SELECTORS],
        mutually_exclusive=[["tmux_session", "container"]],
        supports_check_mode=True,
    )
    exit_module(module, stop_job(module.params, check_mode=module.check_mode, diff=module._diff, started=started))


if __name__ == "__main__":
    main()
