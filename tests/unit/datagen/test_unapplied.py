"""datagen.unapplied: the serving-unit changes a killed run wrote but never applied.

Table-driven on the pure parsers and rules; the readers on real processes and real files; the
CLI as the role runs it (``python -m datagen unapplied-units``) in a real subprocess, with a
``systemctl`` on PATH that answers ``show`` as systemd does (``KEY=VALUE`` lines; an unknown unit
still shows ``ActiveState=inactive``, ``MainPID=0``): the unit tests run where no systemd is.
The lab runs the role's task against real systemd in CT200.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils import _proc
from datagen import unapplied
from datagen.unapplied import UnitState
from tests.support.datagen_rows import run_cli

ACTIVE = UnitState(need_daemon_reload=False, active=True, main_pid=4242)
START = 1_700_000_000.0

# ---------------------------------------------------------------- pure


@pytest.mark.parametrize("text,expected", [
    ("NeedDaemonReload=no\nActiveState=active\nMainPID=4242\n", UnitState(False, True, 4242)),
    ("MainPID=4242\nNeedDaemonReload=yes\nActiveState=active\n", UnitState(True, True, 4242)),
    # a unit systemd does not know (never loaded) or one stopped
    ("NeedDaemonReload=no\nActiveState=inactive\nMainPID=0\n", UnitState(False, False, 0)),
    ("NeedDaemonReload=yes\nActiveState=activating\nMainPID=77\n", UnitState(True, False, 77, activating=True)),
    ("NeedDaemonReload=no\nActiveState=failed\nMainPID=\n", UnitState(False, False, 0)),
    ("", UnitState(False, False, 0)),
    ("garbage\nMainPID=x\n", UnitState(False, False, 0)),
    ("ActiveState=active\nMainPID=12=3\n", UnitState(False, True, 0)),
    # UnitFileState: only plain "enabled" counts (a template instance reads as its wants/ symlink)
    ("ActiveState=active\nMainPID=5\nUnitFileState=enabled\n", UnitState(False, True, 5, enabled=True)),
    ("ActiveState=active\nMainPID=5\nUnitFileState=enabled-runtime\n", UnitState(False, True, 5)),
    ("ActiveState=inactive\nMainPID=0\nUnitFileState=disabled\n", UnitState(False, False, 0)),
])
def test_parse_show(text, expected):
    assert unapplied.parse_show(text) == expected


@pytest.mark.parametrize("state,pid", [
    (UnitState(False, True, 4242), 4242),
    (UnitState(False, True, 0), 0),  # active without a main process (Type=oneshot, RemainAfterExit)
    (UnitState(False, False, 4242), 0),  # deactivating: the PID is on its way out
])
def test_running_pid(state, pid):
    assert state.running_pid == pid


@pytest.mark.parametrize("case,state,process_start,mtimes,restart", [
    ("unit file newer than the process", ACTIVE, START, [START + 5, START - 100], True),
    ("environment file newer than the process", ACTIVE, START, [START - 100, START + 0.5], True),
    ("every file older", ACTIVE, START, [START - 5, START - 100], False),
    ("written in the same instant", ACTIVE, START, [START], False),
    ("inactive unit", UnitState(False, False, 4242), START, [START + 5], False),
    ("MainPID 0", UnitState(False, True, 0), START, [START + 5], False),
    ("missing files", ACTIVE, START, [None, None], False),
    ("one file missing, one newer", ACTIVE, START, [None, START + 1], True),
    ("no files at all", ACTIVE, START, [], False),
    ("unreadable /proc entry", ACTIVE, None, [START + 5], False),
    ("stale definition alone is a reload, not a restart", UnitState(True, True, 4242), START, [START - 1], False),
])
def test_needs_restart(case, state, process_start, mtimes, restart):
    assert unapplied.needs_restart(state, process_start, mtimes) is restart, case


@pytest.mark.parametrize("reloads,expected", [
    ({}, False),
    ({"a": False, "b": False}, False),
    ({"a": False, "b": True}, True),
    ({"a": True}, True),
])
def test_decide_reloads_when_any_definition_is_stale(reloads, expected):
    states = {unit: UnitState(flag, True, 1) for unit, flag in reloads.items()}
    assert unapplied.decide(states, ["b"])["reload"] is expected


# Each row: what systemd_service (state=started, enabled=true) would do with the unit, and so
# whether the role may leave it out of its loop.
@pytest.mark.parametrize("case,state,settled", [
    ("running and enabled: ok", UnitState(False, True, 5, enabled=True), True),
    ("starting and enabled: is_running_service counts activating", UnitState(False, False, 5, activating=True, enabled=True), True),
    ("running, not enabled: would enable", UnitState(False, True, 5), False),
    ("enabled, stopped or failed: would start", UnitState(False, False, 0, enabled=True), False),
    ("neither", UnitState(False, False, 0), False),
    ("a stale definition alone changes nothing for started/enabled", UnitState(True, True, 5, enabled=True), True),
])
def test_is_settled(case, state, settled):
    assert unapplied.is_settled(state) is settled, case


def test_decide_never_settles_a_unit_to_restart():
    settled = UnitState(False, True, 5, enabled=True)
    states = {"a": settled, "b": settled, "c": UnitState(False, True, 5)}
    assert unapplied.decide(states, ["b"]) == {"reload": False, "restart": ["b"], "settled": ["a"]}


def test_watched_files_layout():
    got = unapplied.watched_files("/opt/datagen", [0, 3], router=True, api_key_file="/opt/datagen/api-key.env")
    assert got == {
        "sglang-datagen-worker@0.service": ["/etc/systemd/system/sglang-datagen-worker@.service",
                                            "/opt/datagen/workers/worker-0.env", "/opt/datagen/api-key.env"],
        "sglang-datagen-worker@3.service": ["/etc/systemd/system/sglang-datagen-worker@.service",
                                            "/opt/datagen/workers/worker-3.env", "/opt/datagen/api-key.env"],
        "sglang-datagen-router.service": ["/etc/systemd/system/sglang-datagen-router.service",
                                          "/opt/datagen/api-key.env"],
    }
    assert list(got) == ["sglang-datagen-worker@0.service", "sglang-datagen-worker@3.service",
                         "sglang-datagen-router.service"]
    assert unapplied.watched_files("/h", [1], router=False) == {
        "sglang-datagen-worker@1.service": ["/etc/systemd/system/sglang-datagen-worker@.service",
                                            "/h/workers/worker-1.env"]}
    assert unapplied.watched_files("/h", [], router=False) == {}


STAT_LINES = [
    "4242 (python3) S 1 4242 4242 0 -1 4194560 900 0 0 0 12 3 0 0 20 0 4 0 123456 1000 200 18446744073709551615",
    # comm holds spaces and parentheses: the fields count from its last ")"
    "77 (sglang::router) R 1 77 77 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 1 1",
    "88 (a) b (c)) S 1 88 88 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 5 1 1 1",
    "99 (x\ny) Z 1 99 99 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 4000000000 1 1 1",
]


@pytest.mark.parametrize("line", STAT_LINES)
def test_stat_starttime_matches_the_collection_twin(line):
    # one reading in two places (the package cannot import the collection): they must not drift
    assert unapplied.parse_stat_starttime(line) == _proc.parse_stat(line).starttime


@pytest.mark.parametrize("line", ["", "4242 python3 S 1", "4242 (python3) S 1 4242 4242 0 -1 4194560",
                                  "4242 (python3) S 1 4242 4242 0 -1 4194560 900 0 0 0 12 3 0 0 20 0 4 0 x 1"])
def test_stat_starttime_refuses_what_is_not_a_stat_line(line):
    with pytest.raises(ValueError):
        unapplied.parse_stat_starttime(line)


def test_boot_time_matches_the_collection_twin(tmp_path):
    text = "cpu  1 2 3 4\nintr 5\nbtime 1700000123\nprocesses 99\n"
    (tmp_path / "stat").write_text(text)
    assert unapplied.parse_boot_time(text) == _proc.boot_time(str(tmp_path)) == 1700000123
    with pytest.raises(ValueError, match="no btime"):
        unapplied.parse_boot_time("cpu  1 2 3\n")


def test_started_at():
    assert unapplied.started_at(1_700_000_000, 250, 100) == 1_700_000_002.5


# ---------------------------------------------------------------- readers, on real processes and files


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_process_start_of_a_real_process(sleeper):
    began = unapplied.process_start(sleeper.pid)
    # btime is whole seconds and the start is in clock ticks: at most a second early, never late
    assert began is not None and time.time() - 30 < began <= time.time() + 0.1


def test_process_start_agrees_with_the_collection(sleeper):
    info = _proc.read_process(sleeper.pid)
    expected = _proc.boot_time() + info.starttime / os.sysconf("SC_CLK_TCK")
    assert unapplied.process_start(sleeper.pid) == expected


def _fake_proc(root, stat_text="cpu 1\nbtime 1700000000\n", pid_stat=None):
    os.makedirs(root / "7")
    (root / "stat").write_text(stat_text)
    if pid_stat is not None:
        (root / "7" / "stat").write_text(pid_stat)
    return str(root)


@pytest.mark.parametrize("case,stat_text,pid_stat,expected", [
    ("readable", "btime 1700000000\n", STAT_LINES[0].replace("4242 (", "7 ("), 1_700_000_000 + 123456 / 100),
    ("process gone", "btime 1700000000\n", None, None),
    ("not a stat line", "btime 1700000000\n", "7 (x) S 1", None),
    ("no btime", "cpu 1\n", STAT_LINES[0], None),
])
def test_process_start_on_a_proc_tree(tmp_path, monkeypatch, case, stat_text, pid_stat, expected):
    monkeypatch.setattr(unapplied.os, "sysconf", lambda name: 100 if name == "SC_CLK_TCK" else os.sysconf(name))
    root = _fake_proc(tmp_path / "proc", stat_text, pid_stat)
    assert unapplied.process_start(7, root) == expected, case


def test_process_start_unreadable_entry(tmp_path):
    root = _fake_proc(tmp_path / "proc")
    os.makedirs(tmp_path / "proc" / "7" / "stat")  # a directory where the file should be: EISDIR, as root too
    assert unapplied.process_start(7, root) is None


def test_mtime(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    os.utime(path, (START, START + 3))
    assert unapplied.mtime(str(path)) == START + 3
    assert unapplied.mtime(str(tmp_path / "missing")) is None


def _age(path, seconds_from_now):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("X=1\n")
    when = time.time() + seconds_from_now
    os.utime(path, (when, when))


def _layout(tmp_path, sleeper_pid):
    """Two workers and a router; worker 0's env file changed after its process started, nothing else did."""
    home, unit_dir = str(tmp_path / "home"), str(tmp_path / "units")
    _age(f"{unit_dir}/sglang-datagen-worker@.service", -3600)
    _age(f"{unit_dir}/sglang-datagen-router.service", +30)  # newer, but the router is not running
    _age(f"{home}/workers/worker-0.env", +30)
    _age(f"{home}/workers/worker-1.env", -3600)
    _age(f"{home}/api-key.env", -3600)
    running = {"NeedDaemonReload": "no", "ActiveState": "active", "MainPID": str(sleeper_pid), "UnitFileState": "enabled"}
    units = {
        "sglang-datagen-worker@0.service": running,
        "sglang-datagen-worker@1.service": running,
        "sglang-datagen-router.service": {"NeedDaemonReload": "yes", "ActiveState": "inactive", "MainPID": "0"},
    }
    return home, unit_dir, units


