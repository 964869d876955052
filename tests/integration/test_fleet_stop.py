# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stop half at fleet scale, for real, against the two-node lab (``tests/lab/lab up --nodes 2``).

``playbooks/repurpose_ct200.yml`` with ``inventories/lab-fleet``: CT200 behind the lab's PVE host
(127.0.0.1:2222) and CT210 behind the second one (127.0.0.1:2223), each with its own trainer and its
own 8 fake GPUs. Both are stopped in one run, each under its own lock with its own summary, then one
fleet summary; a container that fails does not stop the other, and ``--limit`` re-runs just it.
Skipped with the reason when the second node is not up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tests" / "lab" / "lab"
BIN = Path(sys.executable).parent
PLAYBOOK = ROOT / "playbooks" / "repurpose_ct200.yml"
INVENTORY = ROOT / "inventories" / "lab-fleet"
LADDER = [
    {"signal": "SIGINT", "via": "tmux", "timeout": 20},
    {"signal": "SIGTERM", "timeout": 10},
    {"signal": "SIGKILL", "timeout": 5},
]
FAST = {"repurpose_datagen": False, "stop_training_gpu_timeout": 30}

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet, pytest.mark.timeout(900)]


def lab_status() -> dict:
    res = subprocess.run([str(LAB), "status"], capture_output=True, text=True, timeout=60, check=False)
    try:
        return json.loads(res.stdout)
    except ValueError:
        return {}


def trainer(behaviour: str, ct: str) -> dict:
    res = subprocess.run([str(LAB), "trainer", behaviour, "--ct", ct], capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def trainers(status: dict) -> dict[str, dict]:
    return {"200": status["trainer"], "210": status["node2"]["trainer"]}


def host_gpus(status: dict, port: int) -> list[int]:
    """MiB used per GPU, from the nvidia-smi of the PVE host on ``port`` (each lab host shows its own GPUs)."""
    res = subprocess.run(status["ssh"][:-2] + ["-p", str(port), "root@127.0.0.1",
                                               "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True)
    return [int(line) for line in res.stdout.split()]


def play(*args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1")
    cmd = [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), *args, str(PLAYBOOK), "-e", json.dumps(FAST)]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def recap(out: str, host: str) -> dict[str, int]:
    import re

    m = re.search(r"^%s\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host), out, re.M)
    assert m, "no recap for %s in:\n%s" % (host, out[-3000:])
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


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


@pytest.fixture(scope="module")
def fleet():
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    status = lab_status()
    if not status.get("up") or status.get("nodes", 1) < 2:
        pytest.skip("the two-node lab is not up (run: tests/lab/lab up --nodes 2)")
    yield status
    # Leave both nodes as the other suites expect them: the graceful trainers running.
    for ct in ("200", "210"):
        subprocess.run([str(LAB), "trainer", "graceful", "--ct", ct], capture_output=True, timeout=300, check=False)


def test_both_nodes_are_stopped_in_one_run_with_a_fleet_summary(fleet):
    for ct in ("200", "210"):
        trainer("graceful", ct)
    assert all(max(host_gpus(fleet, port)) > 1000 for port in (fleet["port"], fleet["node2"]["port"]))
    done = play(extra={"stop_training_ladder": LADDER})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # each container its own plan and summary, through its own PVE host
    assert "RESULT: CT 200 on lab-pve: training stopped, GPUs free." in out
    assert "RESULT: CT 210 on lab-pve2: training stopped, GPUs free." in out
    assert out.count("Stop | Plan") >= 1 and "ok: [ct210]" in out
    status = lab_status()
    assert not any(t["running"] for t in trainers(status).values())
    # both nodes' GPUs are free, each as its own PVE host's nvidia-smi sees them
    for port in (status["port"], status["node2"]["port"]):
        assert max(host_gpus(status, port)) < 100, port
    lines = fleet_lines(out)
    assert lines[0].startswith("FLEET: 2 of 2 container(s) stopped with their GPUs free"), lines
    assert any(line.startswith("ct200 (CT 200 on lab-pve): stopped, 9 process(es) by rung SIGINT") and
               "GPUs free 8/8" in line for line in lines), lines
    assert any(line.startswith("ct210 (CT 210 on lab-pve2): stopped, 9 process(es) by rung SIGINT") and
               "GPUs free 8/8" in line for line in lines), lines
    assert not any("Re-run just these" in line for line in lines)


def test_a_failing_container_never_stops_the_other_and_limit_reruns_it(fleet, tmp_path):
    """CT210's trainer ignores Ctrl-C and SIGTERM and its ladder has no SIGKILL: it fails; CT200 is stopped
    all the same; the summary names the failure and the --limit; a re-run with --limit ct210 stops only it."""
    trainer("graceful", "200")
    stubborn = trainer("stubborn", "210")
    # per-host ladders (an -e would override both): CT210's stops at SIGTERM
    ladders = tmp_path / "ladders.yml"
    ladders.write_text(json.dumps({"training_containers": {"hosts": {
        "ct200": {"stop_training_ladder": LADDER},
        "ct210": {"stop_training_ladder": [{"signal": "SIGINT", "via": "tmux", "timeout": 3},
                                           {"signal": "SIGTERM", "timeout": 3}]},
    }}}))
    done = play("-i", str(ladders))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-4000:]
    assert recap(out, "ct200")["failed"] == 0 and recap(out, "ct210")["failed"] == 1
    assert "RESULT: CT 200 on lab-pve: training stopped, GPUs free." in out
    status = lab_status()
    assert not status["trainer"]["running"]
    assert status["node2"]["trainer"]["running"]  # never SIGKILLed: its ladder has no such rung
    assert status["node2"]["trainer"]["host_pids"]["launcher"] == stubborn["host_pids"]["launcher"]
    lines = fleet_lines(out)
    assert lines[0].startswith("FLEET: 1 of 2 container(s) stopped"), lines
    failed = [line for line in lines if line.startswith("ct210 (CT 210 on lab-pve2): FAILED in stop_training")]
    assert failed, lines
    assert "Re-run just these: ansible-playbook ... --limit ct210" in lines
    # the re-run of just the failed one, with a ladder that ends it
    again = play("--limit", "ct210", extra={"stop_training_ladder": LADDER})
    out2 = again.stdout + again.stderr
    assert again.returncode == 0, out2[-4000:]
    assert "ct200" not in out2.split("PLAY RECAP")[1]
    assert "RESULT: CT 210 on lab-pve2: training stopped, GPUs free." in out2
    lines2 = fleet_lines(out2)
    assert lines2[0].startswith("FLEET: 1 of 1 container(s) stopped"), lines2
    assert not lab_status()["node2"]["trainer"]["running"]
