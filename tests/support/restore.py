"""The way back as its lab tests run it: playbooks/restore_training.yml on inventories/lab, and what they read in CT200.

Everything is read straight through ``lxc-attach`` (tests/support/ssh.py ``attach``), never through the code under
test.
"""

from __future__ import annotations

import json
import re
import time
from typing import List, Optional, Tuple

from tests.support.ct200 import gpu_used
from tests.support.lab import lab_cli
from tests.support.paths import LAB_INVENTORY, ROOT
from tests.support.playbook import PlaybookRun, run_playbook
from tests.support.ssh import attach
from tests.support.stop_training import FAST, REPURPOSE_PLAYBOOK

RESTORE_PLAYBOOK = ROOT / "playbooks" / "restore_training.yml"
CKPT_DIR = "/root/dflash/checkpoints"
TRAINER_DATA = "/root/dflash/data/train-v1.jsonl"  # the lab trainer's --data (tests/lab/labctl/facts.py)
ALL_GPUS = [str(i) for i in range(8)]
RECORD = "/var/lib/gpuops/launch/dflash.json"
MERGED = "/srv/datagen/work/merged"
# the stop half on the stubborn trainer (only SIGKILL ends it): short first rungs
STUBBORN_STOP = {
    "stop_training_ladder": [{"signal": "SIGINT", "via": "tmux", "timeout": 4}, {"signal": "SIGTERM", "timeout": 4},
                             {"signal": "SIGKILL", "timeout": 5}],
    "stop_training_kill_timeout": 5, "stop_training_gpu_timeout": 60, "stop_training_gpu_interval": 0.2,
}
# a fake GPU holds its baseline when free (tests/lab/fakegpu: baseline_mib 4)
FREE_MIB = 512


def restore(*args: str, extra: Optional[dict] = None, timeout: float = 900) -> PlaybookRun:
    """The restore playbook on the lab inventory, EXTRA vars, then ARGS."""
    return run_playbook(RESTORE_PLAYBOOK, LAB_INVENTORY, [extra] if extra else [], args, timeout=timeout)


