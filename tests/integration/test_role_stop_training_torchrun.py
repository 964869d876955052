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

import json
import re
import shlex

import pytest
import yaml

from tests.lab.labctl import facts as lab_facts
from tests.lab.labctl.trainer import trainer_command
from tests.support.ct200 import ct_processes, decoy_pids, lock_holder, pane_pids
from tests.support.lab import MAIN_CT, lab_cli, trainer
from tests.support.paths import LAB_INVENTORY, ROOT
from tests.support.playbook import recap, run_playbook
from tests.support.restore import (
    RECORD,
    child_pids,
    devices_held,
    first_step,
    kernel_argv,
    pane,
    proc_cmdline,
    read_record,
    restore,
    summary_lines,
    wait_for_checkpoint,
    window_pane_pid,
)
from tests.support.ssh import attach
from tests.support.ssh import in_ct as ct
from tests.support.stop_training import REPURPOSE_PLAYBOOK

# Afterwards back to the baseline every other suite expects: the fake trainer, on a tmux server started without a
# command (the lab restarts the server when it leaves the torchrun behaviour).
pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]

with open(ROOT / "roles" / "stop_training" / "defaults" / "main.yml", encoding="utf-8") as _handle:
    ROLE_DEFAULTS = yaml.safe_load(_handle)
DECOY_SESSIONS = ("edit", "monitor")
# the way back's dataset: a directory made here in CT200 (the job's --data accepts a file or a directory)
RESTORE_DATA = "/root/dflash/data/merged-v2/"


def role_defaults(status: dict) -> dict:
    """inventories/lab sets a match and checkpoint patterns for the lab's fake trainer; they are put back
    to the role's defaults here. The checkpoint directory is the job's own, as inventories/ct200 sets it
    (the lab's, not STATUS's: the module's status may have been read while the fake trainer ran)."""
    return {
        "repurpose_datagen": False,
        "stop_training_match": ROLE_DEFAULTS["stop_training_match"],
        "stop_training_ladder": ROLE_DEFAULTS["stop_training_ladder"],
        "stop_training_checkpoint_patterns": ROLE_DEFAULTS["stop_training_checkpoint_patterns"],
        "stop_training_checkpoint_dir": lab_facts.TORCHRUN_CKPT,
    }


def role_defaults_play(status: dict) -> tuple[int, str]:
    """The playbook's stop half with the role's own match, ladder and checkpoint patterns (:func:`role_defaults`)."""
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [role_defaults(status)], timeout=600)
    return done.rc, done.output


def restore_vars(status: dict) -> dict:
    """The way back with the stop play's role-default overrides, the job's two GPUs and the new dataset."""
    return dict(role_defaults(status), restore_training_gpus=["0", "1"], restore_training_dataset=RESTORE_DATA)


