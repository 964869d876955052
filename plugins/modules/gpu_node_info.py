#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_node_info
short_description: Read a GPU node's GPUs, driver, glibc, Python, disk, model and ports, and say what it misses
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Reads, without changing anything, what decides whether a CUDA build can run on the node. The GPUs and the
    NVIDIA driver version (through C(nvidia-smi), bounded by O(timeout)); the glibc the module's interpreter runs
    on; the version of the interpreter O(python_path), and whether it can create a venv. Optionally the free space
    for O(free_space), the files of a model directory O(model_path), and who listens on O(ports).
  - Given requirements (O(cuda_major), O(glibc), O(python_min), O(python_max), and the options above), RV(problems) lists each one the
    node does not meet, in words that name the fact and the requirement. The module itself does not fail on a
    problem. The play decides, for example by an C(ansible.builtin.assert) naming its own variables, before it
    stops anything.
  - A driver runs the toolkits of its own CUDA version and older. The oldest driver per CUDA major is NVIDIA's
    "minor version compatibility" minimum (CUDA 13 needs r580, CUDA 12 r525.60.13, CUDA 11 r450.80.02).
  - Standard library only; runs in a container whose GPUs are passed through (the driver is the host's).
requirements:
  - Linux (it reads C(/proc) and C(/proc/net/tcp)).
  - C(nvidia-smi) on the target for the GPU facts (without it they are reported missing, never a failure).
options:
  nvidia_smi_path:
    description: C(nvidia-smi) to run, a path or a name looked up on C(PATH).
    type: str
    default: nvidia-smi
  timeout:
    description: Seconds one command may take (a hung driver makes C(nvidia-smi) hang).
    type: float
    default: 30
  cuda_major:
    description:
      - The CUDA major version the software to be run was built for (SGLang 0.5.23's torch 2.14.1 is a CUDA 13
        build). A driver too old for it is a problem, and so is a driver that cannot be read.
      - Not given, the driver is read and reported but not judged.
    type: int
  glibc:
    description: The oldest glibc the software's wheels are built for (their C(manylinux_X_Y) tag), as C(X.Y).
    type: str
  python_path:
    description:
      - The interpreter that will create the software's venv; its version is read and judged against
        O(python_min) and O(python_max), and it must be able to create a venv (C(venv) and C(ensurepip)).
    type: path
  python_min:
    description: The oldest Python (C(major.minor)) the software has wheels for.
    type: str
  python_max:
    description: The newest Python (C(major.minor)) the software has wheels for.
    type: str
  model_path:
    description:
      - A model directory on the node, as C(transformers)' C(from_pretrained) reads it. It must hold C(config.json),
        a tokenizer (C(tokenizer.json), C(tokenizer.model), or C(vocab.json) with C(merges.txt)) and weights
        (C(*.safetensors), C(*.bin)); each one missing is a problem. Give a local path only, not a Hub id.
    type: path
  model_name:
    description: The name RV(problems) gives O(model_path), for example the play variable that set it.
    type: str
    default: model_path
  free_space:
    description:
      - Room the software needs on the node. Each path's filesystem is read where the path, or its nearest
        existing parent, is (a directory still to be created takes its room there); less free than C(min_gb)
        is a problem.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: What needs the room, as RV(problems) names it (for example the play variable).
        type: str
        required: true
      path:
        description: The directory that will hold it.
        type: path
        required: true
      min_gb:
        description: Gigabytes (10^9 bytes) that must be free.
        type: float
        required: true
  ports:
    description:
      - TCP ports the software will listen on at O(listen_address). A port a socket already listens on there
        (or on a wildcard address) is a problem, naming the processes that hold it, unless every one of them
        runs in a systemd unit that O(ports_owned_by) names.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: What the port is for, as RV(problems) names it (for example the play variable).
        type: str
        required: true
      port:
        description: The port.
        type: int
        required: true
  listen_address:
    description: The address the software will bind O(ports) on; C(0.0.0.0) or C(::) clash with any listener.
    type: str
    default: 0.0.0.0
  ports_owned_by:
    description:
      - Prefixes of systemd unit names whose processes may hold O(ports) (the software's own servers from an
        earlier run, which the play restarts itself).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
  - gpuops.repurpose.attributes.INFO_MODULE
attributes:
  platform:
    support: full
    platforms: linux
notes:
  - Never fails on what it reads. A fact it cannot read is reported (RV(nvidia_smi_error), RV(python_error)) and,
    where a requirement needs it, is a problem.
seealso:
  - module: gpuops.repurpose.gpu_free_wait
"""

EXAMPLES = r"""
- name: Read what the node has for SGLang 0.5.23 (CUDA 13, manylinux_2_34, CPython 3.11-3.13)
  gpuops.repurpose.gpu_node_info:
    cuda_major: 13
    glibc: "2.34"
    python_path: /usr/bin/python3
    python_min: "3.11"
    python_max: "3.13"
  register: node

- name: Stop before anything changes when the node cannot run it
  ansible.builtin.assert:
    that: node.problems | length == 0
    fail_msg: "This node cannot run SGLang 0.5.23: {{ node.problems | join('; ') }}"
"""

RETURN = r"""
gpus:
  description: The GPUs C(nvidia-smi) lists (empty when it could not be read).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    uuid:
      description: The GPU's UUID.
      type: str
    name:
      description: The product name.
      type: str
    total_mib:
      description: Its memory in MiB.
      type: int
    used_mib:
      description: Its memory in use now, in MiB.
      type: int
  sample: [{index: 0, uuid: GPU-5f0c..., name: NVIDIA H200, total_mib: 143771, used_mib: 4}]
gpu_count:
  description: How many GPUs C(nvidia-smi) lists.
  returned: always
  type: int
  sample: 8
driver_version:
  description: The NVIDIA driver's version ('' when it could not be read).
  returned: always
  type: str
  sample: 580.95.05
nvidia_smi_error:
  description: Why the GPUs or the driver could not be read ('' when they were).
  returned: always
  type: str
  sample: "nvidia-smi failed (rc 9: the NVIDIA driver is not loaded): NVIDIA-SMI has failed ..."
glibc_version:
  description: The glibc the module's interpreter runs on ('' on another C library).
  returned: always
  type: str
  sample: "2.36"
python_version:
  description: The version of O(python_path).
  returned: when O(python_path) is given
  type: str
  sample: 3.11.2
python_venv:
  description: Whether O(python_path) can create a venv (it imports C(venv) and C(ensurepip)).
  returned: when O(python_path) is given
  type: bool
python_error:
  description: What went wrong running O(python_path) ('' when it ran).
  returned: when O(python_path) is given
  type: str
disk:
  description: The free space found for each entry of O(free_space).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The entry's name.
      type: str
    path:
      description: The entry's path.
      type: str
    checked:
      description: Where its filesystem was read (the path, or its nearest existing parent).
      type: str
    free_bytes:
      description: Bytes free there for an unprivileged user (C(statvfs) C(f_bavail)).
      type: int
    min_gb:
      description: The gigabytes the entry asked for.
      type: float
  sample: [{name: sglang_datagen_venv, path: /opt/datagen/venv, checked: /opt, free_bytes: 91234567890, min_gb: 30}]
ports_in_use:
  description: The listeners found on O(ports), each with the processes holding it.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: The address it listens on.
      type: str
    port:
      description: The port.
      type: int
    pids:
      description: The processes holding it that the node can see (empty for a socket of another container).
      type: list
      elements: int
    commands:
      description: Their command names, in the order of RV(ports_in_use[].pids).
      type: list
      elements: str
    units:
      description: Their systemd units ('' for none), in the order of RV(ports_in_use[].pids).
      type: list
      elements: str
  sample: [{address: 127.0.0.1, port: 31000, pids: [4242], commands: [python3], units: [sglang-datagen-worker@0.service]}]
problems:
  description: Each requirement the node does not meet, one sentence each; empty when it meets them all.
  returned: always
  type: list
  elements: str
  sample: ["NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._node.info import read_node


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_path=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="float", default=30),
            cuda_major=dict(type="int"),
            glibc=dict(type="str"),
            python_path=dict(type="path"),
            python_min=dict(type="str"),
            python_max=dict(type="str"),
            model_path=dict(type="path"),
            model_name=dict(type="str", default="model_path"),
            free_space=dict(type="list", elements="dict", default=[], options=dict(
                name=dict(type="str", required=True),
                path=dict(type="path", required=True),
                min_gb=dict(type="float", required=True),
            )),
            ports=dict(type="list", elements="dict", default=[], options=dict(
                name=dict(type="str", required=True),
                port=dict(type="int", required=True),
            )),
            listen_address=dict(type="str", default="0.0.0.0"),
            ports_owned_by=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **read_node(module.params))


if __name__ == "__main__":
    main()