def stubborn_with_checkpoints(every: int = 5) -> dict:
    """The lab's stubborn trainer, saving a checkpoint every EVERY steps (it never saves on a signal)."""
    done = lab_cli("trainer", "stubborn", "--ckpt-every", str(every))
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def wait_for_checkpoint(status: dict, ckpt_dir: str, timeout: float = 60) -> List[str]:
    """The checkpoint files in CKPT_DIR once there is one (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        names = attach(status, "ls", ckpt_dir, check=False).stdout.split()
        found = [n for n in names if re.match(r"ckpt-.*\.(bin|pt)$", n)]
        if found:
            return found
        assert time.monotonic() < deadline, "no checkpoint in %s within %ss: %s" % (ckpt_dir, timeout, names)
        time.sleep(0.5)


def read_record(status: dict) -> dict:
    return json.loads(attach(status, "cat", RECORD).stdout)


def pane(status: dict, window: str = "train", lines: int = 300) -> str:
    """What tmux window WINDOW of session dflash shows in CT200 ('' when there is none)."""
    return attach(status, "tmux", "capture-pane", "-p", "-J", "-t", "=dflash:%s" % window, "-S", "-%d" % lines,
                  check=False).stdout


def first_step(text: str) -> Optional[int]:
    hit = re.search(r"^step (\d+)", text, re.M)
    return int(hit.group(1)) if hit else None


def windows(status: dict) -> List[str]:
    """The window names of tmux session dflash in CT200."""
    return attach(status, "tmux", "list-windows", "-t", "=dflash", "-F", "#{window_name}", check=False).stdout.split()


def trains_from(status: dict, checkpoint: dict) -> str:
    """Assert that the restored job trains in CT200 from CHECKPOINT (a launch record's): its first step the one
    after the checkpoint's, every fake GPU held. What its window shows."""
    shown = pane(status)
    assert first_step(shown) == checkpoint["step"] + 1, shown
    assert held_gpus(status) == ALL_GPUS
    return shown


def gpus_free_after(status: dict, since: float, timeout: float) -> Tuple[bool, float]:
    """(every fake GPU back to its baseline, seconds after SINCE when it was seen so), polled every 0.25 s."""
    deadline = time.monotonic() + timeout
    while True:
        if max(gpu_used(status).values()) <= FREE_MIB:
            return True, time.time() - since
        if time.monotonic() > deadline:
            return False, time.time() - since
        time.sleep(0.25)


def held_gpus(status: dict) -> List[str]:
    return sorted(gpu for gpu, mib in gpu_used(status).items() if mib > FREE_MIB)


def summary_lines(output: str) -> str:
    """The restore's summary task output (the debug msg lines)."""
    start = output.find("Report | Summary")
    return output[start:start + 4000] if start >= 0 else output[-4000:]


def proc_cmdline(status: dict, pid: int) -> List[str]:
    """Process PID's argv in CT200 as the kernel holds it (/proc/PID/cmdline); [] when it is gone."""
    raw = attach(status, "cat", "/proc/%d/cmdline" % pid, check=False).stdout
    return raw.split("\0")[:-1] if raw else []


def kernel_argv(status: dict, argv: List[str]) -> List[str]:
    """The argv the kernel gives a process started as ARGV in CT200: a script's ``#!`` interpreter (and its one
    argument) first, then the script's path as given, then the rest (a console script such as torchrun)."""
    first = attach(status, "head", "-c", "256", argv[0], check=False).stdout.split("\n", 1)[0]
    if not first.startswith("#!"):
        return list(argv)
    interpreter = first[2:].strip().split(None, 1)
    return interpreter + list(argv)


def window_pane_pid(status: dict, window: str = "train", session: str = "dflash") -> Optional[int]:
    """The pane process of window WINDOW of tmux session SESSION in CT200 (None when there is no such window)."""
    done = attach(status, "tmux", "list-panes", "-t", "=%s:%s" % (session, window), "-F", "#{pane_pid}", check=False)
    words = done.stdout.split()
    return int(words[0]) if done.returncode == 0 and words and words[0].isdigit() else None


def child_pids(status: dict, pid: int) -> List[int]:
    """The direct children of PID in CT200."""
    rows = attach(status, "ps", "-eo", "pid=,ppid=").stdout.split()
    return sorted(int(rows[i]) for i in range(0, len(rows) - 1, 2) if rows[i + 1] == str(pid))


def devices_held(status: dict, pid: int) -> List[str]:
    """The /dev/nvidia* files process PID holds open in CT200 (its /proc/PID/fd links)."""
    done = attach(status, "find", "/proc/%d/fd" % pid, "-lname", "/dev/nvidia*", "-printf", "%l\\n", check=False)
    return sorted(set(done.stdout.split()))


def fresh_job(status: dict) -> None:
    """The stubborn trainer saving every 5 steps as a new job, once it saved: no checkpoint of an earlier test's
    trainer beside it (the fake trainer always starts at the same step, so an earlier save would be newer by step;
    the directory is emptied with no trainer running)."""
    done = lab_cli("trainer", "none")
    assert done.returncode == 0, done.stderr + done.stdout
    attach(status, "find", CKPT_DIR, "-maxdepth", "1", "-name", "ckpt-step*", "-delete", check=False)
    stubborn_with_checkpoints(5)
    wait_for_checkpoint(status, CKPT_DIR)


def stopped_with_record(status: dict) -> dict:
    """A fresh stubborn job stopped by the stop half alone (playbooks/repurpose_ct200.yml, no data half): its
    launch record."""
    fresh_job(status)
    attach(status, "rm", "-f", RECORD)
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [FAST, STUBBORN_STOP], timeout=600)
    assert done.rc == 0, done.output[-4000:]
    return read_record(status)
