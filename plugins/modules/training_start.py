#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_start
short_description: Start a training job in tmux again and prove that it trains, within a bounded wait
version_added: 1.0.0
description:
  - The other half of M(gpuops.repurpose.training_stop). Starts a training job from the launch record the stop half
    wrote (O(record)), or from a command given by hand (O(argv), O(cwd), O(user)), in a tmux session, and waits until
    it proves that it trains; or fails with why, never retrying the launch.
  - The command is an argv handed to tmux as separate arguments, which tmux runs without a shell; nothing is ever
    joined into a shell string. O(overrides) replace the values of arguments by name.
  - When the session does not exist it is created (C(tmux new-session -d -s SESSION -n WINDOW -c CWD -e NAME=VALUE
    -- ARGV...)). When it exists (the operator's shell pane stays after the job stopped), the job starts in a new window
    of it (C(tmux new-window -t =SESSION:INDEX ...)), and the other windows are left alone.
  - The window keeps its pane when the job exits (C(remain-on-exit), set in the same tmux command that creates it, so
    even a job that fails at once leaves its last lines and exit status). Once they are read the window is closed;
    once the job has proved that it trains C(remain-on-exit) is turned off again, so the window closes with the job
    like one started by hand.
  - The proof, waited for at most O(timeout) seconds, is both of these at one sample. The job's processes (the launched
    process, its descendants, and its process group and session) hold every GPU of O(gpus), seen as open device files
    matching O(gpu_devices) (as C(fuser) would) or in the process list of NVML or C(nvidia-smi) (the sampling
    M(gpuops.repurpose.gpu_free_wait) uses; where their PIDs are this PID namespace's). And the pane shows a step line
    (O(step_regex)) whose step is above O(min_step).
  - When the job exits first, the module fails with its exit status and the last 30 lines of its pane. When the
    deadline passes, it fails saying what is missing and leaves the job running. Checking that the GPUs of a job that
    died are free again is the caller's (M(gpuops.repurpose.gpu_free_wait)).
  - A job whose exact argv already runs in any pane of the session is not started again (RV(already_running)); the
    proof is still waited for.
  - Needs only the Python standard library on the target, and C(tmux) 3.0 or later (3.2 to create a session with an
    environment); C(runuser) (util-linux) to start the job as another user than the module's.
author:
  - gpuops.repurpose maintainers (@gpuops)
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Reads the record, applies the overrides and reports the plan (RV(plan)); launches nothing. A job already
      running is looked at once, without waiting.
  diff_mode:
    support: full
    details: Shows the command running in the session before and after.
  idempotent:
    support: full
    details: When the same argv already runs in the session nothing is launched and the module reports no change.
  platform:
    support: full
    platforms: linux
    details: Linux only (reads C(/proc)).
requirements:
  - Linux (it reads C(/proc)).
  - C(tmux) 3.0 or later on the target (3.2 when it creates the session and passes an environment).
  - C(runuser) (util-linux) when the job runs as another user than the module.
options:
  record:
    description:
      - Path of a launch record written by M(gpuops.repurpose.training_stop) (by default
        C(/var/lib/gpuops/launch/<tmux_session>.json)), which holds the job's argv, working directory, user, tmux
        session, allow-listed environment, and the step of its newest whole checkpoint.
      - It must belong to root (or the module's user) and not be writable by group or others, since its command is run
        as its user.
      - A missing record, one that does not parse, or one for another session than O(tmux_session) is an error that says
        so; give the command by hand with O(argv), O(cwd) and O(user) instead.
      - Mutually exclusive with O(argv), O(cwd) and O(user).
    type: path
  record_dir:
    description:
      - Directory of the launch records; without O(record) and O(argv), the record read is
        C(<record_dir>/<tmux_session>.json), as M(gpuops.repurpose.training_stop) writes it (O(tmux_session) is then
        required).
    type: str
    default: /var/lib/gpuops/launch
  resume_arg:
    description:
      - The job's resume-from-checkpoint argument (for example V(--resume-from)). It is set to O(checkpoint), else to
        the record's newest whole checkpoint; replaced where the argv has it, appended where it does not (a first run
        has no resume flag). Without a checkpoint to resume from the argv is left as it is.
      - Empty string (the default) to never touch it.
    type: str
    default: ""
  checkpoint:
    description:
      - The checkpoint to resume from with O(resume_arg), instead of the record's. O(min_step) then defaults to the
        step in its name.
    type: str
  argv:
    description:
      - The command by hand, one list item per argument (never split or quoted again).
      - Requires O(cwd) and O(tmux_session).
    type: list
    elements: str
  cwd:
    description:
      - The job's working directory, with O(argv). It must exist (tmux would silently start the job elsewhere).
    type: path
  user:
    description:
      - The user the job runs as, with O(argv). Defaults to the module's user. Another user needs the module to run as
        root; the job then starts in that user's tmux server, through C(runuser -u USER --).
    type: str
  tmux_session:
    description:
      - The tmux session to start the job in (exact name; created when missing). Defaults to the record's; when both are
        given they must agree.
      - Required without O(record). C(:), C(.) and C(#) are refused (tmux rewrites or expands them).
    type: str
  tmux_socket:
    description:
      - Path of the tmux server socket (C(tmux -S)), when the session is not on the default server of the job's user.
    type: path
  tmux_window:
    description:
      - Name of the window the job starts in (C(#) refused).
    type: str
    default: train
  env:
    description:
      - Environment variables for the job, on top of the record's (these win), passed with C(tmux -e). The rest of the
        job's environment is the tmux server's.
    type: dict
    default: {}
  overrides:
    description:
      - Argument name to new value, for example C(--data) to V(/data/new). The value of C(--data X) and of
        C(--data=X) is replaced, wherever it occurs in the argv.
      - A name the argv does not have is an error listing the arguments it has, before anything is started; so is an
        argument that takes no value in the argv (a flag). Values are strings (numbers are taken as their text); an
        override never removes an argument.
    type: dict
    default: {}
  gpus:
    description:
      - The GPUs the job must hold, each an index (V(0)) or a UUID (V(GPU-...)) as C(nvidia-smi -L) prints them.
      - UUIDs need NVML or C(nvidia-smi) on the target; without them an index must have a device file among
        O(gpu_devices) (the index is the number in the device file's name, C(/dev/nvidiaN)).
      - Before the launch, another process holding one of them fails the module (a note in check mode).
      - Empty (the default) to not check GPUs.
    type: list
    elements: str
    default: []
  gpu_devices:
    description:
      - Shell-style patterns of the GPU device files whose holders are looked for (driver tools such as C(nvidia-smi)
        and C(nvidia-persistenced) do not count).
    type: list
    elements: str
    default: ['/dev/nvidia[0-9]*']
  step_regex:
    description:
      - A Python regular expression finding the job's step lines in its pane; its first group (else the first number in
        the hit) is the step.
      - Empty string to not wait for a step line.
    type: str
    default: '\bstep\s+(\d+)'
  min_step:
    description:
      - A step line counts only when its step is above this, so a line the job prints while loading its checkpoint
        (or an old line in the pane) is not taken for training.
      - Defaults to the step of the record's checkpoint, else the record's last step; without either any step line
        counts.
    type: int
  timeout:
    description:
      - Longest wait, in seconds, for the proof (and the bound of a wait for a job already running).
    type: float
    default: 300
  interval:
    description:
      - Seconds between two samples of the job's processes, GPUs and pane.
    type: float
    default: 1.0
notes:
  - The launch is never retried. A job that dies is reported with its exit status; one still not proven at the deadline
    is left running.
  - A tmux server the module starts lives on after it, in the login session of the connection; where C(logind) kills
    a session's processes at logout (C(KillUserProcesses=yes)), start the server beforehand or run the module through
    C(systemd-run).
seealso:
  - module: gpuops.repurpose.training_stop
  - module: gpuops.repurpose.gpu_free_wait
"""

EXAMPLES = r"""
- name: Start the DFlash training again from the record the stop wrote, on new data
  gpuops.repurpose.training_start:
    record: /var/lib/gpuops/launch/dflash.json
    overrides:
      --data: /data/dflash/round2
    gpus: ["0", "1"]
  register: start

- name: Say from which step it trains
  ansible.builtin.debug:
    msg: "training from step {{ start.first_step }} ({{ start.step_line }})"

- name: Only show what would be started
  gpuops.repurpose.training_start:
    record: /var/lib/gpuops/launch/dflash.json
  check_mode: true

- name: A command by hand, as another user, on a tmux server of its own
  gpuops.repurpose.training_start:
    argv: [torchrun, --nproc-per-node, "8", train.py, --config, configs/dflash.yaml]
    cwd: /home/lab/dflash
    user: lab
    tmux_session: dflash
    tmux_socket: /run/lab/tmux.sock
    env:
      CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7"
    gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]
    timeout: 600
"""

RETURN = r"""
record:
  description: The launch record the command came from (null when it was given by hand).
  returned: always
  type: dict
  sample: {tmux_session: dflash, argv: [torchrun, --nproc-per-node, "8", train.py, --data, /data/v1], cwd: /root/dflash,
           user: root, checkpoint: {path: /data/ckpt/ckpt-000700.pt, step: 700}, stopped_by: SIGINT via tmux}
checkpoint:
  description: The checkpoint O(resume_arg) was set to, with its C(step) when known; null when none.
  returned: always
  type: dict
  sample: {path: /data/ckpt/ckpt-000700.pt, step: 700, whole: true, kind: torch-zip}
argv:
  description: The argv launched (or that would be, or that already runs), overrides applied.
  returned: always
  type: list
  elements: str
  sample: [python3, /opt/lab/trainer/fake_trainer.py, --behaviour, stubborn, --nproc, "8", --data, /data/new]
launched:
  description: Whether this run started the job.
  returned: always
  type: bool
already_running:
  description: Whether the same argv already ran in a live pane of the session, so nothing was launched.
  returned: always
  type: bool
tree:
  description: The job's processes at the last sample (the launched process first, then its descendants and the
    members of its process group and session), empty when it was never seen running.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 5120, ppid: 812, cmdline: "torchrun --nproc-per-node 2 train.py"},
           {pid: 5133, ppid: 5120, cmdline: "python3 -u train.py --local-rank 0"}]