def _show(units):
    return lambda unit: "".join(f"{k}={v}\n" for k, v in units[unit].items())


def test_find_unapplied(tmp_path, sleeper):
    home, unit_dir, states = _layout(tmp_path, sleeper.pid)
    units = unapplied.watched_files(home, [0, 1], True, f"{home}/api-key.env", unit_dir)
    assert unapplied.find_unapplied(units, _show(states)) == {
        "reload": True, "restart": ["sglang-datagen-worker@0.service"],
        "settled": ["sglang-datagen-worker@1.service"]}
    # the process gone between systemd's answer and the /proc read: no restart on a guess
    sleeper.kill()
    sleeper.wait()
    assert unapplied.find_unapplied(units, _show(states))["restart"] == []


def test_cli_end_to_end_on_systemctl_show(tmp_path, sleeper, fake_systemctl):
    home, unit_dir, states = _layout(tmp_path, sleeper.pid)
    fake_systemctl(states)
    args = ("unapplied-units", "--home", home, "--workers", "0,1", "--router",
            "--api-key-file", f"{home}/api-key.env", "--unit-dir", unit_dir)
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"reload": True, "restart": ["sglang-datagen-worker@0.service"],
                                    "settled": ["sglang-datagen-worker@1.service"]}

    # no router, no key, a worker systemd has never heard of: nothing to apply
    p = run_cli("unapplied-units", "--home", home, "--workers", "1,5", "--unit-dir", unit_dir)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"reload": False, "restart": [], "settled": ["sglang-datagen-worker@1.service"]}

    p = run_cli("unapplied-units", "--home", home, "--workers", "")
    assert p.returncode == 0 and json.loads(p.stdout) == {"reload": False, "restart": [], "settled": []}


def test_cli_bad_worker_list_names_the_option(tmp_path):
    p = run_cli("unapplied-units", "--home", str(tmp_path), "--workers", "0,one")
    assert p.returncode == 2 and "--workers" in p.stderr and "'0,one' is not a comma-separated list" in p.stderr


def test_cli_without_systemctl_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    p = run_cli("unapplied-units", "--home", str(tmp_path), "--workers", "0")
    assert p.returncode == 1 and "systemctl not found" in p.stderr and "Traceback" not in p.stderr
