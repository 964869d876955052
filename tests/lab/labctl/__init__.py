# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The local CT200 lab, by concern (its entry point is tests/lab/lab, which runs ../lab.py).

- ``facts``: the lane, places, ports, containers, users, the two nodes; what runs in the containers
- ``host``: commands, files, recorded processes, mounts, the lab's lock, preflight
- ``containers``: the rootfs cache, LXC and Proxmox VE configs, unprivileged containers, boot
- ``sshd`` and ``supervisor``: a lab PVE host (its sshd, its mount namespace with pct and nvidia-smi)
- ``pve``: Proxmox VE states a test switches on (a backup's lock and freeze, HA)
- ``fakegpu``, ``trainer``, ``torch_venv``: the fake GPUs, the dflash trainer and decoys, torchrun's venv
- ``status``, ``lifecycle``, ``cli``: ``lab status``, ``lab up|down``, the command line

Standard library only, run by the system python3; tests import the modules as ``tests.lab.labctl.MODULE``.
"""
