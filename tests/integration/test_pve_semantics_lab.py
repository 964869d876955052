"""What a real Proxmox VE host does that a first run meets, in the lab, and what the collection does about it.

A backup of CT200 or CT201 as vzdump runs one:

vzdump locks the container's config (``lock: backup``) for the whole backup and, in suspend mode, freezes the
container until the backup ends (pve-container src/PVE/VZDump/LXC.pm). pct then refuses start, stop and shutdown
(``CT is locked (backup)``, exit 255), says ``status: running`` of a frozen CT, and ``pct exec`` into a frozen
CT hangs until the thaw. ``tests/lab/lab backup begin|end`` does both to a lab container (tests/lab/README.md
"Fidelity"). The collection must name the lock and the freeze, fail within seconds, and signal nothing.

A host whose pct predates ``--keep-env`` (pve-container before 5.0.9): the lab's ``pct-before-keep-env`` fault.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from typing import ContextManager

import pytest

from tests.support import ct200
from tests.support import stop_training as stop
from tests.support.lab import DECOY_CT, MAIN_CT, SUDO_USER, fault, lab_status, lab_switched, require_stopped
from tests.support.playbook import adhoc_json_result, ansible_env, run_adhoc
from tests.support.ssh import on_host
from tests.support.stop_faults import job_signals, wrongly_signalled
from tests.support.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

FROZEN_BOUND_S = 30  # the stop half meets a frozen CT200: it fails within this, naming the freeze


def backup(vmid: str = MAIN_CT, mode: str = "suspend") -> ContextManager[None]:
    """Container VMID under a backup (lock: backup; frozen in suspend mode) until the block ends."""
    return lab_switched(("backup", "begin", "--mode", mode, "--ct", vmid), ("backup", "end", "--ct", vmid))


def pct(lab: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return on_host(lab, "pct", *args, check=False, timeout=timeout)


def json_adhoc(host: str, module: str, args: dict, timeout: float = 120) -> dict:
    env = ansible_env(ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return adhoc_json_result(run_adhoc(host, module, args, env=env, timeout=timeout), host)


def test_the_lab_s_pct_refuses_power_actions_on_a_locked_ct_as_pve_does(lab):
    require_stopped(lab)
    with backup(DECOY_CT, mode="snapshot"):
        res = pct(lab, "start", DECOY_CT)
        assert (res.returncode, res.stdout, res.stderr) == (255, "", "CT is locked (backup)\n")
        verbose = pct(lab, "status", DECOY_CT, "--verbose").stdout
        assert "lock: backup\n" in verbose and "status: stopped\n" in verbose
        assert pct(lab, "status", DECOY_CT).stdout == "status: stopped\n"
    with backup(MAIN_CT, mode="snapshot"):  # a lock alone: exec works, stop and shutdown are refused
        assert pct(lab, "exec", MAIN_CT, "--", "true").returncode == 0
        for op in ("stop", "shutdown"):
            res = pct(lab, op, MAIN_CT)
            assert (res.returncode, res.stderr) == (255, "CT is locked (backup)\n"), op
    assert lab_status()["containers"][MAIN_CT] == "running"


def test_proxmox_ct_power_names_the_lock_and_leaves_the_ct_as_it_was(lab):
    require_stopped(lab)
    with backup(DECOY_CT, mode="snapshot"):
        r = json_adhoc("lab-pve", "gpuops.repurpose.proxmox_ct_power", {"vmid": int(DECOY_CT), "operation": "start"})
        assert r.get("failed") and r["lock"] == "backup" and r["ct_status"] == "stopped", r
        assert r["msg"].startswith("CT %s is locked (backup) on " % DECOY_CT), r["msg"]
        assert "Retry after the backup ends" in r["msg"] and "`pct unlock %s`" % DECOY_CT in r["msg"], r["msg"]
    with backup(MAIN_CT, mode="snapshot"):
        # reboot: pct itself does not look at the lock, and would stop a CT that it then cannot start
        before = ct200.trainer_pids(lab)
        r = json_adhoc("lab-pve", "gpuops.repurpose.proxmox_ct_power", {"vmid": int(MAIN_CT), "operation": "reboot"})
        assert r.get("failed") and r["lock"] == "backup" and not r["changed"], r
        assert "reboot %s` was not run" % MAIN_CT in r["msg"], r["msg"]
    assert lab_status()["containers"] == dict(lab_status()["containers"], **{MAIN_CT: "running", DECOY_CT: "stopped"})
    assert ct200.trainer_pids(lab) == before


def test_a_frozen_ct_says_running_and_the_modules_and_pct_ssh_refuse_it_at_once(lab):
    with backup(MAIN_CT):
        assert pct(lab, "status", MAIN_CT).stdout == "status: running\n"  # pct cannot tell
        with pytest.raises(subprocess.TimeoutExpired):  # and pct exec hangs until the thaw, as lxc-attach does
            pct(lab, "exec", MAIN_CT, "--", "true", timeout=3)
        t0 = time.monotonic()
        r = json_adhoc("lab-pve", "gpuops.repurpose.proxmox_ct_exec", {"vmid": int(MAIN_CT), "argv": ["true"]})
        assert r.get("failed") and r["frozen"] is True and r["lock"] == "backup" and r["ct_status"] == "running", r
        assert "container %s on " % MAIN_CT in r["msg"] and "is frozen (lock: backup)" in r["msg"], r["msg"]
        raw = run_adhoc("ct200", "ansible.builtin.raw", {"_raw_params": "true"}, timeout=60)
        assert raw.returncode != 0 and "is frozen" in raw.stdout + raw.stderr, raw.stdout + raw.stderr
        assert time.monotonic() - t0 < FROZEN_BOUND_S
    # thawed: the same commands run again
    assert run_adhoc("ct200", "ansible.builtin.raw", {"_raw_params": "true"}, timeout=60).returncode == 0


def test_the_stop_half_against_a_ct_frozen_by_a_backup_fails_naming_the_freeze_and_signals_nothing(lab):
    job = ct200.trainer_pids(lab)
    decoys = ct200.decoy_pids(lab)
    assert job, "no trainer in CT%s" % MAIN_CT
    with backup(MAIN_CT):
        t0 = time.monotonic()
        rc, out = stop.play(timeout=120)
        took = time.monotonic() - t0
    assert rc != 0, out
    assert "is frozen (lock: backup)" in out, out[-3000:]
    assert took < FROZEN_BOUND_S, "the stop half took %.1f s to fail on a frozen CT" % took
    assert ct200.trainer_pids(lab) == job
    assert all(not signals for _role, signals in job_signals(lab, job).values()), job_signals(lab, job)
    assert wrongly_signalled(lab, decoys) == 0
    status = lab_status()
    assert status["containers"][MAIN_CT] == "running" and status["trainer"]["running"], json.dumps(status)[:2000]


def test_a_pct_before_keep_env_is_named_when_keep_env_is_set_and_unset_works(lab):
    with fault("pct_before_keep_env"):
        res = pct(lab, "exec", MAIN_CT, "--keep-env", "0", "--", "true")
        assert res.returncode == 255 and res.stderr.startswith("Unknown option: keep-env\n400 unable to parse option\n")
        raw = run_adhoc("ct200", "ansible.builtin.raw", {"_raw_params": "true"}, options=["-e", "proxmox_keep_env=false"],
                        timeout=60)
        assert raw.returncode != 0 and "does not know --keep-env" in raw.stdout + raw.stderr, raw.stdout + raw.stderr
        r = json_adhoc("lab-pve", "gpuops.repurpose.proxmox_ct_exec", {"vmid": int(MAIN_CT), "argv": ["true"], "keep_env": True})
        assert r.get("failed") and "does not know --keep-env" in r["msg"], r
        # unset, nothing is passed: it works there as on every release
        assert run_adhoc("ct200", "ansible.builtin.raw", {"_raw_params": "true"}, timeout=60).returncode == 0


def ha_managed(vmid: str, error: bool = False) -> ContextManager[None]:
    """Container VMID an HA resource (ERROR: one in the error state, never acted on) until the block ends."""
    return lab_switched(("ha", "on", "--ct", vmid, *(["--error"] if error else [])), ("ha", "off", "--ct", vmid))


def ct_status(lab: dict, vmid: str) -> str:
    return pct(lab, "status", vmid).stdout.strip()


def test_power_actions_on_an_ha_managed_ct_end_in_the_state_the_ha_manager_reached(lab):
    require_stopped(lab)
    power = "gpuops.repurpose.proxmox_ct_power"
    try:
        with ha_managed(DECOY_CT):
            res = pct(lab, "start", DECOY_CT)  # pct only queues the request and returns at once
            assert (res.returncode, res.stdout) == (0, "Requesting HA start for CT %s\n" % DECOY_CT)
            assert ct_status(lab, DECOY_CT) == "status: stopped"
            wait_for(lambda: ct_status(lab, DECOY_CT) == "status: running", 60, "the HA manager's start")
            r = json_adhoc("lab-pve", power, {"vmid": int(DECOY_CT), "operation": "shutdown", "timeout": 30})
            assert not r.get("failed") and r["changed"] and r["ha_request"] == "stop", r
            assert r["ct_status"] == "stopped" and ct_status(lab, DECOY_CT) == "status: stopped", r
            r = json_adhoc("lab-pve", power, {"vmid": int(DECOY_CT), "operation": "start"})
            assert not r.get("failed") and r["ha_request"] == "start" and r["ct_status"] == "running", r
            r = json_adhoc("lab-pve", power, {"vmid": int(DECOY_CT), "operation": "stop"})
            assert not r.get("failed") and r["ha_request"] == "stop" and r["ct_status"] == "stopped", r
        with ha_managed(DECOY_CT, error=True):  # the HA manager never acts: the module says so, bounded
            r = json_adhoc("lab-pve", power, {"vmid": int(DECOY_CT), "operation": "start", "command_timeout": 8})
            assert r.get("failed") and r["ha_request"] == "start" and r["ct_status"] == "stopped", r
            assert "did not lead to running: it is HA-managed" in r["msg"] and "still stopped after 8 s" in r["msg"], r["msg"]
    finally:
        if ct_status(lab, DECOY_CT) != "status: stopped":
            pct(lab, "stop", DECOY_CT)


def test_non_ascii_arguments_reach_the_container_intact_where_pct_alone_mangles_them(lab):
    """pct decodes its arguments with the host's locale (the lab host's sessions have none, as LANG=C): alone, it
    turns each byte of `é` into U+FFFD; through the collection, as root and as pveops (whose sudo rule keeps
    LC_CTYPE, as the README's does), the name arrives as written."""
    tag = uuid.uuid4().hex[:8]
    names = {how: "/tmp/caf\u00e9-%s-%s" % (how, tag) for how in ("pct", "root", "pveops", "module")}
    try:
        assert pct(lab, "exec", MAIN_CT, "--", "touch", names["pct"]).returncode == 0
        for how, user in (("root", "root"), ("pveops", SUDO_USER)):
            done = run_adhoc("ct200", "ansible.builtin.command", {"argv": ["touch", names[how]]},
                             options=["-e", "ansible_user=%s" % user], timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
        r = json_adhoc("lab-pve", "gpuops.repurpose.proxmox_ct_exec", {"vmid": int(MAIN_CT), "argv": ["touch", names["module"]]})
        assert not r.get("failed"), r
        listed = set(pct(lab, "exec", MAIN_CT, "--", "ls", "/tmp").stdout.split())
        assert names["pct"].replace("\u00e9", "\ufffd\ufffd")[len("/tmp/"):] in listed, sorted(listed)
        assert {names[how][len("/tmp/"):] for how in ("root", "pveops", "module")} <= listed, sorted(listed)
    finally:
        pct(lab, "exec", MAIN_CT, "--", "sh", "-c", "rm -f /tmp/caf*-*-%s" % tag)
