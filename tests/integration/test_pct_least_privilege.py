# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The incident, end to end, as the lab's ``pveops``: only ``pveops ALL=(root) NOPASSWD: /usr/sbin/pct`` on the host.

``-e ansible_user=pveops`` makes both logins pveops: the PVE host's
(``lab-pve``, OpenSSH: pre-flight and restart rung) and the containers'
(``pct_ssh``). No become anywhere. The lab's pct refuses a caller that is not
root (like pct's ``ipcc_send_rec`` permission error), so every step that reached
pct on the host went through ``sudo -n /usr/sbin/pct`` under that one rule.

1. the incident, the whole playbook: the ``stubborn`` trainer (Ctrl-C ignored) is
   stopped and the GPUs are proved free, then sglang_datagen (the lab inventory's
   settings) serves, gates and launches the pipeline, which writes a generated row
   for every prepared prompt; a second run changes nothing;
2. the last rung: GPU memory held by a stray process and ``pct reboot`` hanging
   (the lab's reboot-hang fault): the reboot fails on pct's own timeout, the role
   says it falls back, ``pct stop`` + ``pct start`` bring CT200 back, its status is
   polled, all as pveops, and the summary and the recap (one rescue, no failure)
   say so. This is the lab's one run of the fallback (as root the pct commands are
   the same but for ``sudo -n``; the restart rung as root runs in
   ``test_role_stop_training.py``).

Results come from the JSON callback: every step delegated to the PVE host is a pct
step whose ``cmd`` starts with ``sudo -n /usr/sbin/pct``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.ct200 import (
    assert_stopped_cleanly,
    ct_init_pid,
    ct_processes,
    decoy_pids,
    gpu_used,
    lock_holder,
    trainer_pids,
)
from tests.support.datagen import WORK, generated_rows, prepared_ids, reset_pipeline, wait_pipeline_finished
from tests.support.lab import MAIN_CT, SUDO_USER, lab_cli, lab_status, trainer
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import run_playbook
from tests.support.ssh import attach
from tests.support.ssh import in_ct as ct
from tests.support.stop_training import FAST, REPURPOSE_PLAYBOOK, STUBBORN
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]


PVEOPS = {"ansible_user": SUDO_USER}  # pveops in lane 0
SUDO_PCT = ["sudo", "-n", "/usr/sbin/pct"]
# both halves: the stop ladder kept short, sglang_datagen with the lab inventory's settings
WHOLE = dict(STUBBORN, repurpose_datagen=True)


def play_json(extra: dict) -> tuple[int, dict, str, dict]:
    """The playbook as pveops; returns (rc, {task name: [results for ct200]}, stderr, ct200's recap counts).

    A result of a step delegated to another host is filed under ct200 too (its
    ``_ansible_delegated_vars`` say where it ran).
    """
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [FAST, dict(extra, **PVEOPS)], json_results=True,
                        timeout=800)
    tasks: dict = {}
    for play in done.json["plays"]:
        for task in play["tasks"]:
            if "ct200" in task["hosts"]:
                tasks.setdefault(task["task"]["name"], []).append(task["hosts"]["ct200"])
    return done.rc, tasks, done.stderr, done.json["stats"].get("ct200", {})


def task(tasks: dict, prefix: str) -> dict:
    """The last result that ran (not skipped) of the task whose name starts with PREFIX.

    Names may hold unrendered templates. A task can run more than once: the
    pre-flight runs in the playbook's validation pass and is skipped when the
    role's main tasks come to it.
    """
    found = [results for name, results in tasks.items() if name.split(" : ", 1)[-1].startswith(prefix)]  # "role : name"
    assert len(found) == 1, (prefix, sorted(tasks))
    ran = [result for result in found[0] if not result.get("skipped")]
    assert ran, (prefix, found[0])
    return ran[-1]


def summary(tasks: dict) -> str:
    return "\n".join(task(tasks, "Report | Summary")["msg"])


