# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The built and installed tarball runs the playbook on the lab, without the checkout's collection.

The tarball is built from a copy of the checkout, installed into a temporary
collections path, and the playbook is run by its FQCN
(``gpuops.repurpose.repurpose_ct200``) with a config of its own and a cwd outside
the checkout: the checkout's ``.collections`` symlink and ``ansible.cfg`` are not
in play. Only the inventory is the checkout's ``inventories/lab``. The stop half
runs (``repurpose_datagen=false``: the datagen half is covered by
test_role_sglang_datagen.py and needs minutes of pip installs in the container).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import built_collection as bc  # noqa: E402

LAB = bc.ROOT / "tests" / "lab" / "lab"
INVENTORY = bc.ROOT / "inventories" / "lab"
TRAINER_RE = re.compile(r"^\S*python[0-9.]*\s+(-\S+\s+)*\S*fake_trainer\.py(\s|$)")
# short rungs, as the role's own lab tests use; the graceful trainer stops at the first
FAST = {
    "repurpose_datagen": False,
    "stop_training_ladder": [
        {"signal": "SIGINT", "via": "tmux", "timeout": 20},
        {"signal": "SIGTERM", "timeout": 10},
        {"signal": "SIGKILL", "timeout": 5},
    ],
    "stop_training_gpu_timeout": 30,
    "stop_training_gpu_interval": 0.2,
}

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]


def lab_status() -> dict | None:
    try:
        done = subprocess.run([str(LAB), "status"], capture_output=True, text=True, timeout=60, check=False)
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def trainer(behaviour: str) -> None:
    done = subprocess.run([str(LAB), "trainer", behaviour], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr + done.stdout


def trainer_running(status: dict) -> bool:
    ssh = ["ssh", "-p", str(status["port"]), "-i", status["key"], "-o", "UserKnownHostsFile=" + status["known_hosts"],
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
           "root@" + status["host"], "pct exec 200 -- ps -eo args="]
    out = subprocess.run(ssh, capture_output=True, text=True, timeout=60, check=True).stdout
    return any(TRAINER_RE.search(line.strip()) for line in out.splitlines())


def recap(output: str, host: str = "ct200") -> dict[str, int]:
    m = re.search(r"^%s\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host),
                  output, re.M)
    assert m, "no recap for %s in:\n%s" % (host, output[-3000:])
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


@pytest.fixture(scope="module")
def lab():
    if LAB.exists() and (status := lab_status()) and status.get("up"):
        yield status
        subprocess.run([str(LAB), "trainer", "graceful"], capture_output=True, timeout=300, check=False)
    else:
        pytest.skip("the CT200 lab is not up (run: tests/lab/lab up)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("installed")
    bc.copy_checkout(work / "src")
    tarball = bc.build(work / "src", work / "dist")
    collections = work / "user" / "collections"
    collections.mkdir(parents=True)
    bc.install(tarball, collections)
    return collections


def play(collections: Path, *args: str) -> tuple[int, str]:
    argv = [str(bc.BIN / "ansible-playbook"), "-i", str(INVENTORY), "gpuops.repurpose.repurpose_ct200",
            "-e", json.dumps(FAST), *args]
    done = subprocess.run(argv, cwd=collections.parent, env=bc.installed_env(collections, PYTHONUNBUFFERED="1"),
                          capture_output=True, text=True, timeout=500, check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_installed_collection_runs_the_playbook_and_a_rerun_changes_nothing(lab, installed):
    trainer("graceful")
    assert trainer_running(lab)
    rc, out = play(installed, "-vv")
    assert rc == 0, out[-4000:]
    # the roles and plugins came from the installed copy, never from the checkout
    assert str(installed / "ansible_collections" / "gpuops" / "repurpose") in out
    assert str(bc.ROOT / ".collections") not in out and str(bc.ROOT / "roles") not in out
    assert "by rung SIGINT via tmux" in out and re.search(r"GPU memory after: +8 GPU\(s\) free", out), out[-4000:]
    assert not trainer_running(lab)
    assert recap(out)["failed"] == 0

    rc, out = play(installed)
    assert rc == 0, out[-4000:]
    assert "Stopped: nothing, no process was selected" in out
    assert recap(out)["changed"] == 0
