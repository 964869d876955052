# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The local CT200 lab: ``lab up | down | status | trainer BEHAVIOUR`` (run as root).

Real parts: LXC containers 200 (ct200) and 201 (ct201) with systemd as init in
a private lxcpath, a real sshd on 127.0.0.1:2222 playing the Proxmox VE host
(its own mount namespace, where tests/lab/pct sits at /usr/sbin/pct and the
fake nvidia-smi at /usr/bin/nvidia-smi), tmux session ``dflash`` in CT200
running the fake trainer, decoy processes. Faked: only the GPUs.

``up`` is idempotent and fast when the lab is there; ``down`` ends only what
the lab started (recorded PIDs checked against their start times, its own
container names under its own lxcpath, its supervisor's mount namespace) and
keeps the rootfs cache. See tests/lab/README.md.

The logic is the package labctl/ beside this file, one module a concern (labctl/__init__.py lists them);
this file is the entry point that tests/lab/lab, a lane's ``up`` and a lab host's supervisor run.
Standard library only.
"""

from __future__ import annotations

import sys

from labctl.cli import main  # this file's directory is on sys.path: Python puts a script's own there

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