def fresh_torchrun(status: dict, ckpt_every: int = 0) -> dict:
    """The lab's torchrun job (CKPT_EVERY: periodic saves) in an empty checkpoint directory, with no launch
    record yet: its trainer status. Whatever ran is ended first (the lab SIGKILLs a job the way back started
    again: it saves nothing on the way out), so no save of an earlier run lands in the directory."""
    done = lab_cli("trainer", "none")
    assert done.returncode == 0, done.stderr + done.stdout
    attach(status, "find", lab_facts.TORCHRUN_CKPT, "-maxdepth", "1", "-name", "ckpt-*", "-delete", check=False)
    attach(status, "rm", "-f", RECORD)
    done = lab_cli("trainer", "torchrun", *(["--ckpt-every", str(ckpt_every)] if ckpt_every else []), timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    job = json.loads(done.stdout)
    assert job["behaviour"] == "torchrun" and job["running"], job
    return job


def started_argv(status: dict, job: dict, ckpt_every: int = 0) -> list[str]:
    """torchrun's argv as the lab started it (its trainer_command), as the kernel holds it: torchrun is a console
    script, so /proc shows its #! interpreter first. Read from the lab and CT200, never through the code under test."""
    lab_argv = shlex.split(trainer_command(lab_facts.TORCHRUN, ckpt_every))
    assert shlex.split(job["command"]) == lab_argv, job["command"]
    started = proc_cmdline(status, job["pids"]["launcher"])
    assert started == kernel_argv(status, lab_argv), started
    return started


def make_dataset(status: dict) -> None:
    attach(status, "sh", "-c", 'mkdir -p "$1" && printf "%s\\n" "$2" > "$1/part-00000.jsonl"', "sh", RESTORE_DATA,
           '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}')


def checkpoint_names(status: dict) -> list[str]:
    return sorted(n for n in attach(status, "ls", lab_facts.TORCHRUN_CKPT).stdout.split() if n.startswith("ckpt-"))


def assert_resumed(status: dict, started: list[str], ckpt: dict) -> None:
    """The job the restore started: the recorded argv with --data replaced and --resume-from appended, resumed at
    the checkpoint's step and training past it, its two ranks holding /dev/nvidia0 and /dev/nvidia1."""
    launcher = window_pane_pid(status)
    assert launcher is not None, "no window train in tmux session dflash"
    want = list(started)
    want[want.index("--data") + 1] = RESTORE_DATA
    want += ["--resume-from", ckpt["path"]]
    assert proc_cmdline(status, launcher) == want
    shown = pane(status)
    resumed = "resumed from %s at step %d" % (ckpt["path"], ckpt["step"])
    assert resumed in shown, shown
    nxt = re.search(r"^step %d loss " % (ckpt["step"] + 1), shown, re.M)
    assert nxt and nxt.start() > shown.index(resumed), shown
    assert first_step(shown) == ckpt["step"] + 1, shown
    assert "data %s" % RESTORE_DATA in shown, shown
    ranks = [pid for pid in child_pids(status, launcher) if lab_facts.TORCHRUN_SCRIPT in proc_cmdline(status, pid)]
    assert len(ranks) == 2, (launcher, child_pids(status, launcher))
    held = sorted(tuple(devices_held(status, rank)) for rank in ranks)
    assert held == [("/dev/nvidia0",), ("/dev/nvidia1",)], held


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


def test_role_defaults_stop_then_restore_resumes_torchrun_from_its_last_whole_checkpoint(lab):
    job = fresh_torchrun(lab)
    started = started_argv(lab, job)

    rc, out = role_defaults_play(lab)

    assert rc == 0, out
    record = read_record(lab)
    assert record["argv"] == started, record["argv"]
    assert record["cwd"] == "/root/dflash" and record["user"] == "root", record
    # Ctrl-C: rank 0 saved on the way out, the one checkpoint in the directory
    saved = checkpoint_names(lab)
    ckpt = record["checkpoint"]
    assert len(saved) == 1 and ckpt["path"] == "%s/%s" % (lab_facts.TORCHRUN_CKPT, saved[0]), (saved, ckpt)
    assert ckpt["whole"] and ckpt["step"] == int(saved[0][5:11]) and record["checkpoint_skipped"] == [], record
    make_dataset(lab)

    run = restore(extra=restore_vars(lab))

    assert run.rc == 0, run.output[-6000:]
    assert_resumed(lab, started, ckpt)
    summary = " ".join(summary_lines(run.output).split())
    assert "training again in tmux session dflash" in summary, summary
    assert "Checkpoint: %s, step %d" % (ckpt["path"], ckpt["step"]) in summary, summary

    again = restore(extra=restore_vars(lab))
    assert again.rc == 0 and again.recap()["changed"] == 0, again.output[-4000:]
    assert "already trains" in summary_lines(again.output)


def test_a_truncated_newer_checkpoint_is_skipped_by_the_stop_and_by_the_restore(lab):
    job = fresh_torchrun(lab, ckpt_every=5)
    started = started_argv(lab, job, ckpt_every=5)
    first = sorted(wait_for_checkpoint(lab, lab_facts.TORCHRUN_CKPT))[0]
    torn = lab_facts.TORCHRUN_CKPT + "/ckpt-999999.pt"
    try:
        # a real checkpoint, newer by step, cut to half its size, its mtime a minute back (no save in progress)
        attach(lab, "sh", "-c", 'head -c $(( $(stat -c %s "$1") / 2 )) "$1" > "$2.part" && '
               'touch -d "@$(( $(date +%s) - 60 ))" "$2.part" && mv "$2.part" "$2"', "sh",
               "%s/%s" % (lab_facts.TORCHRUN_CKPT, first), torn)

        rc, out = role_defaults_play(lab)

        assert rc == 0, out
        flat = " ".join(out.split())
        # the newest whole one: the highest step the job saved (its Ctrl-C save), read from the directory
        whole_name = max((n for n in checkpoint_names(lab) if n != "ckpt-999999.pt"), key=lambda n: int(n[5:11]))
        whole, step = "%s/%s" % (lab_facts.TORCHRUN_CKPT, whole_name), int(whole_name[5:11])
        assert "Not whole, skipped: %s (truncated" % torn in flat, out
        assert "Last whole checkpoint: %s, step %d (" % (whole, step) in flat, out
        record = read_record(lab)
        assert record["argv"] == started, record["argv"]
        assert record["checkpoint"]["path"] == whole and record["checkpoint"]["step"] == step, record
        assert [(s["path"], s["why"].startswith("truncated")) for s in record["checkpoint_skipped"]] == [(torn, True)]
        make_dataset(lab)

        run = restore(extra=restore_vars(lab))

        assert run.rc == 0, run.output[-6000:]
        assert_resumed(lab, started, record["checkpoint"])
        summary = " ".join(summary_lines(run.output).split())
        assert "Not whole, skipped: %s (truncated" % torn in summary, summary
        assert "Checkpoint: %s, step %d" % (whole, step) in summary, summary
        assert "First step seen: %d" % (step + 1) in summary, summary
    finally:
        attach(lab, "rm", "-f", torn, torn + ".part")
