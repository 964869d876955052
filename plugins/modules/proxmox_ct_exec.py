#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_ct_exec
short_description: Run one command inside a Proxmox VE LXC container with C(pct exec)
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Runs on the Proxmox VE host (its own ordinary connection) and executes one command inside container O(vmid)
    through C(pct exec), the way M(community.docker.docker_container_exec) does for Docker.
  - The command is an argument list handed to C(pct exec) without any host shell, so arguments arrive intact.
  - O(timeout) is enforced inside the container by C(timeout --kill-after), which signals the command's whole
    process group, so a command that runs too long is killed there (nothing is left running) and the task fails
    saying so.
  - O(creates)/O(removes) make it idempotent like M(ansible.builtin.command); they are checked inside the container.
  - O(ensure_running) starts a stopped container first and waits until commands run in it.
  - "A frozen container (a backup in suspend mode freezes it until the backup ends, while C(pct status) still
    says C(running)) fails at once, naming the freeze and its lock; nothing is run, where C(pct exec) would hang."
  - "Needs no root login and no full sudo on the host. Run as root, it runs C(pct) directly; run as any other
    user (the login user, without C(become)), it runs C(pct) through O(pct_become_method) (C(sudo -n)), so the
    one rule 'pveops ALL=(root) NOPASSWD: /usr/sbin/pct' (the rule the P(gpuops.repurpose.pct_ssh#connection)
    connection needs too) is enough. A missing rule fails at once, naming the rule to add."
requirements:
  - A Proxmox VE host with C(pct) (pve-container), run as root or through O(pct_become_method).
options:
  argv:
    description:
      - The program and its arguments, one list element each. Nothing is parsed by any shell.
      - Exactly one of O(argv) and O(command) is required.
    type: list
    elements: str
  command:
    description:
      - Shell text, run inside the container as O(executable) C(-c COMMAND), so pipes, redirections and
        variables work (and must be quoted by you).
    type: str
  executable:
    description: The shell inside the container that runs O(command).
    type: str
    default: /bin/sh
  chdir:
    description: Directory inside the container to run the command in.
    type: str
  env:
    description: Environment variables for the command (added to what C(pct exec) passes; see O(keep_env)).
    type: dict
    default: {}
  stdin:
    description: Text to feed to the command's stdin.
    type: str
  stdin_add_newline:
    description: Append a newline to O(stdin).
    type: bool
    default: true
  timeout:
    description:
      - Seconds the command may run. It is then sent SIGTERM, and SIGKILL O(kill_after) seconds later, together
        with every process in its process group, and the task fails.
      - Needs GNU C(timeout) (coreutils) inside the container.
    type: int
    default: 3600
  kill_after:
    description: Seconds between SIGTERM and SIGKILL when O(timeout) expires.
    type: int
    default: 5
  creates:
    description: A path inside the container; when it exists the command is not run.
    type: str
  removes:
    description: A path inside the container; when it does not exist the command is not run.
    type: str
  ensure_running:
    description:
      - Start the container when it is stopped, and wait (up to O(start_timeout)) until a command runs in it.
      - When V(false), a stopped container fails the task and nothing is run.
    type: bool
    default: false
  start_timeout:
    description: Seconds to wait for a started container to accept commands.
    type: int
    default: 120
  keep_env:
    description:
      - V(true)/V(false) pass C(--keep-env 1)/C(--keep-env 0) to C(pct exec). Unset passes nothing, which works on
        every release (Proxmox VE 8 and 9 keep the environment by default).
      - A host whose C(pct) is older than pve-container 5.0.9 (Proxmox VE 8.0 or 8.1 not updated) does not know the
        option; a set value fails there with a message saying so.
    type: bool
extends_documentation_fragment:
  - gpuops.repurpose.pct
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.PCT_GROUP
attributes:
  check_mode:
    support: full
    details: Reports the C(pct) command it would run; O(creates)/O(removes) are still checked (read-only).
  diff_mode:
    support: none
  platform:
    support: full
    platforms: linux
    details: The Proxmox VE host (needs C(pct); root, or a user with the sudo rule for C(pct) alone).
  idempotent:
    support: partial
    details: Only with O(creates) or O(removes); otherwise the command runs every time, like M(ansible.builtin.command).
notes:
  - To run many tasks inside a container instead of one command, use the P(gpuops.repurpose.pct_ssh#connection)
    connection plugin.
seealso:
  - plugin: gpuops.repurpose.pct_ssh
    plugin_type: connection
  - module: ansible.builtin.command
"""

EXAMPLES = r"""
# As a login user with only `pveops ALL=(root) NOPASSWD: /usr/sbin/pct` on the host: no become.
- name: Ask the GPUs inside CT200 what they hold
  gpuops.repurpose.proxmox_ct_exec:
    vmid: 200
    argv:
      - nvidia-smi
      - --query-gpu=index,memory.used
      - --format=csv,noheader,nounits
    timeout: 30
  register: gpus

- name: Shell text, with a working directory and environment, started if the container is down
  gpuops.repurpose.proxmox_ct_exec:
    vmid: 201
    command: tail -n 20 train.log | grep -c step
    chdir: /opt/lab/trainer
    env:
      LC_ALL: C.UTF-8
    ensure_running: true

- name: Only once
  gpuops.repurpose.proxmox_ct_exec:
    vmid: 200
    argv: [python3, -m, venv, /opt/sglang]
    creates: /opt/sglang/bin/python

# pct_path and pct_become_method once for every module that runs pct (the "pct" action group)
- name: Look at CT200 and CT201 through a pct that lives elsewhere
  module_defaults:
    group/gpuops.repurpose.pct:
      pct_path: /usr/local/sbin/pct
      pct_become_method: none
  block:
    - name: Is CT200 up
      gpuops.repurpose.proxmox_ct_exec:
        vmid: 200
        argv: ["true"]
        ensure_running: false

    - name: CT201's power state
      gpuops.repurpose.proxmox_ct_power:
        vmid: 201
        operation: status
"""

RETURN = r"""
rc:
  description: Exit status of the command (C(124)/C(137) when O(timeout) killed it).
  returned: when the command ran
  type: int
  sample: 0
stdout:
  description: Its standard output.
  returned: always
  type: str
  sample: "0, 97000\n"
stderr:
  description: Its standard error, kept apart from stdout.
  returned: always
  type: str
  sample: ""
stdout_lines:
  description: RV(stdout) split into lines.
  returned: always
  type: list
  elements: str
stderr_lines:
  description: RV(stderr) split into lines.
  returned: always
  type: list
  elements: str
cmd:
  description: The argument list run (or, in check mode, that would run) on the host (with the C(sudo -n) prefix when not root).
  returned: always
  type: list
  elements: str
  sample: [sudo, -n, /usr/sbin/pct, exec, "200", --, timeout, --kill-after=5s, 3600s, nvidia-smi]
ct_status:
  description: The container's status when the command ran (or when the module stopped).
  returned: always
  type: str
  sample: running
lock:
  description:
    - The container's config lock (C(pct config) C(lock:)) when the module looked, such as C(backup) during a
      backup; null without one.
  returned: always
  type: str
  sample: backup
frozen:
  description:
    - Whether the container's cgroup was frozen when the module looked (a backup in suspend mode freezes it;
      C(pct status) still says C(running)). The module runs nothing in a frozen container and fails at once.
  returned: always
  type: bool
started:
  description: Whether the module started the container (O(ensure_running)).
  returned: always
  type: bool
timed_out:
  description: Whether O(timeout) expired and the command was killed.
  returned: always
  type: bool
elapsed:
  description: Seconds the command ran.
  returned: always
  type: float
  sample: 0.213
msg:
  description: What happened, when the command did not run or failed.
  returned: sometimes
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.command import DEFAULT_SHELL
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.ct_exec import exec_in_container
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.host import PCT_ARGUMENT_SPEC


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            PCT_ARGUMENT_SPEC,
            argv=dict(type="list", elements="str"),
            command=dict(type="str"),
            executable=dict(type="str", default=DEFAULT_SHELL),
            chdir=dict(type="str"),
            env=dict(type="dict", default={}),
            stdin=dict(type="str"),
            stdin_add_newline=dict(type="bool", default=True),
            timeout=dict(type="int", default=3600),
            kill_after=dict(type="int", default=5),
            creates=dict(type="str"),
            removes=dict(type="str"),
            ensure_running=dict(type="bool", default=False),
            start_timeout=dict(type="int", default=120),
            keep_env=dict(type="bool"),
        ),
        mutually_exclusive=[("argv", "command")],
        required_one_of=[("argv", "command")],
        supports_check_mode=True,
    )
    exit_module(module, exec_in_container(module))


if __name__ == "__main__":
    main()
