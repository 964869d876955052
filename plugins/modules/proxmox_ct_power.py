#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_ct_power
short_description: Query, start, stop, shut down or reboot a Proxmox VE LXC container with C(pct)
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Runs on the Proxmox VE host and runs one of C(pct status), C(pct start), C(pct stop), C(pct shutdown) or
    C(pct reboot) for container O(vmid), built by the same command builder as
    M(gpuops.repurpose.proxmox_ct_exec) and the P(gpuops.repurpose.pct_ssh#connection) connection.
  - "Needs no root login and no full sudo on the host: run as any user other than root, it runs C(pct) through
    O(pct_become_method) (C(sudo -n)), so the rule 'pveops ALL=(root) NOPASSWD: /usr/sbin/pct' is enough.
    A missing rule fails at once, naming the rule to add."
  - V(start) of a running and V(stop) or V(shutdown) of a stopped container change nothing.
  - "V(start), V(stop) and V(shutdown) end when the container has reached the state they lead to, not when C(pct)
    returns: for an HA-managed container C(pct) only queues the request with the HA manager and returns at once,
    so the module waits (within O(command_timeout)) and fails naming the HA request when the state did not come."
  - "When O(command_timeout) kills C(pct), the task C(pct) started in its own session may still be running (and
    holding the config lock); the failure says so and reports the state the container is in."
  - "A container with a config lock (C(lock: backup) while a backup runs) is not started, stopped, shut down or
    rebooted: the module fails naming the lock and what to do. C(pct) refuses the first three itself; a
    V(reboot) it does not refuse, but it would stop the container and then fail to start it."
  - Every run is bounded on the host by O(command_timeout) (C(timeout -s KILL)); for V(reboot) and V(shutdown)
    the default is longer than C(pct)'s own bound, so C(pct) gives up by itself first and is never left running.
requirements:
  - A Proxmox VE host with C(pct) (pve-container), run as root or through O(pct_become_method).
options:
  operation:
    description: The C(pct) subcommand to run.
    type: str
    choices: [status, start, stop, shutdown, reboot]
    default: status
  timeout:
    description:
      - For V(shutdown) and V(reboot), C(pct)'s own C(--timeout) (seconds to wait for the container to stop).
        Unset leaves C(pct)'s default (60 s).
      - C(pct) gives up after at most 2 x (O(timeout) + 5) seconds (C(lxc-stop) under its command timeout, then as
        long again waiting for the container's monitor) and fails with C(container did not stop).
    type: int
  command_timeout:
    description:
      - Seconds the C(pct) command may run on the host before it is killed (with its process group) and the task
        fails.
      - Default 2 x (O(timeout) + 5) + 30 for V(shutdown) and V(reboot), 300 otherwise.
    type: int
extends_documentation_fragment:
  - gpuops.repurpose.pct
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.PCT_GROUP
attributes:
  check_mode:
    support: full
    details: Queries the status (read-only) and reports the C(pct) command it would run.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: linux
    details: The Proxmox VE host (needs C(pct); root, or a user with the sudo rule for C(pct) alone).
  idempotent:
    support: partial
    details: V(status), V(start), V(stop) and V(shutdown) are; V(reboot) reboots every time.
notes:
  - M(gpuops.repurpose.proxmox_ct_exec) runs a command inside a container; this module changes its power state.
seealso:
  - module: gpuops.repurpose.proxmox_ct_exec
  - plugin: gpuops.repurpose.pct_ssh
    plugin_type: connection
"""

EXAMPLES = r"""
# As a login user with only `pveops ALL=(root) NOPASSWD: /usr/sbin/pct` on the host: no become.
- name: Reboot CT200, giving its shutdown 60 s
  gpuops.repurpose.proxmox_ct_power:
    vmid: 200
    operation: reboot
    timeout: 60
  delegate_to: pve1

- name: Wait until CT200 is running
  gpuops.repurpose.proxmox_ct_power:
    vmid: 200
  delegate_to: pve1
  register: ct
  until: ct.ct_status == 'running'
  retries: 60
  delay: 1
"""

RETURN = r"""
rc:
  description: Exit status of C(pct) (V(0) when nothing had to be run).
  returned: always
  type: int
  sample: 0
stdout:
  description: Its standard output.
  returned: always
  type: str
  sample: "status: running\n"
stderr:
  description: Its standard error.
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
  description: The argument list run (or that would run) on the host, with the C(sudo -n) prefix when not root.
  returned: always
  type: list
  elements: str
  sample: [sudo, -n, /usr/sbin/pct, reboot, "200", --timeout, "60"]
ct_status:
  description: The container's status after the operation (before it, in check mode).
  returned: always
  type: str
  sample: running
ha_request:
  description:
    - V(start) or V(stop) when C(pct) only queued the request with the HA manager (an HA-managed container, for
      which C(pct) prints C(Requesting HA start for CT 200) and returns at once); the module then waited for the
      state. Null otherwise.
  returned: when C(pct) ran
  type: str
  sample: start
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
timed_out:
  description: Whether O(command_timeout) expired and C(pct) was killed.
  returned: always
  type: bool
elapsed:
  description: Seconds C(pct) ran.
  returned: always
  type: float
  sample: 2.31
msg:
  description: What happened, when nothing was run or it failed.
  returned: sometimes
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.ct_power import OPERATIONS, power
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.host import PCT_ARGUMENT_SPEC


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            PCT_ARGUMENT_SPEC,
            operation=dict(type="str", default="status", choices=list(OPERATIONS)),
            timeout=dict(type="int"),
            command_timeout=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    exit_module(module, power(module))


if __name__ == "__main__":
    main()
