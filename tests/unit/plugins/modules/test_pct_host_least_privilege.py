"""proxmox_ct_exec and proxmox_ct_power as a user other than root: pct through ``sudo -n``, never more.

The modules run as real processes (tests/support/module.py, as Ansible runs them), as root
and as ``nobody`` (setpriv), with ``pct_path`` pointing at a recording
stand-in for pct that answers ``pct status`` like pct does. The real sudo of
this machine is used: ``nobody`` has no rule, so sudo's own refusal must come
back as the message naming the rule to add. Against the lab's real pct and the
``pveops`` user with the pct-only rule: tests/integration/test_pct_least_privilege.py.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.module import run_module
from tests.support.paths import COLLECTIONS, ROOT

pytestmark = pytest.mark.processes

NOBODY = 65534


def _world_reachable(path: str) -> bool:
    p = Path(path).resolve()
    for part in [p, *p.parents]:
        mode = part.stat().st_mode
        if part.is_dir() and not mode & 0o001:
            return False
    return bool(p.stat().st_mode & 0o004)


def _python_for_nobody() -> tuple[str, str]:
    """An interpreter and a PYTHONPATH (ansible's module_utils) that user nobody can use, or skip."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run a module as nobody")
    libs = [p for p in site.getsitepackages() if (Path(p) / "ansible").is_dir()]
    if not libs or not _world_reachable(libs[0]) or not _world_reachable(str(ROOT / "plugins" / "modules" / "proxmox_ct_power.py")):
        pytest.skip("the ansible library or the checkout is not readable by nobody here")
    wanted = "python%d.%d" % sys.version_info[:2]
    for candidate in (sys.executable, "/usr/bin/" + wanted, shutil.which(wanted) or ""):
        if candidate and os.path.exists(candidate) and _world_reachable(os.path.realpath(candidate)):
            return candidate, libs[0]
    pytest.skip("no %s that nobody can run" % wanted)


@pytest.fixture
def fake_pct():
    """A world-readable dir (pytest's own tmp is root's only) with a pct stand-in that records 'USER ARGS'."""
    d = Path(tempfile.mkdtemp(prefix="pct_host_"))
    d.chmod(0o755)
    (d / "calls").write_text("")
    (d / "calls").chmod(0o666)
    pct = d / "pct"
    pct.write_text(
        "#!/bin/sh\n"
        'echo "$(id -un) $*" >> %s\n'
        'case "$1" in status) echo "status: $(cat %s)";; start) echo running > %s;; stop|shutdown) echo stopped > %s;; esac\n'
        % (d / "calls", d / "state", d / "state", d / "state")
    )
    pct.chmod(0o755)
    (d / "state").write_text("running\n")
    (d / "state").chmod(0o666)
    yield d
    shutil.rmtree(d)


def run_pct_module(d: Path, module: str, args: dict, as_nobody: bool, check_mode: bool = False) -> dict:
    """MODULE's result with D's pct stand-in, run as root or as nobody (setpriv, an interpreter nobody can run)."""
    payload = dict(args, pct_path=str(d / "pct"))
    if not as_nobody:
        return run_module(module, payload, check_mode=check_mode, timeout=60, cwd=d)
    python, lib = _python_for_nobody()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": "%s:%s" % (COLLECTIONS, lib), "HOME": str(d)}
    return run_module(module, payload, check_mode=check_mode, timeout=60, cwd=d, env=env, python=python,
                      prefix=["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"])


def calls(d: Path) -> list[str]:
    return (d / "calls").read_text().splitlines()


@pytest.mark.parametrize("module, args", [
    ("proxmox_ct_exec", {"vmid": 200, "argv": ["true"]}),
    ("proxmox_ct_power", {"vmid": 200, "operation": "reboot"}),
])
def test_without_a_sudo_rule_the_rule_to_add_is_named_and_pct_never_runs(fake_pct, module, args):
    r = run_pct_module(fake_pct, module, args, as_nobody=True)
    assert r["failed"]
    assert "host user nobody may not run %s through sudo without a password" % (fake_pct / "pct") in r["msg"]
    assert "`nobody ALL=(root) NOPASSWD: %s`" % (fake_pct / "pct") in r["msg"]
    assert r["cmd"][:3] == ["sudo", "-n", str(fake_pct / "pct")]
    assert calls(fake_pct) == []


def test_non_root_runs_pct_through_the_become_method_and_root_directly(fake_pct):
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200, "operation": "reboot", "timeout": 7, "pct_become_method": "none"}, as_nobody=True)
    assert not r.get("failed"), r
    assert r["changed"] and r["cmd"] == [str(fake_pct / "pct"), "reboot", "200", "--timeout", "7"]
    assert calls(fake_pct) == ["nobody status 200 --verbose", "nobody reboot 200 --timeout 7", "nobody status 200"]
    (fake_pct / "calls").write_text("")
    r = run_pct_module(fake_pct, "proxmox_ct_exec", {"vmid": 200, "argv": ["true"], "pct_become_method": "env"}, as_nobody=True)
    assert r["cmd"][:2] == ["env", str(fake_pct / "pct")]
    assert calls(fake_pct)[0] == "nobody status 200 --verbose"
    (fake_pct / "calls").write_text("")
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200}, as_nobody=False)
    assert r["cmd"] == [str(fake_pct / "pct"), "status", "200"] and r["ct_status"] == "running" and not r["changed"]
    assert r["stdout"] == "status: running\n"
    assert calls(fake_pct) == ["root status 200 --verbose"]


def test_power_is_idempotent_and_check_mode_runs_only_status(fake_pct):
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200, "operation": "start"}, as_nobody=False)
    assert not r["changed"] and "already running" in r["msg"]
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200, "operation": "stop"}, as_nobody=False, check_mode=True)
    assert r["changed"] and "would run" in r["msg"]
    assert calls(fake_pct) == ["root status 200 --verbose", "root status 200 --verbose"]
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200, "operation": "stop"}, as_nobody=False)
    assert r["changed"] and r["ct_status"] == "stopped"
    r = run_pct_module(fake_pct, "proxmox_ct_power", {"vmid": 200, "operation": "shutdown"}, as_nobody=False)
    assert not r["changed"] and "already stopped" in r["msg"]


@pytest.mark.parametrize("args, fragment", [
    ({"vmid": "200; reboot"}, "vmid"),
    ({"vmid": 200, "operation": "start", "timeout": 5}, "timeout applies to operation shutdown or reboot only"),
    ({"vmid": 200, "operation": "reboot", "timeout": 0}, "timeout must be a positive"),
    ({"vmid": 200, "operation": "reboot", "command_timeout": -1}, "command_timeout must be a positive"),
    ({"vmid": 200, "operation": "destroy"}, "value of operation must be one of"),
])
def test_power_bad_input_names_the_option_and_runs_nothing(fake_pct, args, fragment):
    r = run_pct_module(fake_pct, "proxmox_ct_power", args, as_nobody=False)
    assert r["failed"] and fragment in r["msg"], r
    assert calls(fake_pct) == []