def only_pct_rule(status: dict) -> None:
    users = status.get("users", {})
    assert users.get(SUDO_USER, {}).get("sudo") == "NOPASSWD: /usr/sbin/pct", users


def on_the_pve_host(tasks: dict, status: dict) -> dict[str, list[dict]]:
    """{task name: results} of every step delegated to the PVE host's address (the lab's sshd).

    Callbacks see a delegated step's host, port, user and connection only (ansible-core's
    task_result.py ``_SUB_PRESERVE``), not the inventory name: the address tells it apart
    from the steps delegated to the controller.
    """
    address = (status["host"], str(status["port"]))
    found: dict[str, list[dict]] = {}
    for name, results in tasks.items():
        for result in results:
            delegated = result.get("_ansible_delegated_vars") or {}
            if (delegated.get("ansible_host"), str(delegated.get("ansible_port"))) == address:
                found.setdefault(name, []).append(result)
    return found


def only_pct_through_sudo_as_pveops(tasks: dict, status: dict) -> None:
    """Every step on the PVE host ran as pveops and its command is ``sudo -n /usr/sbin/pct ...``."""
    host_steps = on_the_pve_host(tasks, status)
    assert host_steps, sorted(tasks)  # the pre-flight at least
    for name, results in host_steps.items():
        for result in results:
            if result.get("skipped"):
                continue
            assert result["_ansible_delegated_vars"].get("ansible_user") == SUDO_USER, (name, result)
            assert result.get("cmd", [])[:3] == SUDO_PCT, (name, result)


def pipeline_report(tasks: dict) -> str:
    """The first line of sglang_datagen's report: ``pipeline: started|running|finished for this config...``."""
    lines = [r["msg"][0] for results in tasks.values() for r in results
             if isinstance(r.get("msg"), list) and r["msg"] and str(r["msg"][0]).startswith("pipeline: ")]
    assert len(lines) == 1, lines
    return lines[0]


def changed_steps(tasks: dict) -> list[str]:
    return sorted(name for name, results in tasks.items() if any(r.get("changed") for r in results))


def test_whole_playbook_as_pveops_with_only_the_pct_sudo_rule(lab):
    only_pct_rule(lab)
    trainer("stubborn")
    assert trainer_pids(lab)
    decoys = decoy_pids(lab)
    reset_pipeline(lab)
    rc, tasks, err, dummy_stats = play_json(WHOLE)
    assert rc == 0, err[-3000:]
    pre = task(tasks, "Pre-flight | Is the container running (asked on its PVE host)")
    assert pre["cmd"][:3] == SUDO_PCT and pre["ct_status"] == "running", pre
    only_pct_through_sudo_as_pveops(tasks, lab)
    assert_stopped_cleanly(lab, summary(tasks), decoys)

    # the second half ran too, through the same pveops session: the pipeline finishes after the play
    assert pipeline_report(tasks).startswith(("pipeline: started", "pipeline: running")), pipeline_report(tasks)
    wait_pipeline_finished(lab, 300)
    rows = generated_rows(lab)
    prepared = prepared_ids(lab)
    assert prepared and {r["id"] for r in rows} >= prepared, (len(rows), len(prepared))
    tokenized = json.loads(attach(lab, "cat", f"{WORK}/tokenized/manifest.json").stdout)
    assert tokenized["rows_out"] == len(prepared), tokenized

    # again as pveops: nothing left to do in either half
    rc, tasks, err, dummy_stats = play_json(WHOLE)
    assert rc == 0, err[-3000:]
    assert changed_steps(tasks) == [], changed_steps(tasks)
    assert "Stopped: nothing, no process was selected" in summary(tasks), summary(tasks)
    assert pipeline_report(tasks).startswith("pipeline: finished for this config"), pipeline_report(tasks)
    only_pct_through_sudo_as_pveops(tasks, lab)
    assert not trainer_pids(lab)


