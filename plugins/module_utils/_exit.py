# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How every module of the collection ends: its runner returns the result, ``failed`` and ``msg`` included.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).
"""

from __future__ import annotations

import typing as t


def exit_module(module: t.Any, result: t.Dict[str, t.Any]) -> None:
    """End MODULE with RESULT: ``fail_json`` (its ``msg`` and the rest) when it says ``failed``, else ``exit_json``."""
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)
