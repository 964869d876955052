"""proxmox_ct_exec on the lab's PVE host (OpenSSH, as root) against CT200 and the stopped decoy CT201.

Check mode first, then for real; creates/removes for idempotence; a timeout
that must kill the command's whole process group inside the container; bad
input that must end in its error with nothing run. CT201 is started by the
ensure_running case and stopped again at the end.
"""

from __future__ import annotations

import pytest

from tests.support.inventory import openssh_hostvars
from tests.support.lab import DECOY_CT, MAIN_CT, lab_status, require_stopped
from tests.support.playbook import run_json_play

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

HOSTILE = ["it's", "$HOME", "`id`", "a;b", "\u00e9t\u00e9 \u65e5\u672c", "200; reboot"]


@pytest.fixture(scope="module")
def results(lab, tmp_path_factory):
    status = lab
    require_stopped(status)
    tmp = tmp_path_factory.mktemp("proxmox_ct_exec")
    hosts = {"pve": openssh_hostvars(status)}
    extra = {"it_argv": ["printf", "%s\\n"] + HOSTILE, "it_main_ct": int(MAIN_CT), "it_decoy_ct": int(DECOY_CT)}
    out = run_json_play(tmp, hosts, "proxmox_ct_exec", [extra], timeout=400)
    return {name: host["pve"] for name, host in out.items()}


def test_check_mode_reports_and_runs_nothing(results):
    r = results["check mode"]
    assert r["changed"] and "would run" in r["msg"]
    assert r["cmd"][:4] == ["/usr/sbin/pct", "exec", MAIN_CT, "--"]
    assert results["marker after check mode"]["rc"] == 1


def test_argv_arrives_intact(results):
    r = results["argv"]
    assert r["rc"] == 0 and r["changed"]
    assert r["stdout_lines"] == HOSTILE
    assert r["ct_status"] == "running" and r["started"] is False
    assert isinstance(r["elapsed"], float)
    assert r["cmd"][-len(HOSTILE):] == HOSTILE


def test_shell_text_chdir_env_stdin(results):
    r = results["shell text, chdir, env, stdin"]
    assert r["stdout_lines"] == ["/etc", "h\u00e9 $x `y`", "from stdin"]


def test_stderr_apart_and_rc(results):
    r = results["streams apart and rc"]
    assert r["failed"] and r["rc"] == 5
    assert (r["stdout"], r["stderr"]) == ("o\n", "e\n")


def test_creates_and_removes_skip(results):
    for name, text in (("creates skips", "/etc/hostname exists"), ("removes skips", "does not exist")):
        r = results[name]
        assert not r["changed"] and text in r["msg"]


def test_missing_chdir_fails_clearly(results):
    r = results["chdir missing"]
    assert r["failed"] and "chdir /nonexistent/dir does not exist" in r["msg"]


def test_timeout_kills_the_whole_group_inside_the_container(results):
    r = results["timeout"]
    assert r["failed"] and r["timed_out"]
    assert "timed out after 2s" in r["msg"]
    assert results["survivors"]["stdout"] == ""


def test_bad_vmid_refused(results):
    assert results["vmid injection"]["failed"]
    assert "vmid" in results["vmid injection"]["msg"]
    r = results["vmid missing"]
    assert r["failed"] and "container 999 does not exist" in r["msg"]


def test_stopped_container_fails_without_ensure_running(results):
    r = results["stopped without ensure_running"]
    assert r["failed"] and r["ct_status"] == "stopped"
    assert "nothing was run" in r["msg"]


def test_ensure_running_check_mode_starts_nothing(results):
    assert f"would start container {DECOY_CT}" in results["stopped, check mode"]["msg"]
    assert results["status after check mode"]["stdout"] == "status: stopped"


def test_ensure_running_starts_and_runs(results):
    r = results["ensure_running"]
    assert r["started"] is True and r["ct_status"] == "running"
    assert r["stdout"] == "ct201\n"
    assert not results["stop CT201 again"].get("failed")


def test_no_marker_from_refused_or_check_mode_runs(results):
    assert results["markers in CT200"]["stdout"] == ""


def test_lab_left_as_found(results):
    assert lab_status()["containers"] == {MAIN_CT: "running", DECOY_CT: "stopped"}
