"""proxmox_ct_exec option handling: bad input fails with the option named, before pct is touched.

The module runs as a real process (tests/support/module.py: ``python -m``, its arguments as JSON);
``pct_path`` points at a marker script that records any call, so the tests can
prove nothing was run. The behaviour against containers is in
tests/integration/test_proxmox_ct_exec.py.
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.support.module import run_module

pytestmark = pytest.mark.processes

# each run bounded to 60 s
run_exec = functools.partial(run_module, "proxmox_ct_exec", timeout=60)


@pytest.fixture
def recorder(tmp_path):
    """A stand-in path for pct that only records that it was called (it must never be)."""
    log = tmp_path / "calls"
    script = tmp_path / "pct"
    script.write_text("#!/bin/sh\necho \"$@\" >> %s\nexit 99\n" % log)
    script.chmod(0o755)
    return script, log


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"vmid": "200; reboot", "argv": ["true"]}, "vmid"),
        ({"vmid": 99, "argv": ["true"]}, "between 100 and 999999999"),
        ({"vmid": 200}, "one of the following is required: argv, command"),
        ({"vmid": 200, "argv": ["true"], "command": "true"}, "mutually exclusive"),
        ({"vmid": 200, "argv": []}, "argv must not be empty"),
        ({"vmid": 200, "argv": ["true"], "env": {"BAD KEY": "x"}}, "env key 'BAD KEY'"),
        ({"vmid": 200, "argv": ["true"], "timeout": 0}, "timeout must be a positive"),
        ({"vmid": 200, "argv": ["true"], "kill_after": -1}, "kill_after must be a positive"),
        ({"vmid": 200, "argv": ["true"], "start_timeout": 0}, "start_timeout must be a positive"),
        ({"vmid": 200, "argv": ["true"], "chdir": ""}, "chdir"),
    ],
)
def test_bad_input_names_the_option_and_runs_nothing(recorder, args, fragment):
    script, log = recorder
    result = run_exec(dict(args, pct_path=str(script)))
    assert result["failed"]
    assert fragment in result["msg"]
    assert not log.exists()


def test_missing_pct_says_where_to_run(tmp_path):
    result = run_exec({"vmid": 200, "argv": ["true"], "pct_path": str(tmp_path / "nope")})
    assert result["failed"] and "run this module on the Proxmox VE host" in result["msg"]


@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the module runs pct through sudo -n (tested in test_pct_host_least_privilege.py)")
def test_built_command_is_returned_even_on_failure(recorder):
    script, log = recorder
    result = run_exec({"vmid": 200, "argv": ["echo", "$x `y`"], "pct_path": str(script), "timeout": 9}, check_mode=True)
    # the recorder answers `pct status` with rc 99: the module stops there, having run only that
    assert result["cmd"] == [str(script), "exec", "200", "--", "timeout", "--kill-after=5s", "9s", "echo", "$x `y`"]
    assert result["failed"] and "pct status 200" in result["msg"]
    assert log.read_text().split("\n")[:-1] == ["status 200 --verbose"]
