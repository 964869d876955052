"""_datagen.units: the serving units' unapplied changes and settled units, and the pipeline unit's state, on tables,
real processes and real files; then the modules that run it (``sglang_units_info``, ``datagen_pipeline_info``),
each in its own process against a systemctl that answers from a table."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils import _proc
from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import units
from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.units import UnitState
from datagen import cli, paths
from tests.support.module import run_module
from tests.support.systemctl import install_fake_systemctl

pytestmark = pytest.mark.processes

ACTIVE = UnitState(need_daemon_reload=False, active=True, main_pid=4242)
START = 1_700_000_000.0
# /proc/PID/stat lines: comm may hold spaces and parentheses, so the fields count from its last ")"
STAT_LINE = "4242 (python3) S 1 4242 4242 0 -1 4194560 900 0 0 0 12 3 0 0 20 0 4 0 123456 1000 200 18446744073709551615"

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
    assert units.parse_show(text) == expected


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
    assert units.needs_restart(state, process_start, mtimes) is restart, case


@pytest.mark.parametrize("reloads,expected", [
    ({}, False),
    ({"a": False, "b": False}, False),
    ({"a": False, "b": True}, True),
    ({"a": True}, True),
])
def test_decide_reloads_when_any_definition_is_stale(reloads, expected):
    states = {unit: UnitState(flag, True, 1) for unit, flag in reloads.items()}
    assert units.decide(states, ["b"])["reload"] is expected


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
    assert units.is_settled(state) is settled, case


def test_decide_never_settles_a_unit_to_restart():
    settled = UnitState(False, True, 5, enabled=True)
    states = {"a": settled, "b": settled, "c": UnitState(False, True, 5)}
    assert units.decide(states, ["b"]) == {"reload": False, "restart": ["b"], "settled": ["a"]}


def test_watched_files_layout():
    got = units.watched_files("/opt/datagen", [0, 3], router=True, api_key_file="/opt/datagen/api-key.env")
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
    assert units.watched_files("/h", [1], router=False) == {
        "sglang-datagen-worker@1.service": ["/etc/systemd/system/sglang-datagen-worker@.service",
                                            "/h/workers/worker-1.env"]}
    assert units.watched_files("/h", [], router=False) == {}


@pytest.mark.parametrize("text,expected", [
    ("ActiveState=active\nSubState=running\n", {"ActiveState": "active", "SubState": "running"}),
    ("ExecStart={ path=/bin/x ; argv[]=/bin/x a=b }\n", {"ExecStart": "{ path=/bin/x ; argv[]=/bin/x a=b }"}),
    ("MainPID=\n", {"MainPID": ""}),
    ("", {}),
    ("no equals sign\n\nResult=exit-code\n", {"Result": "exit-code"}),
])
def test_parse_properties(text, expected):
    assert units.parse_properties(text) == expected


@pytest.mark.parametrize("text,expected", [
    (None, {}),
    ("", {}),
    ('{"stage": "gen', {}),  # torn (the CLI replaces it atomically, but another writer might not)
    ("[1, 2]", {}),
    ('{"stage": "generate", "why": "first responses written"}\n',
     {"stage": "generate", "why": "first responses written"}),
])
def test_parse_ready(text, expected):
    assert units.parse_ready(text) == expected


def test_pipeline_state_reads_the_file_the_cli_writes(tmp_path):
    asked = []

    def show(unit, properties):
        asked.append((unit, tuple(properties)))
        return "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n"

    work = str(tmp_path / "work")
    assert units.pipeline_state(work, show) == {
        "unit": {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0"},
        "ready": {}}
    cli.mark_ready(work, "generate", "first responses written")
    state = units.pipeline_state(work, show)
    assert (state["ready"]["stage"], state["ready"]["why"]) == ("generate", "first responses written")
    assert asked == [("datagen-pipeline.service", ("ActiveState", "SubState", "Result", "NRestarts"))] * 2


# ---------------------------------------------------------------- readers, on real processes and files


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_process_start_of_a_real_process(sleeper):
    began = units.process_start(sleeper.pid)
    # btime is whole seconds and the start is in clock ticks: at most a second early, never late
    assert began is not None and time.time() - 30 < began <= time.time() + 0.1


def test_process_start_agrees_with_the_collection(sleeper):
    info = _proc.read_process(sleeper.pid)
    expected = _proc.boot_time() + info.starttime / os.sysconf("SC_CLK_TCK")
    assert units.process_start(sleeper.pid) == expected


def _fake_proc(root, stat_text="cpu 1\nbtime 1700000000\n", pid_stat=None):
    os.makedirs(root / "7")
    (root / "stat").write_text(stat_text)
    if pid_stat is not None:
        (root / "7" / "stat").write_text(pid_stat)
    return str(root)


@pytest.mark.parametrize("case,stat_text,pid_stat,expected", [
    ("readable", "btime 1700000000\n", STAT_LINE.replace("4242 (", "7 ("), 1_700_000_000 + 123456 / 100),
    ("process gone", "btime 1700000000\n", None, None),
    ("not a stat line", "btime 1700000000\n", "7 (x) S 1", None),
    ("no btime", "cpu 1\n", STAT_LINE, None),
])
def test_process_start_on_a_proc_tree(tmp_path, monkeypatch, case, stat_text, pid_stat, expected):
    monkeypatch.setattr(units.os, "sysconf", lambda name: 100 if name == "SC_CLK_TCK" else os.sysconf(name))
    root = _fake_proc(tmp_path / "proc", stat_text, pid_stat)
    assert units.process_start(7, root) == expected, case


def test_process_start_unreadable_entry(tmp_path):
    root = _fake_proc(tmp_path / "proc")
    os.makedirs(tmp_path / "proc" / "7" / "stat")  # a directory where the file should be: EISDIR, as root too
    assert units.process_start(7, root) is None


def test_mtime(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    os.utime(path, (START, START + 3))
    assert units.mtime(str(path)) == START + 3
    assert units.mtime(str(tmp_path / "missing")) is None


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
    states = {
        "sglang-datagen-worker@0.service": running,
        "sglang-datagen-worker@1.service": running,
        "sglang-datagen-router.service": {"NeedDaemonReload": "yes", "ActiveState": "inactive", "MainPID": "0"},
    }
    return home, unit_dir, states


def _show(states):
    return lambda unit, properties: "".join(f"{k}={v}\n" for k, v in states[unit].items())


def test_find_unapplied(tmp_path, sleeper):
    home, unit_dir, states = _layout(tmp_path, sleeper.pid)
    watched = units.watched_files(home, [0, 1], True, f"{home}/api-key.env", unit_dir)
    assert units.find_unapplied(watched, _show(states)) == {
        "reload": True, "restart": ["sglang-datagen-worker@0.service"],
        "settled": ["sglang-datagen-worker@1.service"]}
    # the process gone between systemd's answer and the /proc read: no restart on a guess
    sleeper.kill()
    sleeper.wait()
    assert units.find_unapplied(watched, _show(states))["restart"] == []


def test_the_ready_file_is_the_one_the_pipeline_writes():
    assert units.READY_FILE == paths.READY


@pytest.mark.parametrize("case,p,expected", [
    ("two workers, a router, a key", {"home": "/h", "workers": [0, 1], "router": True, "api_key_file": "/h/k.env",
                                      "unit_dir": "/u"}, ["/u/sglang-datagen-worker@.service", "/h/k.env"]),
    ("one worker, no key", {"home": "/h", "workers": [2], "router": False, "api_key_file": None, "unit_dir": "/u"},
     ["/u/sglang-datagen-worker@.service", "/h/workers/worker-2.env"]),
])
def test_serving_units_asks_systemd_about_each_unit_of_the_layout(case, p, expected):
    asked = []

    def show(unit, properties):
        asked.append((unit, tuple(properties)))
        return "ActiveState=active\nMainPID=0\nUnitFileState=enabled\n"

    result = units.serving_units(p, show)
    assert [unit for unit, _props in asked] == list(units.watched_files(p["home"], p["workers"], p["router"],
                                                                        p["api_key_file"], p["unit_dir"])), case
    assert all(props == units.SERVING_PROPERTIES for _unit, props in asked)
    assert result == {"changed": False, "reload": False, "restart": [], "settled": [unit for unit, _props in asked]}
    assert set(expected) <= {f for files in units.watched_files(p["home"], p["workers"], p["router"],
                                                                p["api_key_file"], p["unit_dir"]).values() for f in files}


def test_runners_fail_with_systemctls_message():
    def show(unit, properties):
        raise units.UnitsError("systemctl not found: this module needs a systemd node")

    p = {"home": "/h", "workers": [0], "router": False, "api_key_file": None, "unit_dir": "/u"}
    assert units.serving_units(p, show) == {"failed": True, "msg": "systemctl not found: this module needs a systemd node"}
    assert units.pipeline_info({"work_dir": "/w"}, show)["failed"] is True


def test_systemctl_show_without_systemctl_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(units.UnitsError, match="systemctl not found"):
        units.systemctl_show("x.service", ["ActiveState"])


# ---------------------------------------------------------------- the modules, each in its own process


@pytest.fixture
def fake_systemctl(tmp_path_factory, monkeypatch):
    """Install a systemctl answering ``show`` from a table, first on PATH (the module processes inherit it)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lambda states: install_fake_systemctl(bin_dir, states)


