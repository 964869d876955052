#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: dataset_labels_info
short_description: Read the distinct labels of a training set where it lives
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Reads the distinct values of one field of a training set's rows, and whether some row has none. Only
    reading happens here; what the values mean is decided by the pipeline's own rules on the controller
    (C(python -m datagen check-mix)).
  - JSON Lines (C(.jsonl)) and JSON (C(.json), a list of rows) are read; Parquet (C(.parquet)) only where
    C(pyarrow) imports, and only its field's column. A directory means its C(.jsonl), C(.json) and C(.parquet)
    files, a glob its matches, as the pipeline reads them.
options:
  path:
    description: The training set (a file, a directory or a glob), as the pipeline resolves it on this host.
    type: str
    required: true
  field:
    description: The field that holds each row's label. Empty means the set has no labels.
    type: str
    default: ""
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.INFO_MODULE
attributes:
  platform:
    support: full
    platforms: posix
notes:
  - Never fails on what it reads. A set it cannot read (no file, a torn JSON file, Parquet without C(pyarrow),
    over 1000 distinct values) gives RV(read) false and RV(reason).
"""

EXAMPLES = r"""
- name: Read the existing training set's category labels on the node
  gpuops.repurpose.dataset_labels_info:
    path: /srv/datagen/existing/train.jsonl
    field: category
  register: labels
"""

RETURN = r"""
read:
  description: Whether the set could be read here.
  returned: always
  type: bool
values:
  description: The distinct values of O(field), sorted, as they are in the rows.
  returned: when read
  type: list
  elements: str
  sample: [chat, code, math]
unlabelled:
  description: Whether some row has no value (or not a string) for O(field); true when O(field) is empty.
  returned: when read
  type: bool
reason:
  description: Why the set could not be read.
  returned: when not read
  type: str
  sample: a Parquet file, and no pyarrow in this Python
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.labels import labels_info


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="str", required=True),
            field=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**labels_info(module.params))


if __name__ == "__main__":
    main()
