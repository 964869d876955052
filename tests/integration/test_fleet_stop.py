# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop half at fleet scale, for real, against the two-node lab (``tests/lab/lab up --nodes 2``).

``playbooks/repurpose_ct200.yml`` with ``inventories/lab-fleet`` (the lab lane's rendering of it): CT200 behind
the lab's PVE host (127.0.0.1:2222 in lane 0) and CT210 behind the second one (127.0.0.1:2223), each with its own
trainer and its own 8 fake GPUs. Both are stopped in one run, each under its own lock with its own summary, then one
fleet summary; a container that fails (its ladder, or its lock held by another run) does not stop the
other, and ``--limit`` re-runs just it. Skipped with the reason when the second node is not up.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import acquire, controller_identity
from tests.support.ct200 import LOCK
from tests.support.lab import MAIN_CT, NODE2_CT, lab_status, trainer
from tests.support.paths import FLEET_INVENTORY
from tests.support.playbook import PlaybookRun, recap, run_playbook
from tests.support.ssh import attach, on_host
from tests.support.stop_training import REPURPOSE_PLAYBOOK

LADDER = [
    {"signal": "SIGINT", "via": "tmux", "timeout": 20},
    {"signal": "SIGTERM", "timeout": 10},
    {"signal": "SIGKILL", "timeout": 5},
]
FAST = {"repurpose_datagen": False, "stop_training_gpu_timeout": 30}

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet, pytest.mark.timeout(900)]


def trainers(status: dict) -> dict[str, dict]:
    return {MAIN_CT: status["trainer"], NODE2_CT: status["node2"]["trainer"]}


