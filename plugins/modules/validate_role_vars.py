#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: validate_role_vars
short_description: Check a role's variables on the controller, one line per mistake with its fix
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - The first step of a role's validation pass, before anything connects to the host (its connection settings may be
    the mistake).
  - Checks the types and choices of the role's variables against its argument spec, as
    M(ansible.builtin.validate_argument_spec) does. A value that does not convert is said in one line with the
    variable, its value and the fix, for example C(stop_training_kill_timeout="sixty" is not a number (e.g. 60)).
    Any such error fails the task, listing all of them.
  - Then names the host's variables that start with O(prefix) followed by C(_) and a lowercase letter or digit but
    are not options of the role (C(PREFIX__) names are the role's own facts). Each comes with the known name
    closest to it, as the filter P(gpuops.repurpose.unknown_variables#filter) says it. A misspelt variable keeps
    its default silently otherwise.
  - Unknown names fail the task when O(strict) is true. Otherwise they are shown as a warning in the task's output
    (also without C(-v)) and the run goes on.
  - The messages name the role's switch as C(PREFIX_strict_vars); pass that variable as O(strict).
  - Runs on the controller only.
options:
  prefix:
    description: The role's variable prefix, without the trailing C(_) (V(stop_training) for C(stop_training_*)).
    type: str
    required: true
  strict:
    description: Fail on variable names the role does not know, instead of warning.
    type: bool
    default: false
  argument_spec:
    description:
      - The options to check against, as in M(ansible.builtin.validate_argument_spec).
      - Default the options of the C(main) entry point in the C(meta/argument_specs.yml) of the role that runs the
        task.
    type: dict
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.ACTION
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  action:
    support: full
  check_mode:
    support: full
    details: It only reads variables, so it runs the same in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
  platform:
    support: full
    platforms: all
seealso:
  - module: ansible.builtin.validate_argument_spec
  - plugin: gpuops.repurpose.unknown_variables
    plugin_type: filter
notes:
  - The roles C(gpuops.repurpose.stop_training) and C(gpuops.repurpose.sglang_datagen) run it first in their
    C(tasks/validate.yml).
"""

EXAMPLES = r"""
- name: Types, choices and names of every stop_training_* variable
  gpuops.repurpose.validate_role_vars:
    prefix: stop_training
    strict: "{{ stop_training_strict_vars }}"
  delegate_to: localhost
  become: false
"""

RETURN = r"""
argument_errors:
  description: One line per variable of the wrong type or value, with its fix (the lines of RV(msg) without its heading).
  returned: always
  type: list
  elements: str
unknown:
  description: One sentence per variable the role does not know, sorted by name.
  returned: always
  type: list
  elements: str
  sample:
    - stop_training_tmux_sesion is not a variable of this role (did you mean stop_training_tmux_session?); it is ignored
msg:
  description:
    - Why the task failed, a line per variable under a heading. Or, when unknown names only warn, the warning.
  returned: when a variable is wrong, or unknown
  type: list
  elements: str
  sample:
    - "stop_training: invalid variables, nothing was run:"
    - 'stop_training_kill_timeout="sixty" is not a number (e.g. 60): set stop_training_kill_timeout to a number (e.g. 60)'
"""
