# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``python -m _pct_ssh --serve PATH PERSIST``: the control master (started by client.start_master)."""

from __future__ import annotations

import sys

from .master import serve_main

if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--serve":
    sys.exit(serve_main(sys.argv[2], float(sys.argv[3])))
