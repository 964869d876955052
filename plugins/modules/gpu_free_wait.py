#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_free_wait
short_description: Wait until NVIDIA GPU memory is released, or name the processes holding it
version_added: 1.0.0
description:
  - Samples the memory of the selected NVIDIA GPUs until every one of them is at or under O(max_used_mib)
    for O(stable_for) consecutive samples, or O(timeout) passes.
  - Reads the GPUs through NVML (nvidia-ml-py's C(pynvml)) when it is importable and C(libnvidia-ml.so) loads,
    otherwise through C(nvidia-smi --query-gpu ... --format=csv,noheader,nounits) run with C(LC_ALL=C).
    A missing driver, a failing or garbled C(nvidia-smi), C([N/A]) memory, no devices or a GPU that fell off
    the bus is a failure naming the cause, never "free".
  - Finds the processes holding the GPUs the way C(fuser -v /dev/nvidia*) does, by scanning C(/proc/*/fd),
    because inside an LXC container NVML and C(nvidia-smi) list no processes (or host PIDs). The backend's
    process list, where its PIDs exist in this PID namespace, adds the MiB each process uses.
  - On a Proxmox VE host each holder is mapped to its container through its cgroup path (and its PID inside
    the container through C(NSpid)); O(container) limits the judgement to one container.
  - It never signals or changes anything. On timeout it fails and names every holder so an operator (or
    M(gpuops.repurpose.training_stop)) can act.
author:
  - gpuops.repurpose maintainers (@gpuops)
options:
  gpus:
    description:
      - The GPUs to judge, each an index (V(0)) or a UUID (V(GPU-...)) as C(nvidia-smi -L) prints them.
      - Empty means every GPU.
    type: list
    elements: str
    default: []
  max_used_mib:
    description:
      - Memory per GPU, in MiB, that still counts as free.
      - The default sits above an idle GPU's baseline (a few MiB, a few hundred with a desktop on it) and below
        a single CUDA context, so any process that still has a context open keeps the GPU busy.
    type: int
    default: 512
  stable_for:
    description:
      - Consecutive samples that must all be free, so a momentary dip between two allocations is not taken
        for a release.
    type: int
    default: 2
  timeout:
    description:
      - Seconds to wait in all, O(delay) included. V(0) samples once.
      - One C(nvidia-smi) call is bounded by min(30, max(5, O(timeout))) seconds, and calls are cut to end by
        max(O(timeout), 5) seconds into the wait (each gets at least 0.5 s), so a hung driver cannot hold the
        wait longer. V(0) still gives its one sample up to 5 s, since a working C(nvidia-smi) on a node without
        persistence mode can take seconds.
      - A call given those 5 s that does not answer, the memory query or the process list, fails the wait as a
        hung driver. A call the wait's end cut shorter proves nothing, so the wait ends as a timeout, judged
        by its last whole sample, and its message says which call was cut.
    type: float
    default: 120
  interval:
    description: Seconds between the end of one sample and the start of the next.
    type: float
    default: 1.0
  delay:
    description: Seconds to wait before the first sample.
    type: float
    default: 0
  ignore_processes:
    description:
      - Process names (C(comm) or the base name of C(argv[0]); shell-style patterns allowed) that never count as
        holders. Memory the backend attributes to them is not counted either.
      - Setting this replaces the default list.
    type: list
    elements: str
    default: [nvidia-persistenced, nvidia-powerd, nv-hostengine, dcgm-exporter, nvidia-smi, Xorg, X, Xwayland,
              gnome-shell, kwin_x11, kwin_wayland, sddm-greeter, gdm-x-session]
  backend:
    description:
      - V(auto) uses NVML when nvidia-ml-py is importable and C(libnvidia-ml.so) loads, else C(nvidia-smi).
        It also takes the process list from C(nvidia-smi) when NVML lacks the function or returns sentinel PIDs.
      - V(nvml) fails when NVML cannot be used; V(nvidia_smi) never tries NVML.
    type: str
    choices: [auto, nvml, nvidia_smi]
    default: auto
  nvidia_smi_path:
    description: The C(nvidia-smi) to run; a bare name is looked up on E(PATH), then in C(/usr/bin) and C(/usr/local/bin).
    type: str
    default: nvidia-smi
  container:
    description:
      - On the Proxmox VE host, the VMID whose processes count. Holders in other containers or on the host are
        reported under RV(ignored_holders), and the memory the backend attributes to them is not counted.
      - Memory no process is known to own still counts.
    type: int
  device_paths:
    description:
      - Shell patterns of the device files whose holders are looked for. A fd counts when it is the same file
        (same character device, or same inode for a bind mount) or when its path matches.
      - The GPU index is the number at the end of the file name (C(/dev/nvidia3) is GPU 3); other files (C(nvidiactl),
        C(nvidia-uvm)) make a driver-wide holder.
    type: list
    elements: str
    default: ["/dev/nvidia*"]
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  check_mode:
    support: full
    details: Samples once and reports whether the GPUs are free; never waits and never fails because they are busy.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: It only reads; once the GPUs are free a second run reports V(changed=false).
  platform:
    support: full
    platforms: linux
notes:
  - Run it inside the container (through P(gpuops.repurpose.pct_ssh#connection)) or on the PVE host. Inside the container the
    scan sees only the container's processes; memory held from elsewhere still counts, and the failure says so.
  - Reading other users' C(/proc/PID/fd) needs root; as another user holders may be missing from the report
    (never from the memory judgement).
requirements:
  - An NVIDIA driver with C(nvidia-smi), or nvidia-ml-py with C(libnvidia-ml.so), on the target.
seealso:
  - module: gpuops.repurpose.training_stop
"""

EXAMPLES = r"""
- name: Wait up to five minutes for all eight GPUs to be released
  gpuops.repurpose.gpu_free_wait:
    timeout: 300

- name: From the PVE host, judge only what CT 200 holds on GPUs 0-3
  gpuops.repurpose.gpu_free_wait:
    container: 200
    gpus: [0, 1, 2, 3]
    interval: 0.5
  become: true

- name: Force nvidia-smi from a non-standard place, stricter threshold, three calm samples
  gpuops.repurpose.gpu_free_wait:
    backend: nvidia_smi
    nvidia_smi_path: /opt/nvidia/bin/nvidia-smi
    max_used_mib: 64
    stable_for: 3
  register: gpus_free

- name: Show who still had the GPUs open when it started
  ansible.builtin.debug:
    msg: "{{ gpus_free.holders_before | map(attribute='pid') | list }}"
"""

RETURN = r"""
free:
  description: Whether every selected GPU was judged free (in check mode, at the single sample).
  returned: always
  type: bool
  sample: true
backend:
  description: The backend that produced the last sample (V(nvml) or V(nvidia_smi)).
  returned: success
  type: str
  sample: nvidia_smi
backend_notes:
  description: Why a fallback happened or why no process list was available.
  returned: always
  type: list
  elements: str
  sample: ["NVML: libnvidia-ml.so not found (NVML Shared Library Not Found); using nvidia-smi"]
gpus:
  description: Each selected GPU at the first and the last sample.
  returned: success
  type: list
  elements: dict
  contains:
    index: {description: GPU index., type: int, returned: success, sample: 0}
    uuid: {description: GPU UUID., type: str, returned: success, sample: GPU-72e5f72d-18ee-5e60-842e-9c4a48fc83cd}
    name: {description: Product name., type: str, returned: success, sample: NVIDIA RTX PRO 6000 Blackwell Workstation Edition}
    bus_id: {description: PCI bus id., type: str, returned: success, sample: "00000000:01:00.0"}
    memory_total_mib: {description: Total memory., type: int, returned: success, sample: 97887}
    memory_used_mib_before: {description: Used memory at the first sample., type: int, returned: success, sample: 80004}
    memory_used_mib_after: {description: Used memory at the last sample., type: int, returned: success, sample: 4}
    memory_counted_mib_after:
      description: Used memory at the last sample less what ignored or out-of-scope processes hold.
      type: int
      returned: success
      sample: 4
    free: {description: Whether this GPU was at or under O(max_used_mib) at the last sample., type: bool, returned: success, sample: true}
holders:
  description:
    - Processes that count and have a selected GPU (or the driver) open at the end, one entry per process and GPU.
      Empty when the GPUs were released and the processes are gone.
  returned: success
  type: list
  elements: dict
  contains:
    pid:
      description: PID in this PID namespace (on the PVE host the host PID).
      type: int
      returned: success
      sample: 41234
    name:
      description: The process name (comm).
      type: str
      returned: success
      sample: python3
    cmdline:
      description: Its command line.
      type: str
      returned: success
      sample: python3 train.py --rank 0
    gpu:
      description: GPU index; null when only driver-wide files (nvidiactl, nvidia-uvm) are open.
      type: int
      returned: success
      sample: 0
    gpu_uuid:
      description: GPU UUID when known.
      type: str
      returned: success
    device:
      description: The device file it holds.
      type: str
      returned: success
      sample: /dev/nvidia0
    used_mib:
      description: MiB the backend attributes to it; null where unknown (inside containers).
      type: int
      returned: success
    container:
      description: VMID of its container from the cgroup path; null for host processes.
      type: int
      returned: success
      sample: 200
    container_pid:
      description: Its PID inside the container (innermost NSpid); null when not namespaced.
      type: int
      returned: success
    ignored:
      description: Why it does not count (only in RV(ignored_holders)).
      type: str
      returned: success
    unit:
      description: The systemd service or scope it runs in, from its cgroup; empty when none.
      type: str
      returned: success
      sample: sglang-datagen-worker@0.service
holders_before:
  description: Like RV(holders), scanned before the first sample.
  returned: success
  type: list
  elements: dict
ignored_holders:
  description: Holders at the end that do not count, each with the reason in C(ignored).
  returned: success
  type: list
  elements: dict
foreign_processes:
  description:
    - Processes the backend lists whose PIDs name no process here. Inside a container that is every one of them
      (the driver reports the host's PIDs, and a process here with the same number is another process), so their
      memory is counted and never attributed or discounted by a PID match; a holder's container comes from its
      cgroup.
  returned: success
  type: list
  elements: dict
elapsed:
  description: Seconds spent, O(delay) included.
  returned: always
  type: float
  sample: 3.2
samples:
  description: How many samples were taken.
  returned: always
  type: int
  sample: 4
history:
  description: The last samples (at most 100) with wall-clock time, seconds since start, duration and counted MiB per GPU.
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.free import wait_free
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.holders import DEFAULT_DEVICE_PATHS
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import DEFAULT_IGNORE_PROCESSES


def main():
    module = AnsibleModule(
        argument_spec=dict(
            gpus=dict(type="list", elements="str", default=[]),
            max_used_mib=dict(type="int", default=512),
            stable_for=dict(type="int", default=2),
            timeout=dict(type="float", default=120),
            interval=dict(type="float", default=1.0),
            delay=dict(type="float", default=0),
            ignore_processes=dict(type="list", elements="str", default=list(DEFAULT_IGNORE_PROCESSES)),
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia_smi"]),
            nvidia_smi_path=dict(type="str", default="nvidia-smi"),
            container=dict(type="int"),
            device_paths=dict(type="list", elements="str", default=list(DEFAULT_DEVICE_PATHS)),
        ),
        supports_check_mode=True,
    )
    exit_module(module, wait_free(module.params, check_mode=module.check_mode, warn=module.warn))


if __name__ == "__main__":
    main()
