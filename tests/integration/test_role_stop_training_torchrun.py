# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop_training role, with its own defaults, against a REAL torchrun job in CT200 (issue 11).

``tests/lab/lab trainer torchrun`` launches a real DDP job (tests/lab/torchrun_job/train.py: PyTorch on
CPU, gloo, DataLoader workers, atomic ``torch.save`` checkpoints) the incident's way,
``tmux new-session -d -s dflash "torchrun --standalone --nproc_per_node=2 train.py ..."``, so CT200's tmux
server is started by that command and keeps torchrun's command line, with the lab's decoys beside it
(networkd-dispatcher, ``vi`` and ``watch`` sessions on the same server). The real ``ansible-playbook``
runs ``playbooks/repurpose_ct200.yml`` (stop half only) through the lab's PVE host with the role's
defaults: its ``match`` (the lab inventory's fake-trainer match is put back to the role's) and its
60/30/10 s ladder. Nothing here is shortened: the job stops on Ctrl-C within seconds.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support.ct200 import ct_processes, decoy_pids, lock_holder, pane_pids
from tests.support.lab import MAIN_CT, restore_trainer, trainer
from tests.support.paths import LAB_INVENTORY, ROOT
from tests.support.playbook import recap, run_playbook
from tests.support.ssh import in_ct as ct
from tests.support.stop_training import REPURPOSE_PLAYBOOK

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

with open(ROOT / "roles" / "stop_training" / "defaults" / "main.yml", encoding="utf-8") as _handle:
    ROLE_DEFAULTS = yaml.safe_load(_handle)
DECOY_SESSIONS = ("edit", "monitor")


@pytest.fixture(scope="module")
def lab(lab):
    yield lab
    # Back to the baseline every other suite expects: the fake trainer, on a tmux server started
    # without a command (the lab restarts the server when it leaves the torchrun behaviour).
    restore_trainer()


def role_defaults_play(status: dict) -> tuple[int, str]:
    """The playbook's stop half with the role's own match, ladder and checkpoint patterns.

    inventories/lab sets a match and checkpoint patterns for the lab's fake trainer; they are put back
    to the role's defaults here. The checkpoint directory is the job's own, as inventories/ct200 sets it.
    """
    extra = {
        "repurpose_datagen": False,
        "stop_training_match": ROLE_DEFAULTS["stop_training_match"],
        "stop_training_ladder": ROLE_DEFAULTS["stop_training_ladder"],
        "stop_training_checkpoint_patterns": ROLE_DEFAULTS["stop_training_checkpoint_patterns"],
        "stop_training_checkpoint_dir": status["trainer"]["ckpt_dir"],
    }
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [extra], timeout=600)
    return done.rc, done.output


def tmux_server(status: dict) -> int:
    return int(ct(status, "tmux", "display-message", "-p", "#{pid}").stdout.strip())


def checkpoints_newer(status: dict, ckpt_dir: str, marker: str) -> list[str]:
    """Checkpoints written after marker was touched (a new run of the job may reuse a step's file name)."""
    done = ct(status, "find", ckpt_dir, "-maxdepth", "1", "-name", "*.pt", "-newer", marker, "-printf", "%f\\n")
    return sorted(done.stdout.split())


def stopped_section(out: str) -> str:
    """The report's "Stopped: N process(es) ..." part, one line (the YAML callback folds long lines)."""
    flat = " ".join(out.split())
    assert "Stopped: " in flat and "GPU memory before" in flat, out
    section = flat[flat.index("Stopped: "):]
    return section[:section.index("GPU memory before")]


def test_role_defaults_stop_a_tmux_new_session_torchrun_by_ctrl_c_and_nothing_else(lab):
    job = trainer("torchrun")
    assert job["behaviour"] == "torchrun" and job["running"], job
    agent, ranks, loaders = job["pids"]["launcher"], job["pids"]["workers"], job["pids"]["loader_workers"]
    assert len(ranks) == 2 and len(loaders) == 4, job  # 2 ranks, 2 DataLoader workers each
    job_pids = {agent, *ranks, *loaders}
    procs = ct_processes(lab)
    server = tmux_server(lab)
    # The trap is real: the server's command line is the job's `tmux new-session ... torchrun --standalone ...`.
    assert re.search(r"^tmux new-session -d -s dflash .*/torchrun --standalone --nproc_per_node=2 ", procs[server]), \
        procs[server]
    sessions = {name: pane_pids(lab, name) for name in DECOY_SESSIONS}
    assert all(len(pids) == 1 for pids in sessions.values()), sessions  # vi and watch, on the same server
    decoys = decoy_pids(lab)
    assert len(decoys) >= 3, decoys  # networkd-dispatcher, vi, watch
    marker = "/tmp/gpuops-test-torchrun-before-stop"
    ct(lab, "touch", marker)

    rc, out = role_defaults_play(lab)

    assert rc == 0, out
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free." in " ".join(out.split()), out
    # Ctrl-C typed into the job's pane stopped it: one rung, the job's 7 processes and nothing else.
    stopped = stopped_section(out)
    assert stopped.startswith("Stopped: %d process(es) by rung SIGINT via tmux in " % len(job_pids)), stopped
    assert "rung 1 SIGINT via tmux: 1 target(s)" in stopped and "rung 2 " not in stopped, stopped
    assert {int(pid) for pid in re.findall(r"\bpid (\d+)(?: \[[^\]]*\])?:", stopped)} == job_pids, stopped
    assert recap(out)["failed"] == 0
    after = ct_processes(lab)
    # a zombie is gone (the agent's exit status may not be collected by the tmux server yet)
    left = {pid: after[pid] for pid in job_pids & set(after) if not after[pid].endswith("<defunct>")}
    assert not left, "job processes left: %s" % left
    # No other session, the tmux server nor a decoy was signalled.
    assert tmux_server(lab) == server and after.get(server) == procs[server], "the tmux server was restarted or killed"
    assert {name: pane_pids(lab, name) for name in DECOY_SESSIONS} == sessions
    assert decoy_pids(lab) == decoys
    # Rank 0 saved on the way out (torch.save via .tmp + rename): a new checkpoint that torch loads, none torn.
    saved = checkpoints_newer(lab, job["ckpt_dir"], marker)
    assert len(saved) == 1, saved
    step = ct(lab, job["venv"] + "/bin/python", "-c", "import sys, torch; print(torch.load(sys.argv[1])['step'])",
              "%s/%s" % (job["ckpt_dir"], saved[0]), timeout=180).stdout.split()[-1]
    assert int(step) == int(saved[0][5:11]), (step, saved)
    assert not ct(lab, "sh", "-c", "ls %s | grep '[.]tmp$'" % job["ckpt_dir"], check=False).stdout.strip()
    assert lock_holder(lab) is None
