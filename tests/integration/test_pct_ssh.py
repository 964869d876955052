"""The pct_ssh connection, for real, against CT200 in the lab: a connection-test-style suite.

One ansible-playbook run drives a matrix of inventory hosts, all CT200, in
parallel: as root and as the sudo user ``pveops``, with and without
pipelining, with the ``cat`` transfer fallback, and without the shared
connection (``control_persist=0``). Each runs raw, command and
shell with hostile quoting, and copies and fetches an empty file, a binary file,
a 200 MB file and files with non-ASCII names. The tests then compare what came
back byte for byte. The lab is never brought down; skipped when it is not up.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.support.inventory import pct_ssh_hostvars
from tests.support.lab import SUDO_USER
from tests.support.playbook import control_dir, run_json_play
from tests.support.ssh import on_host
from tests.support.stop_faults import stop_masters

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

# name -> (host user, pipelining, transfer method, include the 200 MB file); the sudo user is pveops in lane 0
MATRIX = {
    "root_pipelined": ("root", True, "auto", True),
    "root_plain": ("root", False, "auto", False),
    "pveops_pipelined": (SUDO_USER, True, "auto", False),
    "pveops_plain": (SUDO_USER, False, "auto", True),
    "root_cat": ("root", False, "cat", True),
    "root_direct": ("root", True, "auto", False),  # control_persist=0: no master, a connection per task
}
HOSTILE_ARGV = ["it's", "$HOME", "`id`", 'say "hi"', "a;b && c | d", "\u00e9t\u00e9 \u65e5\u672c", "line1\nline2", "200; reboot"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def suite(lab, tmp_path_factory):
    status = lab
    tmp = tmp_path_factory.mktemp("pct_ssh_suite")
    src = tmp / "src"
    src.mkdir()
    (src / "empty.bin").write_bytes(b"")
    (src / "binary.bin").write_bytes(bytes(range(256)) * 1024 + os.urandom(4096) + b"\r\n\x00\xff")
    (src / "donn\u00e9es \u65e5\u672c 'q' $x.txt").write_text("caf\u00e9 \u2615\n", encoding="utf-8")
    with open(src / "big.bin", "wb") as fh:
        block = os.urandom(1 << 20)
        for i in range(200):
            fh.write(block[i:] + block[:i])  # 200 MiB, no two blocks alike
    hosts = {}
    for name, (user, pipelining, method, big) in MATRIX.items():
        files = ["empty.bin", "binary.bin", "donn\u00e9es \u65e5\u672c 'q' $x.txt"] + (["big.bin"] if big else [])
        hosts[name] = pct_ssh_hostvars(
            status,
            ansible_user=user,
            ansible_pipelining=pipelining,
            ansible_pct_ssh_transfer_method=method,
            it_files=files,
            it_src=str(src),
            it_fetch=str(tmp / "fetched" / name),
        )
        if name == "root_direct":
            hosts[name]["ansible_pct_ssh_control_persist"] = 0
        else:  # the masters are asked who they logged in as after the whole play (then stopped, below)
            hosts[name]["ansible_pct_ssh_control_persist"] = 600
    before = host_tmp_dirs(status)
    results = run_json_play(tmp, hosts, "pct_ssh_suite", [{"it_argv": ["printf", "%s\\n"] + HOSTILE_ARGV}])
    results["_masters"] = masters(control_dir(tmp))
    results["_master_logins"] = master_logins(control_dir(tmp), status)
    stop_masters(str(control_dir(tmp)))
    return results, src, tmp, before


def masters(cp: Path) -> dict:
    """pid -> {VmHWM (peak RSS), VmRSS (kB), Threads} of each control master still serving under CP: the peak is
    what the test bounds; RSS now and the threads tell a transient peak from memory the master kept."""
    from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh

    out = {}
    for sock in cp.glob("*.sock"):
        pid = _pct_ssh.MasterClient(str(sock))._call({"op": "ping"})[0]["pid"]
        with open("/proc/%d/status" % pid) as fh:
            fields = dict(line.split(":", 1) for line in fh)
        out[pid] = {name: int(fields[name].split()[0]) for name in ("VmHWM", "VmRSS", "Threads")}
    return out


def master_logins(cp: Path, status: dict) -> dict:
    """socket path -> (mode of the socket, the host user its SSH connection is logged in as, asked on the host)."""
    from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh

    out = {"_dir_mode": oct(cp.stat().st_mode & 0o777)}
    for sock in cp.glob("*.sock"):
        try:
            who = _pct_ssh.MasterClient(str(sock)).exec("id -un", timeout=30).stdout.decode().strip()
        except _pct_ssh.SessionError as e:
            # a master that ends its connection on its own is a bug: the lab host's sshd says how the link ended
            raise AssertionError("%s\nthe lab host's sshd log, last lines:\n%s" % (e, sshd_log_tail(status))) from None
        out[str(sock)] = (oct(sock.lstat().st_mode & 0o777), who)
    return out


def sshd_log_tail(status: dict, lines: int = 40) -> str:
    """The last LINES of the lab host's sshd log (``lab status`` names it)."""
    log = Path(status["sshd"]["log"])
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return "(unreadable: %s)" % e


