"""What the stop half's fault tests check in CT200 after a fault, and how they cut the SSH link under a ladder.

The checks (the lab's signal audit, the decoys, the checkpoints) and the link-cut helpers (the
``training_stop`` ladder records, the pct_ssh control master, the lab sshd's process serving it) are
shared by tests/faults/test_stop_half_faults.py, tests/faults/test_dead_link_faults.py and
tests/integration/test_pct_ssh_dead_link.py.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import pytest
from signal_audit import read_audit

from ansible_collections.gpuops.repurpose.plugins.module_utils import _proc
from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from tests.support import ct200, ssh
from tests.support import lab as lab_support
from tests.support.procfs import descendants, serving_processes

# the catchable rungs, and the SIGCONT training_stop sends every process of its snapshot after each of them
# (so a stopped process can act on it); SIGKILL is seen by the process's absence
RUNG_SIGNALS = {"SIGINT", "SIGTERM", "SIGCONT"}


# ---------------------------------------------------------------- the signal audit, decoys, checkpoints

def audit(lab: dict) -> List[dict]:
    """Every audited process's record (role, pid, boot_id, signals received), from the lab's audit directory."""
    return read_audit(lab["signal_audit"]["host_dir"])


def audit_boot(lab: dict) -> str:
    return ssh.in_ct(lab, "cat", "/proc/sys/kernel/random/boot_id").stdout.strip()


def stopped_states(lab: dict, pids: Iterable[int]) -> List[int]:
    """Those of PIDS in CT200 that are stopped (state T)."""
    pids = set(pids)
    if not pids:
        return []
    return sorted(pid for pid, (stat, _args) in ct200.ct_ps(lab, "stat").items() if pid in pids and stat.startswith("T"))


def checkpoint_ok(lab: dict) -> bool:
    """Every checkpoint the fake trainer left in CT200 verifies (its own check: size, digest, ``latest``)."""
    py = ("import fake_trainer as f, glob;"
          "bad = [p for p in glob.glob('/root/dflash/checkpoints/ckpt-*.bin') if f.verify_checkpoint(p) is None];"
          "print(len(bad))")
    done = ssh.in_ct(lab, "env", "PYTHONPATH=/opt/lab/trainer", "python3", "-c", py, check=False)
    return done.returncode == 0 and done.stdout.strip() == "0"


def wrongly_signalled(lab: dict, decoys_before: Set[int]) -> int:
    """Decoys hurt since DECOYS_BEFORE was taken: the networkd-dispatcher lookalike with any signal in its
    audit (this boot), a decoy gone, or one stopped."""
    boot = audit_boot(lab)
    wrong = sum(1 for rec in audit(lab) if rec["boot_id"] == boot and rec["role"] == "networkd-dispatcher"
                and rec["pid"] in decoys_before and rec["signals"])
    now = ct200.decoy_pids(lab)
    return wrong + len(set(decoys_before) - set(now)) + len(stopped_states(lab, now))


def job_signals(lab: dict, job: Set[int]) -> Dict[int, Tuple[str, List[str]]]:
    """PID -> (role, signals received) for the audited processes of JOB in this boot."""
    boot = audit_boot(lab)
    return {rec["pid"]: (rec["role"], rec["signals"]) for rec in audit(lab)
            if rec["boot_id"] == boot and rec["pid"] in job and rec["role"] != "networkd-dispatcher"}


# ---------------------------------------------------------------- the controller's workers

# after a kill of the controller's process group, its workers (outside that group) must be gone within this:
# pct_ssh ties each to its controller (the kernel's parent-death signal, then the worker's own SIGTERM handler)
WORKER_EXIT_BOUND_S = 5.0


def _argv(pid: int) -> str:
    with open("/proc/%d/cmdline" % pid, "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")


def gone(pid: int) -> bool:
    """PID has exited (no such process, or a zombie)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def controller_tree(root: int) -> Dict[int, str]:
    """PID -> argv of ROOT's descendants now (its task workers, which setsid out of its group), the pct_ssh
    control master left out: it is meant to outlive a run (control_persist)."""
    tree = {}
    for pid in descendants(root):
        try:
            argv = _argv(pid)
        except OSError:
            continue
        if "-m _pct_ssh --serve" not in argv:
            tree[pid] = argv
    return tree


def still_running(pid: int, argv: str) -> bool:
    """PID still runs ARGV (not gone, not a zombie, not a reused PID)."""
    try:
        return _argv(pid) == argv and not gone(pid)
    except OSError:
        return False


