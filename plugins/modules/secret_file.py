#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: secret_file
short_description: Create a random secret in a file once, atomically, mode 0600
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Writes a random URL-safe secret (Python's C(secrets.token_urlsafe)) to O(path) when O(path) does not exist,
    and leaves an existing file as it is.
  - The secret goes to a private temporary file (created exclusively, mode 0600) that is then linked to O(path).
    A link fails when O(path) exists, so two runs racing (two AWX slices) cannot make two secrets, and a reader
    never sees half of one. O(path)'s directory is created when missing.
  - The secret is never returned. Read it with M(ansible.builtin.slurp) under C(no_log) where it is needed.
options:
  path:
    description: The file that holds the secret.
    type: path
    required: true
  nbytes:
    description: The random bytes in the secret (its text is about 1.3 times as long).
    type: int
    default: 32
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Creates nothing; RV(ignore:changed) says a secret would be created.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: An existing file is kept whatever it holds.
  platform:
    support: full
    platforms: posix
seealso:
  - module: ansible.builtin.slurp
"""

EXAMPLES = r"""
- name: Create the API key once
  gpuops.repurpose.secret_file:
    path: /opt/datagen/api-key
  register: key_file

- name: Read it for this run
  ansible.builtin.slurp:
    src: /opt/datagen/api-key
  register: key
  no_log: true
"""

RETURN = r"""
path:
  description: The secret's file.
  returned: always
  type: str
  sample: /opt/datagen/api-key
created:
  description: Whether this run created the secret (false when it was there, or another run won the race).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.secret import ensure_secret
from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            nbytes=dict(type="int", default=32),
        ),
        supports_check_mode=True,
    )
    exit_module(module, ensure_secret(module.params, check_mode=module.check_mode))


if __name__ == "__main__":
    main()
