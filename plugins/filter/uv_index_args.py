# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import typing as t

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._filter import as_filter
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._uv_index import uv_index_args

DOCUMENTATION = r"""
name: uv_index_args
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
requirements:
  - Nothing beyond ansible-core; runs on the controller.
short_description: Turn pip's index configuration into the same options for C(uv pip install)
description:
  - C(uv) does not read C(pip.conf) or C(PIP_*) variables, so on a node with a package mirror configured for pip,
    C(uv pip install) would resolve against PyPI instead. This filter reads what C(pip config list) prints and
    returns the C(uv) options that select the same indexes and files.
  - Only the C(global), C(install) and environment (C(:env:)) settings apply, as for C(pip install), with pip's
    precedence. An C(install) setting overrides a C(global) one, and the environment overrides both.
  - "Mapped keys: C(index-url) to C(--index-url), C(extra-index-url) to C(--extra-index-url) (each URL),
    C(find-links) to C(--find-links), C(no-index) to C(--no-index), C(trusted-host) to C(--allow-insecure-host),
    C(constraint) to C(--constraint). C(cert) is returned as C(SSL_CERT_FILE) in RV(_value.env): C(uv) reads
    certificates from there."
options:
  _input:
    description: The output of C(python -m pip config list).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Read pip's configuration in the venv
  ansible.builtin.command: /opt/venv/bin/python -m pip config list
  register: pip_config
  changed_when: false

- name: Install with uv against the same indexes
  ansible.builtin.command:
    argv: "{{ ['uv', 'pip', 'install', '--python', '/opt/venv/bin/python'] + uv.args + ['sglang==0.5.23'] }}"
  environment: "{{ uv.env }}"
  vars:
    uv: "{{ pip_config.stdout | gpuops.repurpose.uv_index_args }}"
"""

RETURN = r"""
_value:
  description: The C(uv) options and environment.
  type: dict
  contains:
    args:
      description: Options for C(uv pip install), in a fixed order.
      type: list
      elements: str
    env:
      description: Environment for C(uv) (C(SSL_CERT_FILE) when pip has a C(cert)).
      type: dict
"""


class FilterModule:
    """uv_index_args, run on the controller; the logic is in plugin_utils."""

    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {"uv_index_args": as_filter(uv_index_args)}
