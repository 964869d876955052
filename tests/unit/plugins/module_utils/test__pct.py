"""Table-driven tests of the shared pct command builder, with hostile strings.

The round-trip tests hand the quoted command to a real /bin/sh and check the
argv it produced, so quoting is proven by a shell, not by string comparison.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils import _pct

HOSTILE = [
    "",
    "plain",
    "it's",
    'say "hi"',
    "$HOME ${PATH} $(id) `id`",
    "line1\nline2\n",
    "tab\there",
    "200; reboot",
    "a && b || c | d > /tmp/x < /etc/passwd &",
    "glob * ? [a-z] ~root",
    "\u00e9t\u00e9 \u65e5\u672c\u8a9e \U0001f680",
    "back\\slash \\n",
    "-- --keep-env 1",
    "'\"'\"'",
]


@pytest.mark.parametrize(
    "value, expected",
    [(100, 100), (200, 200), ("201", 201), (" 300 ", 300), (999999999, 999999999)],
)
def test_validate_vmid_accepts(value, expected):
    assert _pct.validate_vmid(value) == expected


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("200; reboot", "200; reboot"),
        ("200 201", "integer VMID"),
        ("$(reboot)", "integer VMID"),
        ("", "integer VMID"),
        (None, "integer VMID"),
        (True, "boolean"),
        (200.0, "integer VMID"),
        ("-200", "integer VMID"),
        ("0x10", "integer VMID"),
        (99, "between 100 and 999999999"),
        (1000000000, "between 100 and 999999999"),
        ("\u0662\u0660\u0660", "integer VMID"),  # Arabic-Indic digits: isdigit() but not a VMID
    ],
)
def test_validate_vmid_rejects(value, fragment):
    with pytest.raises(_pct.PctError) as exc:
        _pct.validate_vmid(value, option="proxmox_vmid")
    assert "proxmox_vmid" in str(exc.value)
    assert fragment in str(exc.value)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"argv": ["true"]}, ["/usr/sbin/pct", "exec", "200", "--", "true"]),
        ({"argv": ["true"], "keep_env": False}, ["/usr/sbin/pct", "exec", "200", "--keep-env", "0", "--", "true"]),
        ({"argv": ["true"], "keep_env": True}, ["/usr/sbin/pct", "exec", "200", "--keep-env", "1", "--", "true"]),
        (
            {"argv": ["ls", "-l"], "prefix": ["sudo", "-n"], "pct_path": "/opt/pct"},
            ["sudo", "-n", "/opt/pct", "exec", "200", "--", "ls", "-l"],
        ),
    ],
)
def test_exec_argv(kwargs, expected):
    assert _pct.exec_argv(200, **kwargs) == expected


@pytest.mark.parametrize(
    "argv, fragment",
    [([], "must not be empty"), ("ls -l", "single string"), (["ls", 3], r"argv\[1\] must be a string"), (["a\x00b"], "NUL")],
)
def test_exec_argv_rejects(argv, fragment):
    with pytest.raises(_pct.PctError, match=fragment):
        _pct.exec_argv(200, argv)


def test_exec_argv_rejects_bad_vmid_before_building():
    with pytest.raises(_pct.PctError, match="200; reboot"):
        _pct.exec_argv("200; reboot", ["true"])


@pytest.mark.parametrize("text", HOSTILE)
def test_quoted_shell_exec_reaches_argv_intact(text):
    """What the host shell makes of the quoted command is exactly our argv."""
    argv = _pct.shell_exec_argv(200, text, prefix=["sudo", "-n"])
    line = _pct.quote(argv)
    # the host shell parses the line once; the "pct" stand-in prints the argv it got
    probe = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    out = subprocess.run(
        ["/bin/sh", "-c", _pct.quote(probe) + " " + line], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out) == ["sudo", "-n", "/usr/sbin/pct", "exec", "200", "--", "/bin/sh", "-c", text]


@pytest.mark.parametrize("text", HOSTILE)
def test_quote_is_single_shlex_join(text):
    argv = _pct.exec_argv(200, ["printf", "%s", text])
    assert shlex.split(_pct.quote(argv)) == argv


@pytest.mark.parametrize(
    "kwargs, tail",
    [
        ({}, []),
        ({"user": "root", "group": "root", "perms": 0o644}, ["--user", "root", "--group", "root", "--perms", "0644"]),
        ({"user": 1000, "group": "1000", "perms": "755"}, ["--user", "1000", "--group", "1000", "--perms", "0755"]),
        ({"perms": "0600"}, ["--perms", "0600"]),
    ],
)
def test_push_pull_argv(kwargs, tail):
    assert _pct.transfer_argv("push", 200, "/tmp/h x", "/ct/p\u00e9 'q'", **kwargs) == [
        "/usr/sbin/pct", "push", "200", "/tmp/h x", "/ct/p\u00e9 'q'"] + tail
    assert _pct.transfer_argv("pull", 200, "/ct/a", "/tmp/b", **kwargs) == ["/usr/sbin/pct", "pull", "200", "/ct/a", "/tmp/b"] + tail


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"user": "root; reboot"}, "user must be"),
        ({"group": ""}, "group must be"),
        ({"perms": "rw-r--r--"}, "perms must be"),
        ({"perms": 0o17777}, "perms must be"),
        ({"perms": True}, "perms must be"),
    ],
)
def test_push_rejects(kwargs, fragment):
    with pytest.raises(_pct.PctError, match=fragment):
        _pct.transfer_argv("push", 200, "/a", "/b", **kwargs)


def test_push_rejects_empty_paths():
    with pytest.raises(_pct.PctError, match="ct_path"):
        _pct.transfer_argv("push", 200, "/a", "")
    with pytest.raises(_pct.PctError, match="host_path"):
        _pct.transfer_argv("pull", 200, "/a", "")


def test_transfer_rejects_an_unknown_direction():
    with pytest.raises(_pct.PctError, match="direction must be one of pull, push"):
        _pct.transfer_argv("copy", 200, "/a", "/b")


@pytest.mark.parametrize(
    "user, method, expected",
    [
        ("root", "sudo", []),
        (None, "sudo", []),
        ("pveops", "sudo", ["sudo", "-n"]),
        ("pveops", "doas", ["doas", "-n"]),
        ("pveops", "none", []),
        ("pveops", "sudo -n -u root", ["sudo", "-n", "-u", "root"]),
    ],
)
def test_become_prefix(user, method, expected):
    assert _pct.become_prefix(user, method) == expected


def test_become_prefix_rejects_blank():
    with pytest.raises(_pct.PctError, match="pct_become_method"):
        _pct.become_prefix("pveops", " ")


def test_missing_rule_hint():
    assert _pct.missing_rule_hint("pveops") == "pveops ALL=(root) NOPASSWD: /usr/sbin/pct"
    assert "permit nopass pveops" in _pct.missing_rule_hint("pveops", "doas")


@pytest.mark.parametrize(
    "text, expected",
    [("status: running\n", "running"), ("status: stopped\n", "stopped"), ("warn\nstatus: running\n", "running")],
)
def test_parse_pct_status(text, expected):
    assert _pct.parse_pct_status(text) == expected


def test_parse_pct_status_rejects_garbage():
    with pytest.raises(_pct.PctError, match="unexpected"):
        _pct.parse_pct_status("Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n")


@pytest.mark.parametrize(
    "stderr, expected",
    [
        ("CT 201 not running\n", _pct.FAIL_STOPPED),
        ("container '201' not running!\n", _pct.FAIL_STOPPED),
        ("can only push files to a running CT\n", _pct.FAIL_STOPPED),
        ("can only pull files from a running VM\n", _pct.FAIL_STOPPED),
        ("the service is not running\n", None),
        ("Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n", _pct.FAIL_MISSING),
        ("sudo: a password is required\n", _pct.FAIL_SUDO),
        ("Sorry, user pvenosudo is not allowed to execute '/usr/sbin/pct status 200' as root on pve1.\n", _pct.FAIL_SUDO),
        ("sh: 1: /usr/sbin/pct: not found\n", _pct.FAIL_PCT_NOT_FOUND),
        ("bash: pct: command not found\n", _pct.FAIL_PCT_NOT_FOUND),
        ("ls: cannot access 'x': No such file or directory\n", None),
        ("", None),
    ],
)
def test_classify_failure(stderr, expected):
    assert _pct.classify_failure(stderr) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"version": 3, "ids": {"200": {"node": "pve2", "type": "lxc", "version": 1}}}', "pve2"),
        ('{"ids": {}}', None),
        ("not json", None),
    ],
)
def test_parse_vmlist(text, expected):
    assert _pct.parse_vmlist(text, 200) == expected


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, ["echo", "hi"]),
        ({"env": {"A": "1 2", "B": None}}, ["env", "A=1 2", "B=", "echo", "hi"]),
        ({"timeout": 10}, ["timeout", "--kill-after=5s", "10s", "echo", "hi"]),
        ({"timeout": 10, "kill_after": 2, "env": {"X": "$y"}}, ["timeout", "--kill-after=2s", "10s", "env", "X=$y", "echo", "hi"]),
    ],
)
def test_wrap_argv(kwargs, expected):
    assert _pct.wrap_argv(["echo", "hi"], **kwargs) == expected


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"env": {"A B": "x"}}, "env key"),
        ({"env": {"1A": "x"}}, "env key"),
        ({"env": {"A": "x\x00"}}, "NUL"),
        ({"timeout": 0}, "timeout must be"),
        ({"timeout": True}, "timeout must be"),
        ({"timeout": 5, "kill_after": 0}, "kill_after"),
        ({"chdir": ""}, "chdir"),
    ],
)
def test_wrap_argv_rejects(kwargs, fragment):
    with pytest.raises(_pct.PctError, match=fragment):
        _pct.wrap_argv(["echo"], **kwargs)


@pytest.mark.parametrize("directory", ["/", "/tmp/d\u00e9 'x' $(id)", "/tmp/no such dir"])
def test_wrap_argv_chdir_runs_in_a_real_shell(tmp_path, directory):
    """The chdir wrapper, run by /bin/sh here, enters hostile names or fails with its own code."""
    target = directory
    if directory.startswith("/tmp/d"):
        target = str(tmp_path / directory[5:])
        import os

        os.mkdir(target)
    argv = _pct.wrap_argv(["pwd"], chdir=target, env={"V": "$HOME `id`"})
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if "no such" in directory:
        assert res.returncode == _pct.CHDIR_FAILED_RC and "cannot enter directory" in res.stderr
    else:
        assert res.returncode == 0 and res.stdout == target + "\n"
