# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fake GPUs' state directory of a lab node (tests/lab/fakegpu).
"""

from __future__ import annotations

import os
import sys

from .facts import FAKEGPU_DIR, GPU_COUNT, HERE, _load_file
from .host import run


def ensure_fakegpu(fakegpu_dir: str = FAKEGPU_DIR) -> None:
    lib = os.path.join(HERE, "fakegpu", "fakegpu.py")
    if not os.path.exists(os.path.join(fakegpu_dir, "config.json")):
        run([sys.executable, lib, "--dir", fakegpu_dir, "init", "--count", str(GPU_COUNT)])
    # A state dir that exists keeps its config (tests change it); the bind mounts need every device file.
    _load_file(lib, "gpuops_lab_fakegpu").ensure_devices(fakegpu_dir, GPU_COUNT)