def host_gpus(status: dict, port: int) -> list[int]:
    """MiB used per GPU, from the nvidia-smi of the PVE host on ``port`` (each lab host shows its own GPUs)."""
    done = on_host(status, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits", port=port, timeout=60)
    return [int(line) for line in done.stdout.split()]


def play(*args: str, extra: dict | None = None) -> PlaybookRun:
    """The repurpose playbook on the two-node lab's inventory with ``FAST``, then EXTRA, then ARGS."""
    return run_playbook(REPURPOSE_PLAYBOOK, FLEET_INVENTORY, [FAST] + ([extra] if extra else []), args)


def lock_record(status: dict, vmid: str) -> str:
    """The stop_training run lock file in container VMID, read through lxc-attach (not the code under test);
    '' when nobody holds it."""
    return attach(status, "cat", LOCK, vmid=vmid, check=False).stdout.strip()


def task_output(out: str, name: str) -> str:
    """What the default callback printed under the one task whose header holds NAME (asserted to be one)."""
    assert out.count(name) == 1, "%r %d times" % (name, out.count(name))
    start = out.index(name)
    end = out.find("\nTASK [", start)
    return out[start:end if end >= 0 else len(out)]


def fleet_lines(out: str) -> list[str]:
    """The fleet summary's lines (the debug task's msg list), joined back where YAML output wrapped them."""
    start = out.index("Fleet | Summary")
    block = out[start:out.index("PLAY RECAP", start)]
    items, cur = [], None
    for line in block.splitlines():
        stripped = line.strip()
        if stripped.startswith("- "):
            if cur is not None:
                items.append(cur)
            cur = stripped[2:].strip("'")
        elif cur is not None and stripped and not stripped.startswith("TASK"):
            cur += " " + stripped.strip("'")
        elif stripped.startswith("TASK"):
            break
    if cur is not None:
        items.append(cur)
    return items


def test_both_nodes_are_stopped_in_one_run_with_a_fleet_summary(fleet):
    for vmid in (MAIN_CT, NODE2_CT):
        trainer("graceful", vmid)
    assert all(max(host_gpus(fleet, port)) > 1000 for port in (fleet["port"], fleet["node2"]["port"]))
    done = play(extra={"stop_training_ladder": LADDER})
    out = done.output
    assert done.rc == 0, out[-4000:]
    # each container its own plan and summary, through its own PVE host
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free." in out
    assert f"RESULT: CT {NODE2_CT} on lab-pve2: training stopped, GPUs free." in out
    assert f"Plan, before any signal: CT {MAIN_CT} on lab-pve" in out
    assert f"Plan, before any signal: CT {NODE2_CT} on lab-pve2" in out
    # each its own lock, in its own container, released at the end
    taken = task_output(out, "Lock | Take the run lock")
    assert "ok: [ct200]" in taken and "ok: [ct210]" in taken, taken
    status = lab_status()
    assert not any(t["running"] for t in trainers(status).values())
    # both nodes' GPUs are free, each as its own PVE host's nvidia-smi sees them
    for port in (status["port"], status["node2"]["port"]):
        assert max(host_gpus(status, port)) < 100, port
    assert lock_record(status, MAIN_CT) == "" and lock_record(status, NODE2_CT) == ""
    # one fleet summary, at the end, for both
    assert out.count("Fleet | Summary]") == 1, out[-4000:]
    lines = fleet_lines(out)
    assert lines[0].startswith("FLEET: 2 of 2 container(s) stopped with their GPUs free"), lines
    assert any(line.startswith(f"ct200 (CT {MAIN_CT} on lab-pve): stopped, 9 process(es) by rung SIGINT") and
               "GPUs free 8/8" in line for line in lines), lines
    assert any(line.startswith(f"ct210 (CT {NODE2_CT} on lab-pve2): stopped, 9 process(es) by rung SIGINT") and
               "GPUs free 8/8" in line for line in lines), lines
    assert not any("Re-run just these" in line for line in lines)


def test_a_failing_container_never_stops_the_other_and_limit_reruns_it(fleet, tmp_path):
    """CT210's trainer ignores Ctrl-C and SIGTERM and its ladder has no SIGKILL: it fails; CT200 is stopped
    all the same; the summary names the failure and the --limit; a re-run with --limit ct210 stops only it."""
    trainer("graceful", MAIN_CT)
    stubborn = trainer("stubborn", NODE2_CT)
    # per-host ladders (an -e would override both): CT210's stops at SIGTERM
    ladders = tmp_path / "ladders.yml"
    ladders.write_text(json.dumps({"training_containers": {"hosts": {
        "ct200": {"stop_training_ladder": LADDER},
        "ct210": {"stop_training_ladder": [{"signal": "SIGINT", "via": "tmux", "timeout": 3},
                                           {"signal": "SIGTERM", "timeout": 3}]},
    }}}))
    done = play("-i", str(ladders))
    out = done.output
    assert done.rc != 0, out[-4000:]
    assert recap(out, "ct200")["failed"] == 0 and recap(out, "ct210")["failed"] == 1
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free." in out
    status = lab_status()
    assert not status["trainer"]["running"]
    assert status["node2"]["trainer"]["running"]  # never SIGKILLed: its ladder has no such rung
    assert status["node2"]["trainer"]["host_pids"]["launcher"] == stubborn["host_pids"]["launcher"]
    lines = fleet_lines(out)
    assert lines[0].startswith("FLEET: 1 of 2 container(s) stopped"), lines
    failed = [line for line in lines if line.startswith(f"ct210 (CT {NODE2_CT} on lab-pve2): FAILED in stop_training")]
    assert failed, lines
    assert "Re-run just these: ansible-playbook ... --limit ct210" in lines
    # the re-run of just the failed one, with a ladder that ends it
    again = play("--limit", "ct210", extra={"stop_training_ladder": LADDER})
    out2 = again.output
    assert again.rc == 0, out2[-4000:]
    assert "ct200" not in out2.split("PLAY RECAP")[1]
    assert f"RESULT: CT {NODE2_CT} on lab-pve2: training stopped, GPUs free." in out2
    lines2 = fleet_lines(out2)
    assert lines2[0].startswith("FLEET: 1 of 1 container(s) stopped"), lines2
    assert not lab_status()["node2"]["trainer"]["running"]


def test_a_lock_held_on_one_container_holds_back_only_that_one(fleet):
    """Another run (this test process, alive on this controller) holds CT210's run lock: CT210 fails after its
    bounded wait, naming that run, with nothing signalled; CT200, under its own lock, is stopped all the same."""
    trainer("graceful", MAIN_CT)
    before = trainer("graceful", NODE2_CT)
    me = dict(controller_identity(os.getpid(), os.uname().nodename), user="awx", awx_job_id="41")
    with tempfile.TemporaryDirectory() as tmp:  # the holder record as run_lock writes it (_lock.acquire)
        local = Path(tmp) / "stop_training.lock"
        acquire(str(local), "other-run", me, 0, 600)
        record = local.read_text()
    attach(fleet, "sh", "-c", 'mkdir -p "${1%/*}" && printf %s "$2" > "$1"', "sh", LOCK, record, vmid=NODE2_CT)
    try:
        done = play(extra={"stop_training_ladder": LADDER, "stop_training_lock_timeout": 2})
    finally:
        held = lock_record(fleet, NODE2_CT)
        attach(fleet, "rm", "-f", LOCK, vmid=NODE2_CT)
    out = done.output
    assert done.rc != 0, out[-4000:]
    assert recap(out, "ct200")["failed"] == 0 and recap(out, "ct210")["failed"] == 1
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free." in out
    assert f"Another run holds the stop_training lock on CT {NODE2_CT}" in out and "run other-run, AWX job 41" in out
    assert json.loads(held)["run_id"] == "other-run", held  # never taken over from a live run
    status = lab_status()
    assert not status["trainer"]["running"] and lock_record(status, MAIN_CT) == ""
    # nothing signalled on CT210: the same trainer still runs
    assert status["node2"]["trainer"]["running"]
    assert status["node2"]["trainer"]["host_pids"]["launcher"] == before["host_pids"]["launcher"]
    lines = fleet_lines(out)
    assert lines[0].startswith("FLEET: 1 of 2 container(s) stopped"), lines
    assert any(line.startswith(f"ct210 (CT {NODE2_CT} on lab-pve2): FAILED in stop_training") and "other-run" in line
               for line in lines), lines
    assert "Re-run just these: ansible-playbook ... --limit ct210" in lines