@pytest.mark.parametrize("ha", [False, True], ids=["plain", "ha_managed"])
def test_restart_rung_and_its_fallback_as_pveops(lab, reboot_hang, ha):
    """HA_MANAGED: CT200 an HA resource (``lab ha on``). pct reboot has no HA branch, so it runs (into the fault)
    as before; the fallback's pct stop and pct start then only queue requests with the HA manager and return at
    once, and the rung must report the state the container really reached, not pct's return."""
    only_pct_rule(lab)
    if ha:
        done = lab_cli("ha", "on")
        assert done.returncode == 0, done.stderr
    trainer("graceful")
    ct(lab, "sh", "-c", "setsid -f python3 /opt/lab/fakegpu/fakegpu.py hold --gpu 5 --mib 12345 >/dev/null 2>&1 </dev/null")
    stray = wait_for(lambda: {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a}, 30, "the stray holder")
    init_before = ct_init_pid(lab)
    try:
        rc, tasks, err, stats = play_json({"stop_training_gpu_timeout": 10, "stop_training_restart_container": True,
                                           "stop_training_restart_timeout": 8})
        assert rc == 0, err[-3000:]
        only_pct_through_sudo_as_pveops(tasks, lab)
        reboot = task(tasks, "Restart | pct reboot (bounded by stop_training_restart_timeout)")
        assert reboot["failed"] and reboot["cmd"] == SUDO_PCT + ["reboot", MAIN_CT, "--timeout", "8"], reboot
        assert "container did not stop" in reboot["stderr_lines"], reboot
        # the reboot really ran into the fault: pct's own timeout messages, then the role says it falls back
        assert (f"lxc-stop -n {MAIN_CT} --timeout 8" in reboot["stderr"]
                and "failed: got timeout" in reboot["stderr"]), reboot
        said = task(tasks, "Restart | Say that pct reboot did not complete")["msg"]
        assert said == (f"pct reboot {MAIN_CT} did not complete (container did not stop): falling back to pct stop + "
                        "pct start"), said
        stop = task(tasks, "Restart | pct stop after the failed reboot")
        start = task(tasks, "Restart | pct start")
        assert stop["changed"] and stop["cmd"] == SUDO_PCT + ["stop", MAIN_CT] and stop["ct_status"] == "stopped", stop
        assert (start["changed"] and start["cmd"] == SUDO_PCT + ["start", MAIN_CT]
                and start["ct_status"] == "running"), start
        # HA-managed: pct said only that it asked, and the module waited for the state the HA manager reached
        assert (stop["ha_request"], start["ha_request"]) == (("stop", "start") if ha else (None, None)), (stop, start)
        assert (stop["stdout"], start["stdout"]) == ((f"Requesting HA stop for CT {MAIN_CT}\n",
                                                     f"Requesting HA start for CT {MAIN_CT}\n") if ha else ("", ""))
        polled = task(tasks, "Restart | Wait until the container is running again")
        assert polled["cmd"] == SUDO_PCT + ["status", MAIN_CT] and polled["ct_status"] == "running"
        text = summary(tasks)
        assert (f"LAST RUNG WAS NEEDED: CT {MAIN_CT} was restarted from lab-pve (pct stop + pct start"
                " (pct reboot failed or timed out: container did not stop)) because GPU memory stayed held") in text, text
        assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free (after a container restart)" in text, text
        assert (stats.get("failures", 0), stats.get("rescued", 0)) == (0, 1), stats
        # CT200 is back: running, a new init, the holder gone, the GPUs free, no trainer, the lock free
        assert lab_status()["containers"][MAIN_CT] == "running"
        assert ct_init_pid(lab) not in (None, init_before)
        assert not {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a}
        assert max(gpu_used(lab).values()) <= 512
        assert not trainer_pids(lab)
        assert lock_holder(lab) is None
    finally:
        if ha:
            lab_cli("ha", "off")
        if (lab_status() or {}).get("containers", {}).get(MAIN_CT) == "running":
            for pid in {p for p, a in ct_processes(lab).items() if "fakegpu.py hold" in a} & stray:
                ct(lab, "kill", "-KILL", str(pid), check=False)
