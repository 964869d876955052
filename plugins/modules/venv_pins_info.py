#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: venv_pins_info
short_description: Say whether a Python venv already holds an install set exactly, so the installer may be skipped
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Reads the distributions the venv's own interpreter sees and judges the install command's requirement
    arguments against them.
  - RV(met) is true only when every requirement is a plain exact pin (C(name==version)), each such distribution is
    installed once at exactly that version, and C(pip check) finds every installed distribution's requirements
    satisfied. Then C(pip install) of the same set would resolve for seconds and change nothing.
  - Anything else is not met, and RV(msg) says why. That covers a range, extras, markers, a URL, an option
    line, a version equal but spelled otherwise, two copies of a distribution, a dependency gone missing, and a
    venv that cannot run (as on a fresh node).
options:
  python:
    description: The venv's interpreter (C(VENV/bin/python)).
    type: path
    required: true
  requirements:
    description:
      - The install command's requirement arguments, in order. C(-r FILE) (or C(--requirement FILE)) reads the
        file on the target; comments and blank lines are left out.
      - Any other option is kept as a line, so it is never taken for a pin (the set is then not met).
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.INFO_MODULE
attributes:
  platform:
    support: full
    platforms: posix
notes:
  - Never fails on what it finds; a venv it cannot read is not met.
  - The role C(gpuops.repurpose.sglang_datagen) skips its installer when the set is met.
"""

EXAMPLES = r"""
- name: Ask the venv whether it holds every pin already
  gpuops.repurpose.venv_pins_info:
    python: /opt/datagen/venv/bin/python
    requirements: [sglang-router==0.3.2, -r, /opt/datagen/requirements-datagen.txt]
  register: pins

- name: Install only when something is missing
  ansible.builtin.command:
    cmd: /opt/datagen/venv/bin/python -m pip install sglang-router==0.3.2 -r /opt/datagen/requirements-datagen.txt
  when: not pins.met
"""

RETURN = r"""
met:
  description: Whether every requirement is an exact pin installed once at its version, and C(pip check) is clean.
  returned: always
  type: bool
msg:
  description: One line that says why the set is met or not.
  returned: always
  type: str
  sample: "not met: numpy==2.3.5"
requirements:
  description: The requirement lines judged (the files read, comments left out).
  returned: always
  type: list
  elements: str
unmet:
  description: The requirement lines the venv does not hold exactly, in order.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.pins import pins_met


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            requirements=dict(type="list", elements="str", required=True),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**pins_met(module.params))


if __name__ == "__main__":
    main()
