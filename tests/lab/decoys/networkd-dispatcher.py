# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Lab decoy: a long-running python daemon that looks like Debian's networkd-dispatcher.

Installed by tests/lab/lab as /usr/bin/networkd-dispatcher inside the lab
containers and run by a systemd unit, so ``ps`` shows
``/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers``,
as on a stock Debian/Ubuntu node. It is the process an over-broad
``pgrep python`` / ``ps aux | grep python`` wrongly counts as training.
It holds no GPU and does nothing but wait; SIGTERM ends it cleanly. With
``GPUOPS_LAB_SIGNAL_AUDIT`` set (its lab unit sets it) every signal it receives is
recorded (tests/lab/trainer/signal_audit.py): no decoy may ever be signalled.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time


def _signal_audit() -> object | None:
    """The lab's signal audit (tests/lab/trainer/signal_audit.py, in /opt/lab/trainer) when its unit asks for it."""
    if not os.environ.get("GPUOPS_LAB_SIGNAL_AUDIT"):
        return None
    # loaded by path: this decoy stands alone (next to it in the tree, or the lab's /opt/lab/trainer)
    here = os.path.dirname(os.path.abspath(__file__))
    found = [path for path in (os.path.join(here, "..", "trainer", "signal_audit.py"), "/opt/lab/trainer/signal_audit.py")
             if os.path.isfile(path)]
    if not found:
        return None
    spec = importlib.util.spec_from_file_location("signal_audit", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SignalAudit("networkd-dispatcher")


def main() -> int:
    parser = argparse.ArgumentParser(prog="networkd-dispatcher")
    parser.add_argument("--run-startup-triggers", action="store_true")
    parser.add_argument("-S", "--script-dir", default="/etc/networkd-dispatcher")
    parser.parse_args()
    audit = _signal_audit()
    handle = audit.handle if audit is not None else signal.signal
    handle(signal.SIGTERM, lambda *_: sys.exit(0))
    handle(signal.SIGHUP, signal.SIG_IGN)
    if audit is not None:
        audit.install()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
