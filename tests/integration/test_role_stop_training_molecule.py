# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Molecule scenarios of the stop_training role (extensions/molecule/), one per trainer behaviour.

Each runs ``molecule test -s NAME`` from the collection root: the shared
``default`` scenario checks the lab is up (create) and leaves it up (destroy);
the behaviour scenario switches the lab's trainer (prepare), runs
playbooks/repurpose_ct200.yml (converge), runs it again expecting no change
(idempotence) and checks the container (verify). ``round_trip`` is the node's whole life instead: its
prepare trains, repurposes and waits for the generation to end and release the GPUs; its converge is
playbooks/restore_training.yml, whose re-run must change nothing.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.paths import BIN, LAB_INVENTORY, ROOT

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]


@pytest.mark.parametrize("scenario", ["graceful", "stubborn", "orphans", "slow_checkpoint", "round_trip"])
def test_molecule_scenario(lab, scenario):
    # the lane's lab inventory (extensions/molecule/config.yml reads GPUOPS_LAB_INVENTORY); the lab CLI the
    # scenarios run finds the lane in GPUOPS_LAB_LANE, which tests/support/paths.py put in this environment
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_NOCOLOR="1", NO_COLOR="1",
               GPUOPS_LAB_INVENTORY=str(LAB_INVENTORY))
    done = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=850, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "idempotence" in out