def test_sglang_units_info_on_systemctl_show(tmp_path, sleeper, fake_systemctl):
    home, unit_dir, states = _layout(tmp_path, sleeper.pid)
    fake_systemctl(states)
    out = run_module("sglang_units_info", {"home": home, "workers": [0, 1], "router": True,
                                           "api_key_file": f"{home}/api-key.env", "unit_dir": unit_dir})
    assert out["rc"] == 0 and out["changed"] is False, out
    assert (out["reload"], out["restart"], out["settled"]) == (
        True, ["sglang-datagen-worker@0.service"], ["sglang-datagen-worker@1.service"])

    # no router, no key, a worker systemd has never heard of: nothing to apply, also in check mode
    out = run_module("sglang_units_info", {"home": home, "workers": [1, 5], "unit_dir": unit_dir}, check_mode=True)
    assert (out["reload"], out["restart"], out["settled"]) == (False, [], ["sglang-datagen-worker@1.service"]), out

    out = run_module("sglang_units_info", {"home": home})
    assert (out["reload"], out["restart"], out["settled"]) == (False, [], []), out


def test_sglang_units_info_refuses_a_worker_that_is_not_an_index(tmp_path):
    out = run_module("sglang_units_info", {"home": str(tmp_path), "workers": [0, "one"]})
    assert out["rc"] == 1 and out["failed"] and "workers" in out["msg"], out


def test_the_modules_without_systemctl_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    for name, args in (("sglang_units_info", {"home": str(tmp_path), "workers": [0]}),
                       ("datagen_pipeline_info", {"work_dir": str(tmp_path)})):
        out = run_module(name, args)
        assert out["rc"] == 1 and out["failed"] and "systemctl not found" in out["msg"], (name, out)
        assert "exception" not in out, out


def test_datagen_pipeline_info_reads_the_unit_and_the_file_the_pipeline_writes(tmp_path, fake_systemctl):
    fake_systemctl({"datagen-pipeline.service": {"ActiveState": "activating", "SubState": "auto-restart",
                                                 "Result": "exit-code", "NRestarts": "2"}})
    work = tmp_path / "work"
    out = run_module("datagen_pipeline_info", {"work_dir": str(work)})
    assert out["rc"] == 0 and out["changed"] is False, out
    assert (out["unit"], out["ready"]) == ({"ActiveState": "activating", "SubState": "auto-restart",
                                            "Result": "exit-code", "NRestarts": "2"}, {})
    cli.mark_ready(str(work), "prepare", "stage finished")
    assert run_module("datagen_pipeline_info", {"work_dir": str(work)}, check_mode=True)["ready"]["stage"] == "prepare"
