# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE to gpuops.repurpose; it may change at any time.
# The options of every module that runs pct on the Proxmox VE host; their argument spec is
# plugins/module_utils/_pct/host.py PCT_ARGUMENT_SPEC.

from __future__ import annotations


class ModuleDocFragment:

    DOCUMENTATION = r"""
options:
  vmid:
    description: VMID of the container, an integer from 100 to 999999999 (as in C(pct list)).
    type: int
    required: true
  pct_path:
    description: Path of C(pct) on the host (a sudo rule must name this exact path).
    type: path
    default: /usr/sbin/pct
  pct_become_method:
    description:
      - How a user other than root runs C(pct). V(sudo) and V(doas) run non-interactively (C(sudo -n)); V(none)
        runs C(pct) directly; any other value is used as a literal command prefix. Ignored when running as root.
      - The same values as the P(gpuops.repurpose.pct_ssh#connection) connection's C(proxmox_become_method).
    type: str
    default: sudo
"""
