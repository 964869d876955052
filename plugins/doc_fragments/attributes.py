# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE to gpuops.repurpose; it may change at any time.
# What each attribute means, said once; every module states its own support and details.

from __future__ import annotations


class ModuleDocFragment:

    # Standard documentation fragment
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
      - This assumes that the system controlled/queried by the module has not changed in a relevant way.
"""

    # Should be used together with the standard fragment
    PLATFORM = r"""
options: {}
attributes:
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
"""

    # For the modules that run pct on the Proxmox VE host (meta/runtime.yml action group "pct")
    PCT_GROUP = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/gpuops.repurpose.pct) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - gpuops.repurpose.pct
"""

    # For modules that only read: nothing to predict in check mode, nothing to diff, nothing changed
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Reads only; runs the same in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Reads only; changes nothing.
"""

    # For modules with an action plugin that does part of the work on the controller
    ACTION = r"""
options: {}
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on
      the controller.
"""
