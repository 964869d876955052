#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_units_info
short_description: Find the SGLang serving units' changes a killed run wrote but never applied, and those settled
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - The role C(gpuops.repurpose.sglang_datagen) writes the worker and router units and the workers' environment
    files, then reloads systemd and restarts what changed. A run killed in between leaves files nothing applied;
    the re-run's templates are C(ok), so the workers would keep their old command line for good.
  - Two facts tell. systemd holds a stale definition (C(NeedDaemonReload=yes)), so RV(reload) is true; and a
    running unit with a file newer than its main process was never restarted on it, so it is in RV(restart).
  - The same answer names the units already started and enabled (RV(settled)), so a run that changes nothing
    makes no call to systemd per worker.
  - Each worker C(sglang-datagen-worker@N.service) reads the template unit and C(HOME/workers/worker-N.env); the
    router C(sglang-datagen-router.service) its unit; both O(api_key_file) when given.
requirements:
  - systemd (C(systemctl show)) and C(/proc).
options:
  home:
    description: The role's home on the node (C(workers/worker-N.env) live under it).
    type: path
    required: true
  workers:
    description: The worker indexes of this node.
    type: list
    elements: int
    default: []
  router:
    description: Whether this node runs the router unit.
    type: bool
    default: false
  api_key_file:
    description: The API key's environment file the units read, when they take one.
    type: path
  unit_dir:
    description: Where the unit files are.
    type: path
    default: /etc/systemd/system
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.INFO_MODULE
attributes:
  platform:
    support: full
    platforms: linux
seealso:
  - module: gpuops.repurpose.datagen_pipeline_info
notes:
  - A unit whose main process cannot be read is never named for a restart on a guess; a missing file changes
    nothing.
"""

EXAMPLES = r"""
- name: Find unit changes a killed run wrote but never applied
  gpuops.repurpose.sglang_units_info:
    home: /opt/datagen
    workers: [0, 1, 2, 3]
    router: true
    api_key_file: /opt/datagen/api-key.env
  register: units

- name: Reload systemd when it holds a stale definition
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: units.reload
"""

RETURN = r"""
reload:
  description: Whether systemd holds a stale definition of any of the units.
  returned: success
  type: bool
restart:
  description: The running units with a unit or environment file newer than their main process.
  returned: success
  type: list
  elements: str
  sample: [sglang-datagen-worker@1.service]
settled:
  description: The units already active (or activating) and enabled, none of them to restart.
  returned: success
  type: list
  elements: str
  sample: [sglang-datagen-worker@0.service, sglang-datagen-router.service]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.units import UNIT_DIR, serving_units
from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            home=dict(type="path", required=True),
            workers=dict(type="list", elements="int", default=[]),
            router=dict(type="bool", default=False),
            api_key_file=dict(type="path"),
            unit_dir=dict(type="path", default=UNIT_DIR),
        ),
        supports_check_mode=True,
    )
    exit_module(module, serving_units(module.params))


if __name__ == "__main__":
    main()
