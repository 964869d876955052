#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: put_files
short_description: Write a group of files on the target, only those that differ in content or mode
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Puts several files on the target in one task and writes only those whose content or mode differs. One look on
    each side tells which. The wanted sha1 sums are read on the controller, the target's come from one
    M(ansible.builtin.find) over the group's directories.
  - A M(ansible.builtin.copy) or M(ansible.builtin.template) task per file costs a remote stat and more even when
    nothing changed (about 1.3 seconds each through C(pct exec)). With a file per worker that was most of a no-op
    run of the role C(gpuops.repurpose.sglang_datagen).
  - Each file that differs is handed to M(ansible.builtin.copy)'s own action, so its transfer, check mode, diff and
    C(no_log) behave as copy's. A source that is a directory, or a symbolic O(files[].mode), always goes to copy,
    which decides.
  - The whole action runs on the controller and calls modules on the target; this file only documents it.
options:
  files:
    description:
      - The files to put. Every O(files[].dest) appears once.
    type: list
    elements: dict
    required: true
    suboptions:
      dest:
        description: The absolute path of the file on the target. Its directory must exist (outside check mode).
        type: path
        required: true
      mode:
        description:
          - The file's mode, as for M(ansible.builtin.copy). Octal digits in quotes (V("0644")), or a number (an
            unquoted C(0644) in YAML is the number 420, the same mode). A symbolic mode always goes to copy.
          - Not compared when not given.
        type: raw
      content:
        description:
          - The file's text. A list or a mapping is written as JSON, as M(ansible.builtin.copy) does.
          - Exactly one of O(files[].content) and O(files[].src).
        type: raw
      src:
        description:
          - A file on the controller, found as M(ansible.builtin.copy) finds its C(src) (the role's C(files/), then
            the search path).
          - Exactly one of O(files[].content) and O(files[].src).
        type: path
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.ACTION
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  action:
    support: full
  check_mode:
    support: full
    details: In check mode nothing is written; RV(written) lists what would be.
  diff_mode:
    support: full
    details: The diffs of M(ansible.builtin.copy) for the files that differ, one per file.
  idempotent:
    support: full
  platform:
    support: full
    platforms: posix
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.find
notes:
  - A missing source, or a file given twice, fails the task before anything is written. A copy that fails does not
    stop the others; the task fails naming each file that was not written.
  - With C(no_log) the contents are not shown, as with M(ansible.builtin.copy).
"""

EXAMPLES = r"""
- name: Write the systemd units and a worker's environment file
  gpuops.repurpose.put_files:
    files:
      - dest: /etc/systemd/system/sglang-datagen.target
        mode: "0644"
        content: "{{ lookup('ansible.builtin.template', 'sglang-datagen.target.j2') }}"
      - dest: /opt/sglang-datagen/workers/worker-0.env
        mode: "0644"
        content: "CUDA_VISIBLE_DEVICES=0,1\n"
      - dest: /opt/sglang-datagen/requirements-datagen.txt
        mode: "0644"
        src: requirements-datagen.txt
  register: put

- name: Restart the workers when their units changed
  ansible.builtin.systemd_service:
    name: sglang-datagen.target
    state: restarted
  when: "'/etc/systemd/system/sglang-datagen.target' in put.written"
"""

RETURN = r"""
written:
  description: The O(files[].dest) written, in the order given (in check mode, those that would be).
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/sglang-datagen.target]
"""
