"""CT200 seen from outside the code under test: its processes, tmux panes, init, the run lock, the fake GPUs.

Every view goes through the lab's own paths (ssh + ``pct exec``, ``lxc-info``, the fake
GPUs' state file), so a test judges the collection against what really happened.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Dict, List, Optional, Set, Tuple

from tests.support.lab import MAIN_CT
from tests.support.paths import FAKEGPU_DIR
from tests.support.ssh import in_ct

# The stop_training role's lock file inside the container.
LOCK = "/run/gpuops-repurpose/stop_training.lock"
# The fake trainer's launcher and workers (tests/lab/trainer/fake_trainer.py), however python is spelled.
TRAINER_RE = re.compile(r"^\S*python[0-9.]*\s+(-\S+\s+)*\S*fake_trainer\.py(\s|$)")


def ps_table(ps_output: str) -> Dict[int, Tuple[str, str]]:
    """PID -> (second column, command line) from ``ps -eo pid=,COLUMN=,args=`` output (the one ``ps`` parser)."""
    rows = {}
    for line in ps_output.splitlines():
        fields = line.split(None, 2)
        if len(fields) >= 2 and fields[0].isdigit():
            rows[int(fields[0])] = (fields[1], fields[2].strip() if len(fields) > 2 else "")
    return rows


def ct_ps(status: dict, column: str) -> Dict[int, Tuple[str, str]]:
    """Container PID -> (ps's COLUMN, as ``ppid`` or ``stat``, command line) of every process in CT200."""
    return ps_table(in_ct(status, "ps", "-eo", "pid=,%s=,args=" % column).stdout)


def ct_process_table(status: dict) -> Dict[int, Tuple[int, str]]:
    """Container PID -> (parent PID, command line) of every process in CT200."""
    return {pid: (int(ppid), args) for pid, (ppid, args) in ct_ps(status, "ppid").items()}


def ct_processes(status: dict) -> Dict[int, str]:
    """Container PID -> command line of every process in CT200."""
    return {pid: args for pid, (_ppid, args) in ct_process_table(status).items()}


def trainer_pids(status: dict) -> Set[int]:
    """The fake trainer's processes in CT200 (launcher and workers)."""
    return {pid for pid, args in ct_processes(status).items() if TRAINER_RE.search(args)}


def is_decoy(args: str) -> bool:
    """ARGS is one of the lab's decoys: the networkd-dispatcher-like daemon, the editor, the monitor loop."""
    return "networkd-dispatcher" in args or args.startswith(("vi ", "watch "))


def decoy_pids(status: dict) -> Set[int]:
    """The lab's decoys (:func:`is_decoy`) running in CT200. Not the short-lived fork ``watch`` makes every
    interval before it runs its command (same command line, parent ``watch``): it is gone a moment later,
    by design, and a check that a decoy is still there must not count it."""
    procs = ct_process_table(status)
    return {pid for pid, (ppid, args) in procs.items()
            if is_decoy(args) and not (ppid in procs and procs[ppid][1] == args)}


def pane_pids(status: dict, session: str) -> List[int]:
    """The pane processes of tmux session SESSION (exact name) in CT200; [] when there is no such session."""
    done = in_ct(status, "tmux", "list-panes", "-t", "=%s:" % session, "-F", "#{pane_pid}", check=False)
    return [int(word) for word in done.stdout.split() if word.isdigit()] if done.returncode == 0 else []


def gpu_used(status: dict) -> Dict[str, int]:
    """Memory per GPU from the fake GPUs' own state (the truth the modules are judged against)."""
    done = subprocess.run(
        [sys.executable, str(FAKEGPU_DIR / "fakegpu.py"), "--dir", status["fakegpu"]["dir"], "state"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return {str(k): int(v) for k, v in json.loads(done.stdout)["used_mib"].items()}


def lock_holder(status: dict) -> Optional[dict]:
    """The stop_training run lock's holder record in CT200, or None when nobody holds it."""
    done = in_ct(status, "cat", LOCK, check=False)
    return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else None


def assert_stopped_cleanly(status: dict, summary: str, decoys: Set[int]) -> None:
    """What the stop half leaves when it succeeded: its summary says so, no trainer process, the decoys (DECOYS,
    taken before the run) untouched, every fake GPU down to its baseline, the run lock free."""
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free" in summary, summary
    assert not trainer_pids(status)
    assert decoy_pids(status) == decoys
    assert max(gpu_used(status).values()) <= 512
    assert lock_holder(status) is None


def ct_init_pid(status: dict, vmid: str = MAIN_CT) -> Optional[int]:
    """The container's init as a host PID (lxc-info on the lab's lxcpath): a new one means it really restarted."""
    done = subprocess.run(["lxc-info", "-P", status["lxcpath"], "-n", vmid, "-p", "-H"],
                          capture_output=True, text=True, timeout=30, check=False)
    return int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() else None