def workers_gone_within_bound(workers: Dict[int, str]) -> float:
    """Wait until every one of WORKERS (from :func:`controller_tree`) has exited; AssertionError naming the
    survivors after WORKER_EXIT_BOUND_S, which are then SIGKILLed by PID (this run's own processes, never
    left behind). The seconds it took."""
    start = time.monotonic()
    end = start + WORKER_EXIT_BOUND_S
    while time.monotonic() < end and any(still_running(p, a) for p, a in workers.items()):
        time.sleep(0.05)
    survivors = {p: a for p, a in workers.items() if still_running(p, a)}
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "workers outlived their killed controller by %ss: %s" % (WORKER_EXIT_BOUND_S, survivors)
    return time.monotonic() - start


# ---------------------------------------------------------------- training_stop's ladder records, the link

def ladder_records(lab: dict) -> List[dict]:
    """training_stop's ladder records in CT200's /run (read through the container init's root)."""
    init = ct200.ct_init_pid(lab)
    assert init, "CT200 has no init (not running?)"
    found = []
    for path in glob.glob("/proc/%s/root/run/gpuops-repurpose/training_stop-*.json" % init):
        try:
            with open(path) as handle:
                found.append(json.load(handle))
        except (OSError, ValueError):
            pass
    return found


def latest_record(records: Sequence[Mapping], since: float, session: str = "dflash") -> dict:
    """Of RECORDS, the latest ladder record for tmux session SESSION started at or after SINCE (wall clock);
    {} if none."""
    mine = [r for r in records
            if "tmux_session=%s" % session in r.get("selection", "") and r.get("started", 0) >= since]
    return dict(max(mine, key=lambda r: r["started"])) if mine else {}


def my_record(lab: dict, since: float, session: str = "dflash") -> dict:
    """The latest ladder record for tmux session SESSION started at or after SINCE (wall clock); {} if none."""
    return latest_record(ladder_records(lab), since, session)


def master_pid(control_dir: str) -> Tuple[_pct_ssh.MasterClient, int]:
    """The one pct_ssh control master serving CONTROL_DIR: its client and its PID (it says so when pinged)."""
    socks = glob.glob(os.path.join(control_dir, "*.sock"))
    assert len(socks) == 1, socks
    client = _pct_ssh.MasterClient(socks[0])
    return client, client._call({"op": "ping"}, timeout=5)[0]["pid"]


def serving_sshd(lab: dict, client_pid: int, sshd_pid: Optional[int] = None) -> List[int]:
    """The lab sshd's processes holding the server end of CLIENT_PID's connection: only the lab sshd's own
    descendants (of SSHD_PID, default the listener in LAB) are candidates, never anything else on this machine."""
    return serving_processes(client_pid, lab["port"], descendants(sshd_pid or lab["sshd"]["pid"]))


def stop_masters(control_dir: str) -> None:
    """Ask every control master in CONTROL_DIR to exit (a test's own directory: nobody else's masters)."""
    for sock in glob.glob(os.path.join(control_dir, "*.sock")):
        try:
            _pct_ssh.MasterClient(sock).stop()
        except Exception:  # noqa: BLE001 - best effort at the end of a test: a master already gone is fine
            pass


def result_of(out: str, host: str = "ct200") -> Tuple[str, dict]:
    """(status, result) of HOST's line in ``ansible -o`` output: ``SUCCESS``/``CHANGED``/``FAILED!`` with
    the JSON result, or ``UNREACHABLE!`` with ``{"msg": ...}``."""
    line = [ln for ln in out.splitlines() if ln.startswith(host + " | ")]
    assert line, out
    rest = line[0][len(host + " | "):]
    if " => " in rest:
        status, _sep, payload = rest.partition(" => ")
        return status.strip(), json.loads(payload)
    status, _sep, msg = rest.partition(": ")  # UNREACHABLE!: MSG, on one line
    return status.strip(), {"msg": msg}


def audited(lab: dict) -> Iterator[dict]:
    """The body of a stop-half fault file's module-scoped ``lab`` fixture: the shared ``lab`` (its skip rule)
    with the signal audit required, and the default trainer put back afterwards."""
    if not lab.get("signal_audit"):
        pytest.skip("the lab predates the signal audit: run tests/lab/lab up from this checkout")
    yield lab
    lab_support.restore_trainer()


# ---------------------------------------------------------------- what a killed run left in CT200

LOCK_FREE = "free"
LOCK_DEAD_HOLDER = "held by a run whose ansible-playbook is gone"
LOCK_LIVE_HOLDER = "held by a running ansible-playbook"