gpus_held:
  description: The GPUs of O(gpus) that the job's processes hold at the last sample, each with its C(index), C(uuid)
    (null when only device files were read), the C(pids) holding it and C(via) (C(device), C(backend)).
  returned: always
  type: list
  elements: dict
  sample: [{gpu: "0", index: 0, uuid: null, pids: [5133], via: [device]}]
first_step:
  description: The step of the first step line above O(min_step) in the pane; null when none was seen.
  returned: always
  type: int
  sample: 701
step_line:
  description: That step line, stripped ('' when none was seen).
  returned: always
  type: str
  sample: "step 701 | 21.4 Ktok/s | loss 1.231"
min_step:
  description: The step a step line had to be above (from O(min_step) or the record); null when any counted.
  returned: always
  type: int
  sample: 700
pane_tail:
  description: The last 30 lines of the job's pane, when the job exited or the wait timed out; empty on success.
  returned: always
  type: list
  elements: str
  sample: ["usage: train.py [-h] --data DATA", "train.py: error: the following arguments are required: --data",
           "Pane is dead (status 2, Thu Jan  1 00:00:00 2026)"]
exit_status:
  description: The exit status of a job that exited (negative when a signal killed it, as -signal); null while it runs
    or when tmux could not tell.
  returned: always
  type: int
  sample: 2
