# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import typing as t

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._filter import as_filter
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._role_vars import unknown_variables

DOCUMENTATION = r"""
name: unknown_variables
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
requirements:
  - Nothing beyond ansible-core; runs on the controller.
short_description: Name the variables a role does not know, suggesting the one that was probably meant
description:
  - Compares the variable names given (usually the host's variables that start with the role's prefix) with the
    names a role knows (usually the options of its C(meta/argument_specs.yml)).
  - Returns one sentence per unknown name, sorted, C(NAME is not a variable of this role; it is ignored), with
    C( (did you mean KNOWN?)) when a known name is close enough to be a typo (Python's C(difflib), cutoff 0.6).
  - Runs on the controller.
positional: known
options:
  _input:
    description: The variable names given.
    type: list
    elements: str
    required: true
  known:
    description: The variable names the role knows.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Warn about misspelt variables of this role
  ansible.builtin.debug:
    msg: "{{ hostvars[inventory_hostname].keys() | select('match', '^stop_training_') | list
             | gpuops.repurpose.unknown_variables(known_names) }}"
  vars:
    known_names: "{{ (lookup('ansible.builtin.file', role_path ~ '/meta/argument_specs.yml') | from_yaml)
                     .argument_specs.main.options.keys() | list }}"

- name: One sentence per unknown name
  ansible.builtin.set_fact:
    # ['stop_training_tmux_sesion is not a variable of this role (did you mean stop_training_tmux_session?); it is ignored']
    unknown: "{{ ['stop_training_tmux_sesion'] | gpuops.repurpose.unknown_variables(['stop_training_tmux_session']) }}"
"""

RETURN = r"""
_value:
  description: One sentence per unknown name, sorted by name; empty when every name is known.
  type: list
  elements: str
"""


class FilterModule:
    """unknown_variables, run on the controller; the logic is in plugin_utils."""

    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {"unknown_variables": as_filter(unknown_variables)}