@dataclass(frozen=True)
class LeftBehind:
    """The fingerprint of what a killed run left for the re-run to read in CT200.

    Only what changes the re-run's course is kept: how many of the job's processes still run and how many
    of those are stopped (``T``), the run lock (free, or held by a dead or a live controller), a
    ``training_stop`` ladder still running, the ladder record the killed run wrote (state, the rung that
    stopped the job, the rungs sent) and the GPUs holding memory. PIDs, times and step numbers differ
    between two kills that leave the same state, so they are left out; a record older than the killed run
    is read by the re-run only for its ``previous`` (its course is set by the processes it finds), so only
    one of them still running counts.
    """

    job_running: int
    job_stopped: int
    lock: str
    ladder_running: bool
    ladder: Tuple[str, ...]
    gpus_held: Tuple[str, ...]

    def describe(self) -> str:
        ladder = "/".join(self.ladder) if self.ladder else "none"
        return ("job processes running %d (stopped T %d), lock %s, ladder running %s, the killed run's ladder "
                "record %s, GPUs holding memory %s" % (self.job_running, self.job_stopped, self.lock,
                                                       "yes" if self.ladder_running else "no", ladder,
                                                       ",".join(self.gpus_held) or "none"))


def left_behind(states: Mapping[int, Tuple[str, str]], job: Set[int], holder: Optional[Mapping],
                holder_alive: bool, records: Sequence[Mapping], since: float,
                gpu_used: Mapping[str, int]) -> LeftBehind:
    """The fingerprint (:class:`LeftBehind`) of CT200's STATES (``ct200.ct_ps(lab, "stat")``) for the job's processes JOB,
    the run lock's HOLDER record (None: free) and whether its controller runs (HOLDER_ALIVE), the ladder
    RECORDS, the run killed having started at SINCE (wall clock), and GPU_USED (MiB per GPU)."""
    running = {pid: st for pid, (st, _args) in states.items() if pid in job and not st.startswith("Z")}
    mine = latest_record(records, since)
    live_ladder = any(r.get("state") == "running" and r.get("pid") in states
                      and not states[r["pid"]][0].startswith("Z") for r in records)
    ladder: Tuple[str, ...] = ()
    if mine:
        ladder = (str(mine.get("state")), "stopped by %s" % (mine.get("stopped_by") or "none"),
                  *("rung %s" % r.get("signal") for r in mine.get("rungs") or []))
    lock = LOCK_FREE if not holder else (LOCK_LIVE_HOLDER if holder_alive else LOCK_DEAD_HOLDER)
    return LeftBehind(job_running=len(running), job_stopped=sum(1 for st in running.values() if st.startswith("T")),
                      lock=lock, ladder_running=live_ladder, ladder=ladder,
                      gpus_held=tuple(sorted(g for g, mib in gpu_used.items() if mib > 0)))


def ct_path(lab: dict, path: str) -> str:
    """PATH inside CT200 as this machine reads it (through the container init's root: no ssh)."""
    init = ct200.ct_init_pid(lab)
    assert init, "CT200 has no init (not running?)"
    return "/proc/%d/root%s" % (init, path)


def read_lock(lab: dict) -> Optional[dict]:
    """The run lock's holder record in CT200 (:data:`ct200.LOCK`), None when free; read without ssh."""
    try:
        with open(ct_path(lab, ct200.LOCK), encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    return json.loads(text) if text.strip() else None


def controller_running(holder: Mapping) -> bool:
    """The lock holder's ansible-playbook still runs on this machine (its PID with the start time it recorded;
    a holder from another controller counts as running: this machine cannot tell).

    The test's own rule, not ``_lock.controller_alive`` (the take-over it checks): a zombie, an unreadable or
    a missing PID count as gone here."""
    if holder.get("controller") != os.uname().nodename:
        return True
    try:
        stat = _proc.read_stat(int(holder.get("controller_pid") or 0))
    except (OSError, ValueError, _proc.ProcError):
        return False
    started = holder.get("controller_started")
    return stat is not None and stat.state != "Z" and (not isinstance(started, int) or stat.starttime == started)


def read_left_behind(lab: dict, job: Set[int], since: float) -> Tuple[LeftBehind, Dict[int, Tuple[str, str]]]:
    """What the run killed after starting at SINCE left in CT200 (:func:`left_behind`), and the processes seen
    (one ``ps`` in CT200; the lock, records and GPUs are read on this machine)."""
    states = ct200.ct_ps(lab, "stat")
    holder = read_lock(lab)
    return left_behind(states, job, holder, bool(holder) and controller_running(holder), ladder_records(lab), since,
                       ct200.gpu_used(lab)), states
