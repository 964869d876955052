"""tests/support's pure parts: the one skip rule, playbook paths, callback results, recaps, host variables."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.support import paths
from tests.support.faults import Figures
from tests.support.inventory import openssh_hostvars, pct_ssh_hostvars, write_inventory
from tests.support.lab import fleet_skip_reason, skip_reason
from tests.support.playbook import changed_tasks, playbook_argv, playbook_path, recap, task_output, task_results
from tests.support.procfs import listening
from tests.support.ssh import LXC_REXEC_FAILED, LXC_REXEC_TRIES, without_lxc_rexec_failures

UP = {"up": True, "containers": {"200": "running", "201": "stopped"}}
STATUS = {"host": "127.0.0.1", "port": 2222, "key": "/lab/id", "known_hosts": "/lab/known_hosts"}


@pytest.mark.parametrize(("status", "euid", "reason"), [
    (UP, 0, None),
    (UP, 1000, "needs root"),
    (None, 0, "gave no status"),
    ({"up": False, "containers": {"200": "running"}}, 0, "not up"),
    ({"up": True, "containers": {"200": "stopped"}}, 0, "CT200 running"),
    ({"up": True}, 0, "CT200 running"),
])
def test_one_skip_rule_root_status_up_and_ct200_running(status, euid, reason):
    got = skip_reason(status, euid=euid)
    assert got is None if reason is None else reason in got


FLEET = dict(UP, nodes=2, node2={"up": True, "containers": {"210": "running"}})


@pytest.mark.parametrize(("status", "euid", "reason"), [
    (FLEET, 0, None),
    (FLEET, 1000, "needs root"),
    (None, 0, "gave no status"),
    (dict(FLEET, up=False), 0, "not up"),
    (UP, 0, "two-node lab is not up"),
    (dict(UP, nodes=1, node2={"up": False, "containers": {"210": "running"}}), 0, "two-node lab is not up"),
    (dict(FLEET, node2={"up": True, "containers": {"210": "stopped"}}), 0, "CT210 running"),
    (dict(FLEET, node2=None), 0, "CT210 running"),
])
def test_fleet_skip_rule_is_the_lab_rule_then_node2_up_with_ct210_running(status, euid, reason):
    got = fleet_skip_reason(status, euid=euid)
    assert got is None if reason is None else reason in got


def test_import_dirs_are_on_sys_path_once():
    for entry in map(str, paths.IMPORT_DIRS):
        assert sys.path.count(entry) == 1, entry
    paths.add_import_dirs()
    assert all(sys.path.count(str(entry)) == 1 for entry in paths.IMPORT_DIRS)


def test_a_bare_playbook_name_is_a_file_under_tests_integration_playbooks():
    assert playbook_path("pct_ssh_suite") == paths.PLAYBOOKS / "pct_ssh_suite.yml"
    assert playbook_path("id_twice.yml") == paths.PLAYBOOKS / "id_twice.yml"
    assert playbook_path(paths.ROOT / "playbooks" / "x.yml") == paths.ROOT / "playbooks" / "x.yml"
    for name in ("pct_ssh_suite", "pct_ssh_errors", "pct_ssh_nonroot", "proxmox_ct_exec", "id_twice"):
        assert playbook_path(name).is_file(), name


def test_extra_vars_are_one_json_e_each_in_order():
    argv = playbook_argv("id_twice", "inv.json", [{"a": 1}, "b=2"], ["--check"])
    assert argv[1:] == ["-i", "inv.json", str(paths.PLAYBOOKS / "id_twice.yml"), "-e", '{"a": 1}', "-e", "b=2",
                        "--check"]


def test_task_results_merge_plays_by_task_name():
    doc = {"plays": [
        {"tasks": [{"task": {"name": "try"}, "hosts": {"a": {"rc": 1}}}]},
        {"tasks": [{"task": {"name": "try"}, "hosts": {"b": {"rc": 0}}},
                   {"task": {"name": "markers"}, "hosts": {"b": {"files": []}}}]},
    ]}
    assert task_results(doc) == {"try": {"a": {"rc": 1}, "b": {"rc": 0}}, "markers": {"b": {"files": []}}}


def test_recap_reads_one_host_and_fails_naming_a_missing_one():
    out = "PLAY RECAP\nct200  : ok=7    changed=2    unreachable=0    failed=1    skipped=3\n"
    assert recap(out) == {"ok": 7, "changed": 2, "unreachable": 0, "failed": 1}
    with pytest.raises(AssertionError, match="no recap for ct201"):
        recap(out, "ct201")


RUN = """
PLAY [Converge] ****
TASK [role : Look at the node] ****
ok: [ct200]
TASK [role : Write the config] ****
changed: [ct200]
TASK [role : Skipped here] ****
skipping: [ct200]
TASK [role : Files | Write what differs] ****
ok: [ct200] => (item=a)
changed: [ct200] => (item=b)
changed: [ct200] => (item=c)
TASK [role : Report] ****
ok: [ct200] => {
    "msg": "changed: [ct200] is quoted here, not a result"
}
"""


def test_changed_tasks_are_banner_positions_once_per_task_whatever_the_loop_items():
    assert changed_tasks(RUN) == [(1, "role : Write the config"), (3, "role : Files | Write what differs")]
    assert changed_tasks("changed: [ct200]\n") == []  # a result with no banner before it names no task


def test_task_output_is_the_lines_under_the_first_banner_of_that_task():
    assert task_output(RUN, "Files | Write") == [
        "ok: [ct200] => (item=a)", "changed: [ct200] => (item=b)", "changed: [ct200] => (item=c)"]
    assert task_output(RUN, "Skipped here") == ["skipping: [ct200]"]
    assert task_output(RUN, "Report")[0] == "ok: [ct200] => {"  # the last task: up to the end
    assert task_output(RUN, "Write what differs") == []  # the name after the role's prefix must start with it
    assert task_output(RUN, "Missing") == []


def test_host_variables_share_the_lab_login_and_extra_wins(tmp_path):
    pct = pct_ssh_hostvars(STATUS, ansible_user="pveops", proxmox_vmid=201)
    ssh = openssh_hostvars(STATUS)
    shared = ("ansible_host", "ansible_port", "ansible_ssh_private_key_file", "ansible_python_interpreter")
    assert [pct[k] for k in shared] == [ssh[k] for k in shared] == ["127.0.0.1", 2222, "/lab/id", "/usr/bin/python3"]
    assert (pct["ansible_user"], pct["proxmox_vmid"], ssh["ansible_user"]) == ("pveops", 201, "root")
    assert pct["ansible_pct_ssh_known_hosts_file"] == "/lab/known_hosts"
    assert "UserKnownHostsFile=/lab/known_hosts" in ssh["ansible_ssh_common_args"]
    inv = write_inventory(tmp_path / "inv.json", {"ct200": pct}, {"pve": {"lab-pve": ssh}})
    data = json.loads(inv.read_text())
    assert data["all"]["hosts"]["ct200"] == pct and data["all"]["children"]["pve"]["hosts"]["lab-pve"] == ssh


def test_free_ports_never_hand_out_the_lab_s_serving_ports():
    """The host stream runs beside the lab's: a port it holds must never be one a CT200 worker or the
    router binds (CT200 shares this machine's network)."""
    from tests.support.net import LAB_PORTS, free_ports

    ports = [p for _round in range(5) for p in free_ports(40)]
    assert len(ports) == 200
    assert not [p for p in ports if LAB_PORTS[0] <= p < LAB_PORTS[1]]
    assert LAB_PORTS[0] <= 30000 <= 30100 and 31000 + 16 <= LAB_PORTS[1]  # the role's default metrics, router and worker ports


def test_listening_sees_a_listener_and_not_a_connected_or_closed_socket():
    """procfs.listening (the sshd-restart points' "nothing listens" check) reads LISTEN sockets only."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert not listening(port)  # bound, not listening
    server.listen(1)
    assert listening(port)
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    accepted, _peer = server.accept()
    server.close()
    assert not listening(port)  # the established pair is still there, the listener is not
    client.close()
    accepted.close()


def _attempts(*results):
    """An attempt function handing out RESULTS (rc, stderr) in order, and the list of calls made."""
    calls = []

    def attempt():
        rc, err = results[len(calls)]
        calls.append(rc)
        return subprocess.CompletedProcess(["pct"], rc, "", err)
    return attempt, calls


REXEC = "Device or resource busy - %s\nmunmap_chunk(): invalid pointer\n" % LXC_REXEC_FAILED


@pytest.mark.parametrize(("results", "runs", "rc"), [
    ([(1, REXEC), (0, "")], 2, 0),  # lxc-attach never started the command: once more
    ([(1, REXEC)] * LXC_REXEC_TRIES, LXC_REXEC_TRIES, 1),  # bounded, and the last failure is what is returned
    ([(1, "Container 200 not running\n")], 1, 1),  # any other failure may have run the command: never again
    ([(0, "")], 1, 0),
])
def test_a_command_lxc_attach_never_started_runs_again_a_bounded_number_of_times(results, runs, rc):
    attempt, calls = _attempts(*results)
    assert without_lxc_rexec_failures(attempt).returncode == rc
    assert len(calls) == runs


def test_a_wait_past_its_bound_fails_and_its_figure_is_kept(tmp_path):
    path = str(tmp_path / "figures.json")
    figures = Figures(path)
    figures.wait("inside", 8.9, 9)
    with pytest.raises(AssertionError, match="past its bound of 9.00 s"):
        figures.wait("past", 9.2, 9)
    with open(path, encoding="utf-8") as fh:
        saved = json.load(fh)
    assert [w["wait"] for w in saved["waits"]] == ["inside", "past"]
    assert figures.totals()["longest_wait_vs_bound"]["wait"] == "past"