@pytest.mark.parametrize("host", sorted(MATRIX))
def test_raw_keeps_streams_apart(suite, host):
    r = suite[0]["raw"][host]
    assert r["rc"] == 3
    assert r["stdout"].strip() == "out"
    assert r["stderr"].strip() == "err"


@pytest.mark.parametrize("host", sorted(MATRIX))
def test_hostile_argv_arrives_intact(suite, host):
    r = suite[0]["argv"][host]
    assert r["rc"] == 0, r
    assert r["stdout"] == "\n".join(HOSTILE_ARGV)


@pytest.mark.parametrize("host", sorted(MATRIX))
def test_shell_text_is_parsed_once_inside_the_container(suite, host):
    r = suite[0]["shell"][host]
    assert r["stdout"] == "it's|$HOME|42|x\"y|n|bt|"


@pytest.mark.parametrize("host", sorted(MATRIX))
def test_runs_as_container_root_and_becomes_inside(suite, host):
    assert suite[0]["whoami"][host]["stdout"] == "root"
    assert suite[0]["become nobody inside the container"][host]["stdout"] == "nobody"


@pytest.mark.parametrize("host", sorted(MATRIX))
def test_files_arrive_and_come_back_byte_for_byte(suite, host):
    results, src, tmp = suite[:3]
    files = [item["item"] for item in results["copy"][host]["results"]]
    failures = [(i["item"], i.get("msg"), i.get("exception", "")[-800:]) for i in results["copy"][host]["results"] if i.get("failed")]
    assert files and not failures
    for item in results["stat"][host]["results"]:
        local = src / item["item"]
        assert item["stat"]["exists"], item
        assert item["stat"]["size"] == local.stat().st_size
        assert item["stat"]["checksum"] == sha256(local)
        assert item["stat"]["mode"] == "0640"
    for name in files:
        fetched = tmp / "fetched" / host / name
        assert fetched.exists(), "%s not fetched" % name
        assert sha256(fetched) == sha256(src / name), name
    assert not results["cleanup"][host].get("failed")


def test_matrix_covers_the_200mb_file_for_root_sudo_and_cat(suite):
    results = suite[0]
    big = [h for h in MATRIX if "big.bin" in [i["item"] for i in results["copy"][h]["results"]]]
    assert sorted(big) == ["pveops_plain", "root_cat", "root_pipelined"]


def host_tmp_dirs(status: dict) -> set:
    """The pct_ssh temporary directories in the lab host's /tmp (plain OpenSSH, not the plugin)."""
    done = on_host(status, "ls -a /tmp", check=False)
    assert done.returncode == 0, done.stderr
    return {n for n in done.stdout.split() if n.startswith(".pct_ssh-")}


def test_no_temporary_files_left_on_the_host(lab, suite):
    assert host_tmp_dirs(lab) <= suite[3]


def test_one_shared_connection_per_host_user(suite):
    """Every task runs in a fresh worker, yet root's three shared hosts use one master and pveops' two another."""
    assert len(suite[0]["_masters"]) == 2


def test_each_login_has_its_own_private_connection(suite):
    """root's hosts and pveops' hosts never share a logged-in connection; sockets 0600 in a 0700 directory."""
    logins = dict(suite[0]["_master_logins"])
    assert logins.pop("_dir_mode") == "0o700"
    assert sorted(who for _mode, who in logins.values()) == sorted([SUDO_USER, "root"])
    assert {mode for mode, _who in logins.values()} == {"0o600"}


def test_transfers_stream_in_bounded_memory(suite):
    """200 MiB went through each master; none ever held anything near that in memory."""
    for pid, seen in suite[0]["_masters"].items():
        assert seen["VmHWM"] < 120 * 1024, "master %d peaked at %d MiB (%d MiB now, %d threads)" % (
            pid, seen["VmHWM"] // 1024, seen["VmRSS"] // 1024, seen["Threads"])
