#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: datagen_pipeline_info
short_description: Read the datagen pipeline unit's state and how far the pipeline got past its start-up
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Reads C(datagen-pipeline.service) as C(systemctl show) tells it (C(ActiveState), C(SubState), C(Result),
    C(NRestarts)) and C(WORK_DIR/pipeline.ready.json), which the pipeline writes once it passed its start-up.
  - The role C(gpuops.repurpose.sglang_datagen) polls it after it starts the pipeline unit, until the pipeline
    says it works or the unit fails.
requirements:
  - systemd (C(systemctl show)).
options:
  work_dir:
    description: The pipeline's C(work_dir), where C(pipeline.ready.json) is.
    type: path
    required: true
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.INFO_MODULE
attributes:
  platform:
    support: full
    platforms: linux
seealso:
  - module: gpuops.repurpose.sglang_units_info
"""

EXAMPLES = r"""
- name: Wait until the pipeline works (or fails), two minutes at most
  gpuops.repurpose.datagen_pipeline_info:
    work_dir: /srv/datagen/work
  register: pipeline
  retries: 60
  delay: 2
  until: >-
    pipeline.ready.stage | default('') == 'generate'
    or pipeline.unit.ActiveState | default('') == 'failed'
"""

RETURN = r"""
unit:
  description: The unit's properties as C(systemctl show) gives them.
  returned: success
  type: dict
  sample: {ActiveState: activating, SubState: start, Result: success, NRestarts: "0"}
ready:
  description: C(pipeline.ready.json) (the stage, why, the pid and the time), or an empty dict when it is not there
    yet or not a JSON object.
  returned: success
  type: dict
  sample: {stage: generate, why: first responses written, pid: 4242, time: 1796112062.5}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.units import pipeline_info
from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(work_dir=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    exit_module(module, pipeline_info(module.params))


if __name__ == "__main__":
    main()
