"""The result assembly shared by proxmox_ct_exec and proxmox_ct_power (``_pct.host``), on real commands run
under the host-side ``timeout -s KILL`` bound. The modules themselves are run end to end in
tests/unit/plugins/modules/test_pct_host_least_privilege.py and test_proxmox_ct_exec_options.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import host as _pct_host

pytestmark = pytest.mark.processes


class Host:
    """What the runners use of AnsibleModule: run_command, here running the argv for real."""

    def run_command(self, argv, data=None, binary_data=False, encoding=None, expand_user_and_vars=True,
                    environ_update=None):
        env = dict(os.environ, **(environ_update or {}))  # as AnsibleModule.run_command applies it
        done = subprocess.run(argv, input=data, capture_output=True, check=False, env=env)
        return done.returncode, done.stdout, done.stderr


HOST = _pct_host.PctHost(Host(), "/usr/sbin/pct", [], "sudo")


def test_pct_runs_under_a_utf8_ctype_only_for_non_ascii_arguments():
    script = 'printf "%s|" "$1" "${LC_CTYPE-unset}"'
    ascii_run = HOST.run_captured(["env", "-u", "LC_CTYPE", "sh", "-c", script, "sh", "cafe"], None, 10)
    assert ascii_run.stdout == "cafe|unset|"
    text = HOST.run_captured(["sh", "-c", script, "sh", "caf\u00e9"], None, 10)
    assert text.stdout == "caf\u00e9|C.UTF-8|"


def test_captured_output_becomes_the_result_keys_both_modules_return():
    ran = HOST.run_captured(["sh", "-c", "printf 'a\\nb\\n'; printf 'oops \\377\\n' >&2; exit 3"], None, 10)
    assert (ran.rc, ran.hung) == (3, False)
    result = ran.as_result()
    assert result["changed"] is True and result["rc"] == 3
    assert result["stdout"] == "a\nb\n" and result["stdout_lines"] == ["a", "b"]
    assert result["stderr_lines"] == ["oops \ufffd"]  # undecodable bytes are replaced, never an exception
    assert 0 <= result["elapsed"] < 10


def test_a_command_past_its_bound_is_killed_and_reported_hung():
    ran = HOST.run_captured(["sleep", "30"], None, 1)
    assert ran.hung and ran.elapsed < 10, ran


def test_stdin_reaches_the_command():
    assert HOST.run_captured(["cat"], b"fed\n", 10).stdout == "fed\n"


def test_failed_keeps_the_result_and_adds_what_the_failure_knows():
    base = _pct_host.base_result(rc=0)
    assert base["ct_status"] == "unknown" and base["changed"] is False and base["cmd"] == []
    out = _pct_host.failed(dict(base, cmd=["pct", "status", "200"]),
                           _pct_host.PctHostFailure("container 200 does not exist", ct_status="missing"))
    assert out["failed"] is True and out["msg"] == "container 200 does not exist"
    assert out["ct_status"] == "missing" and out["cmd"] == ["pct", "status", "200"] and out["rc"] == 0
