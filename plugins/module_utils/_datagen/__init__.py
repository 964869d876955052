# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the role sglang_datagen asks of its node besides the pipeline itself: the readiness gate
(``ready``), the venv's pins (``pins``), its systemd units (``units``), its API key (``secret``) and the
existing training set's labels (``labels``).

This is a PRIVATE module_utils package of gpuops.repurpose; its API may change at any time. Standard
library only (it runs on targets).
"""
