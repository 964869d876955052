"""proxmox_ct_exec on the lab's PVE host (OpenSSH, as root) against CT200 and the stopped decoy CT201.

Check mode first, then for real; creates/removes for idempotence; a timeout
that must kill the command's whole process group inside the container; bad
input that must end in its error with nothing run. CT201 is started by the
ensure_running case and stopped again at the end.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


def _helpers():
    """The lab helpers of test_pct_ssh.py, loaded under their own name (test modules share one namespace)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pct_ssh_lab_helpers", Path(__file__).with_name("test_pct_ssh.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_h = _helpers()
LAB = _h.LAB
lab_status = _h.lab_status
run_playbook = _h.run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

HOSTILE = ["it's", "$HOME", "`id`", "a;b", "\u00e9t\u00e9 \u65e5\u672c", "200; reboot"]

PLAY = """
- hosts: pve
  gather_facts: false
  module_defaults:
    gpuops.repurpose.proxmox_ct_exec:
      vmid: 200
  tasks:
    - name: check mode
      gpuops.repurpose.proxmox_ct_exec:
        argv: [touch, /tmp/proxmox_ct_exec_marker]
      check_mode: true
      register: r
    - name: marker after check mode
      gpuops.repurpose.proxmox_ct_exec:
        argv: [test, -e, /tmp/proxmox_ct_exec_marker]
      ignore_errors: true
    - name: argv
      gpuops.repurpose.proxmox_ct_exec:
        argv: %(argv)s
    - name: shell text, chdir, env, stdin
      gpuops.repurpose.proxmox_ct_exec:
        command: 'pwd; printf "%%s\\n" "$GREETING"; cat'
        chdir: /etc
        env:
          GREETING: "h\\u00e9 $x `y`"
        stdin: "from stdin"
    - name: streams apart and rc
      gpuops.repurpose.proxmox_ct_exec:
        argv: [/bin/sh, -c, "echo o; echo e >&2; exit 5"]
      ignore_errors: true
    - name: creates skips
      gpuops.repurpose.proxmox_ct_exec:
        argv: [touch, /tmp/proxmox_ct_exec_marker]
        creates: /etc/hostname
    - name: removes skips
      gpuops.repurpose.proxmox_ct_exec:
        argv: [touch, /tmp/proxmox_ct_exec_marker]
        removes: /nonexistent/proxmox_ct_exec
    - name: chdir missing
      gpuops.repurpose.proxmox_ct_exec:
        argv: [touch, marker]
        chdir: /nonexistent/dir
      ignore_errors: true
    - name: timeout
      gpuops.repurpose.proxmox_ct_exec:
        argv: [/bin/sh, -c, "sleep 171 & sleep 172 & exec sleep 173"]
        timeout: 2
        kill_after: 1
      ignore_errors: true
    - name: survivors
      gpuops.repurpose.proxmox_ct_exec:
        command: "pgrep -f 'sleep 17[123]' || true"
    - name: vmid injection
      gpuops.repurpose.proxmox_ct_exec:
        vmid: "200; reboot"
        argv: [touch, /tmp/proxmox_ct_exec_marker]
      ignore_errors: true
    - name: vmid missing
      gpuops.repurpose.proxmox_ct_exec:
        vmid: 999
        argv: ["true"]
      ignore_errors: true
    - name: stopped without ensure_running
      gpuops.repurpose.proxmox_ct_exec:
        vmid: 201
        argv: [touch, /tmp/proxmox_ct_exec_marker]
      ignore_errors: true
    - name: stopped, check mode
      gpuops.repurpose.proxmox_ct_exec:
        vmid: 201
        argv: [hostname]
        ensure_running: true
      check_mode: true
    - name: status after check mode
      ansible.builtin.command: /usr/sbin/pct status 201
      changed_when: false
    - name: stopped, started
      block:
        - name: ensure_running
          gpuops.repurpose.proxmox_ct_exec:
            vmid: 201
            argv: [hostname]
            ensure_running: true
            start_timeout: 120
      always:
        - name: stop CT201 again
          ansible.builtin.command: /usr/sbin/pct stop 201
          changed_when: true
    - name: markers in CT200
      gpuops.repurpose.proxmox_ct_exec:
        command: "ls /tmp/proxmox_ct_exec_marker 2>/dev/null || true"
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    status = lab_status()
    if status["containers"].get("201") != "stopped":
        pytest.skip("CT201 is not stopped (another test started it)")
    tmp = tmp_path_factory.mktemp("proxmox_ct_exec")
    hosts = {
        "pve": dict(
            ansible_connection="ansible.builtin.ssh",
            ansible_host=status["host"],
            ansible_port=status["port"],
            ansible_user="root",
            ansible_ssh_private_key_file=status["key"],
            ansible_ssh_common_args="-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes" % status["known_hosts"],
            ansible_python_interpreter="/usr/bin/python3",
        )
    }
    out = run_playbook(tmp, hosts, PLAY % {"argv": json.dumps(["printf", "%s\\n"] + HOSTILE)}, timeout=400)
    return {name: host["pve"] for name, host in out.items()}


def test_check_mode_reports_and_runs_nothing(results):
    r = results["check mode"]
    assert r["changed"] and "would run" in r["msg"]
    assert r["cmd"][:4] == ["/usr/sbin/pct", "exec", "200", "--"]
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
    assert "would start container 201" in results["stopped, check mode"]["msg"]
    assert results["status after check mode"]["stdout"] == "status: stopped"


def test_ensure_running_starts_and_runs(results):
    r = results["ensure_running"]
    assert r["started"] is True and r["ct_status"] == "running"
    assert r["stdout"] == "ct201\n"
    assert not results["stop CT201 again"].get("failed")


def test_no_marker_from_refused_or_check_mode_runs(results):
    assert results["markers in CT200"]["stdout"] == ""


def test_lab_left_as_found(results):
    done = subprocess.run([str(LAB), "status"], capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(done.stdout)["containers"] == {"200": "running", "201": "stopped"}
