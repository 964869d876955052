# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import shlex
import typing as t

from ansible.errors import AnsibleFilterError

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

SECTIONS = ("global", "install", ":env:")
# pip's key -> uv's option; the keys whose value is a whitespace-separated list
OPTIONS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"),
           ("trusted-host", "--allow-insecure-host"), ("constraint", "--constraint"))
LISTS = {"extra-index-url", "find-links", "trusted-host", "constraint"}
TRUE = {"1", "true", "yes", "on"}


def pip_settings(text: str) -> dict[str, str]:
    """``{key: value}`` from ``pip config list`` lines (``section.key='value'``), as pip install sees them.

    pip config list prints its lines sorted, not in precedence order: an ``install`` setting overrides a
    ``global`` one, and the environment (``:env:``) overrides both, as in pip."""
    by_section: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in text.splitlines():
        name, sep, quoted = line.strip().partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        try:
            value = " ".join(shlex.split(quoted))
        except ValueError:
            value = quoted.strip("'\"")
        by_section[section][key] = value
    settings: dict[str, str] = {}
    for section in SECTIONS:  # lowest precedence first
        settings.update(by_section[section])
    return settings


def uv_index_args(text: t.Any) -> dict[str, t.Any]:
    """The ``uv pip install`` options (``args``) and environment (``env``) matching pip's configuration TEXT."""
    if not isinstance(text, str):
        raise AnsibleFilterError("_input: expected the text of 'pip config list', got %s" % type(text).__name__)
    settings = pip_settings(text)
    args: list[str] = []
    if settings.get("no-index", "").lower() in TRUE:
        args.append("--no-index")
    for key, option in OPTIONS:
        values = settings.get(key, "").split() if key in LISTS else [settings.get(key, "")]
        for value in values:
            if value:
                args += [option, value]
    return {"args": args, "env": {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}}


class FilterModule:
    """pip's index configuration for uv (runs on the controller)."""

    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {"uv_index_args": uv_index_args}
