# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import typing as t

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._filter import as_filter
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._role_vars import regex_errors

DOCUMENTATION = r"""
name: regex_errors
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
requirements:
  - Nothing beyond ansible-core; runs on the controller.
short_description: Say which regular expressions do not compile, naming the variable and the fix
description:
  - Compiles every pattern with Python's C(re), as the modules do on the target, on the controller before anything
    runs.
  - Takes a mapping of variable name to a pattern or a list of patterns; an entry of a list is named
    C(NAME[INDEX]). Empty patterns mean unset and are skipped.
  - Returns one sentence per pattern that does not compile, with the compiler's reason.
options:
  _input:
    description: Variable name to a pattern, or to a list of patterns.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Reject regexes that do not compile
  ansible.builtin.fail:
    msg: "{{ problems }}"
  when: problems | length > 0
  vars:
    problems: "{{ {'stop_training_match': stop_training_match, 'stop_training_exclude': stop_training_exclude}
                  | gpuops.repurpose.regex_errors }}"

- name: One sentence per pattern that does not compile
  ansible.builtin.set_fact:
    # ['stop_training_match="torchrun (" is not a valid regular expression (missing ), unterminated subpattern at
    #   position 9); fix it (Python re syntax, in YAML single quotes so backslashes stay)']
    problems: "{{ {'stop_training_match': 'torchrun ('} | gpuops.repurpose.regex_errors }}"
"""

RETURN = r"""
_value:
  description: One sentence per pattern that does not compile; empty when all do.
  type: list
  elements: str
"""


class FilterModule:
    """regex_errors, run on the controller; the logic is in plugin_utils."""

    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {"regex_errors": as_filter(regex_errors)}
