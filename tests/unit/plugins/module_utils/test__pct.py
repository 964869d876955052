"""Table-driven tests of the shared pct command builder, with hostile strings.

The round-trip tests hand the quoted command to a real /bin/sh and check the
argv it produced, so quoting is proven by a shell, not by string comparison.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import command as _pct

pytestmark = pytest.mark.processes

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
        ("bash: sudo: command not found\n", _pct.FAIL_NO_BECOME),
        ("sh: 1: sudo: not found\n", _pct.FAIL_NO_BECOME),
        ("timeout: failed to run command \u2018sudo\u2019: No such file or directory\n", _pct.FAIL_NO_BECOME),
        ("ipcc_send_rec[1] failed: Unknown error -1\nUnable to load access control list: Unknown error -1\n", _pct.FAIL_NOT_ROOT),
        ("please run as root\n", _pct.FAIL_NOT_ROOT),
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


# pct push/pull exit 0 when the copy fails (pve-container src/PVE/CLI/pct.pm gives them no exit-code
# handler): the verdict comes from the stderr and the sizes/digests the checks printed.
@pytest.mark.parametrize(
    "rc,stderr,got,expected",
    [
        (0, "", "5\n", None),
        (0, "sudo: unable to resolve host pve1: Name or service not known\n", "5\n", None),
        (0, "failed to open /tmp/x for reading\n", "5\n", "failed to open /tmp/x for reading"),
        (1, "failed to create file: /nope/f: No such file or directory\nstat: cannot statx '/nope/f': No such file or directory\n",
         "", "failed to create file: /nope/f: No such file or directory\nstat: cannot statx '/nope/f': No such file or directory"),
        (0, "", "3\n", "the copy has 3 bytes, the source 5 (truncated: is the destination's disk full?)"),
        (1, "", "", "rc 1 and no message"),
    ],
)
def test_copy_problem_trusts_the_checks_not_pct_s_exit_code(rc, stderr, got, expected):
    assert _pct.copy_problem(rc, stderr, 5, _pct.parse_size(got)) == expected


def test_pull_problem_compares_the_source_and_pulled_digests():
    a, b = "a" * 64, "b" * 64
    out = "%s  /etc/hosts\n%s  /tmp/x/file\n"
    assert _pct.pull_problem(0, "", _pct.parse_digests(out % (a, a))) is None
    assert _pct.pull_problem(0, "", _pct.parse_digests(out % (a, b))) == (
        "the pulled copy differs from the source (truncated: is the PVE host's disk full?)")
    said = "failed to open /etc/nope: No such file or directory\n"
    assert _pct.pull_problem(0, said, _pct.parse_digests(out % (a, "e3b0" + "0" * 60))) == said.strip()
    assert _pct.pull_problem(1, "sha256sum: /etc/nope: No such file or directory\n", []) == (
        "sha256sum: /etc/nope: No such file or directory")


def test_digests_of_files_whose_names_sha256sum_escaped_are_read(tmp_path):
    name = tmp_path / "line\nbreak \\ and 'q'"
    name.write_bytes(b"x")
    out = subprocess.run(["sha256sum", "--", str(name), str(name)], capture_output=True, text=True, check=True).stdout
    assert out.startswith("\\")
    assert _pct.parse_digests(out) == ["2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"] * 2


def test_then_runs_each_line_only_after_the_one_before_succeeded():
    assert _pct.then("pct push 200 a b", "pct exec 200 -- stat -c %s -- b") == "pct push 200 a b && pct exec 200 -- stat -c %s -- b"


FROZEN_FILES = {  # what each of freeze_state_files holds in a frozen container, and in a running one
    "cgroup.events": ("populated 1\nfrozen 1\n", "populated 1\nfrozen 0\n"),
    "freezer.state": ("FROZEN\n", "THAWED\n"),
}


@pytest.mark.parametrize("which", [0, 1, 2], ids=["cgroup_v2", "hybrid_unified", "cgroup_v1"])
def test_a_frozen_container_is_seen_by_the_module_reader_and_by_the_host_shell_guard(tmp_path, which):
    from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import host as _pct_host

    path = _pct.freeze_state_files(200, str(tmp_path))[which]
    os.makedirs(os.path.dirname(path))
    frozen, thawed = FROZEN_FILES[os.path.basename(path)]
    guard = _pct.frozen_guard(200, str(tmp_path)) + " && echo ran"
    for text, expected in ((thawed, False), (frozen, True)):
        with open(path, "w") as handle:
            handle.write(text)
        assert _pct_host.is_frozen(200, str(tmp_path)) is expected
        done = subprocess.run(["/bin/sh", "-c", guard], capture_output=True, text=True, check=False)
        if expected:
            assert (done.returncode, done.stdout) == (_pct.FROZEN_RC, "")
            assert done.stderr == "%s CT 200 is frozen\n" % _pct.FROZEN_MARK
        else:
            assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")
    assert _pct_host.is_frozen(201, str(tmp_path)) is False  # another container's files are not read


def test_freeze_files_are_those_of_the_containers_inner_cgroup_as_pve_lays_them_out():
    assert _pct.freeze_state_files(200) == ["/sys/fs/cgroup/lxc/200/ns/cgroup.events",
                                            "/sys/fs/cgroup/unified/lxc/200/ns/cgroup.events",
                                            "/sys/fs/cgroup/freezer/lxc/200/ns/freezer.state"]
    with pytest.raises(_pct.PctError):
        _pct.freeze_state_files("200; reboot")


def test_status_verbose_gives_the_lock_and_a_locked_refusal_names_it():
    fields = _pct.parse_status_verbose("cpus: 32\nlock: backup\nname: ct200\npid: 4443\nstatus: running\n")
    assert (fields["status"], fields["lock"], fields["pid"]) == ("running", "backup", "4443")
    with pytest.raises(_pct.PctError):
        _pct.parse_status_verbose("ipcc_send_rec[1] failed: Unknown error -1\n")
    assert _pct.locked_by("CT is locked (backup)\n") == "backup"
    assert _pct.locked_by("CT is locked (snapshot-delete)\n") == "snapshot-delete"
    assert _pct.locked_by("CT 200 not running\n") is None
    msg = _pct.locked_message(200, "pve1", "backup", "pct reboot 200")
    assert msg.startswith("CT 200 is locked (backup) on pve1:") and "`pct reboot 200` was not run" in msg
    assert "`pct unlock 200`" in msg


def test_a_pct_without_keep_env_is_named_only_by_pct_s_own_first_line():
    msg = _pct.keep_env_unknown("Unknown option: keep-env\n400 unable to parse option\npct exec <vmid> ...\n", "pve1")
    assert msg.startswith("pct on pve1 does not know --keep-env (pve-container older than 5.0.9")
    assert _pct.keep_env_unknown("boom\nUnknown option: keep-env\n", "pve1") is None  # the command's own output
    assert _pct.keep_env_unknown("", "pve1") is None


def test_an_ha_request_is_told_from_a_done_power_action():
    assert _pct.ha_request("Requesting HA start for CT 200\n") == "start"
    assert _pct.ha_request("Requesting HA stop for CT 200\n") == "stop"
    assert _pct.ha_request("") is None
    assert _pct.ha_request("WARN: Requesting HA start for CT 200 later\n") is None


def test_only_a_line_with_non_ascii_text_runs_pct_under_a_utf8_ctype():
    assert _pct.with_utf8_ctype("pct exec 200 -- true") == "pct exec 200 -- true"
    line = _pct.with_utf8_ctype(_pct.quote(["printf", "%s ", "caf\u00e9"]) + ' && echo "$LC_CTYPE"')
    done = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout == "caf\u00e9 C.UTF-8\n"
    assert _pct.needs_utf8(["a", "b\u00e9"]) and not _pct.needs_utf8(["a", "b"])