plan:
  description: What was (or would be) done, as text; the tmux command line exactly as run, shell-quoted for reading.
  returned: always
  type: list
  elements: str
  sample: ["tmux new-window -d -P -F '#{pane_id}\t#{pane_pid}\t#{window_id}' -t =dflash:1 -n train -c /root/dflash
            -e CUDA_VISIBLE_DEVICES=0,1 -- python3 train.py --data /data/new ';' set-option -w -t =dflash:1
            remain-on-exit on", "wait up to 300 s for GPU 0, 1 held by the job's processes and a step line above
            step 700"]
tmux_session:
  description: The session the job runs (or would run) in.
  returned: always
  type: str
  sample: dflash
pane:
  description: The tmux pane id of the job (null when nothing was launched or found).
  returned: always
  type: str
  sample: "%3"
notes:
  description: Things worth knowing (how GPUs were checked, several copies running, GPUs busy in check mode).
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds the module took.
  returned: always
  type: float
  sample: 4.21
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.start import (
    DEFAULT_GPU_DEVICES,
    DEFAULT_STEP_REGEX,
    start_training,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            record=dict(type="path"),
            record_dir=dict(type="str", default="/var/lib/gpuops/launch"),
            resume_arg=dict(type="str", default=""),
            checkpoint=dict(type="str"),
            argv=dict(type="list", elements="str"),
            cwd=dict(type="path"),
            user=dict(type="str"),
            tmux_session=dict(type="str"),
            tmux_socket=dict(type="path"),
            tmux_window=dict(type="str", default="train"),
            env=dict(type="dict", default={}),
            overrides=dict(type="dict", default={}),
            gpus=dict(type="list", elements="str", default=[]),
            gpu_devices=dict(type="list", elements="str", default=list(DEFAULT_GPU_DEVICES)),
            step_regex=dict(type="str", default=DEFAULT_STEP_REGEX),
            min_step=dict(type="int"),
            timeout=dict(type="float", default=300.0),
            interval=dict(type="float", default=1.0),
        ),
        required_together=[["argv", "cwd"]],
        mutually_exclusive=[["record", "argv"], ["record", "cwd"], ["record", "user"]],
        supports_check_mode=True,
    )
    exit_module(module, start_training(module.params, check_mode=module.check_mode, diff=module._diff))


if __name__ == "__main__":
    main()
