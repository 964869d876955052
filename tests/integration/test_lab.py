"""The CT200 lab itself, through its real parts: sshd, pct, LXC, tmux, the fake GPUs.

Everything goes over the lab's SSH as a client would (OpenSSH's ``ssh``
with the lab key and known_hosts), so these tests check the contract other
tests and the inventories rely on. Needs ``tests/lab/lab up`` (root);
skipped with the reason otherwise. The tests leave the lab as they found it
(201 stopped, the dflash trainer running).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import uuid

import pytest

from tests.support import ct200
from tests.support.lab import (
    DECOY_CT,
    MAIN_CT,
    NARROW_USER,
    NOSUDO_USER,
    SUDO_USER,
    lab_cli,
    lab_status,
    require_stopped,
    sshd_restart_result,
    start_sshd_restart,
    trainer,
)
from tests.support.paths import LAB_DIR, LANE
from tests.support.procfs import listening
from tests.support.ssh import on_host, ssh_argv
from tests.support.wait import wait_for

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def status(lab) -> dict:
    return lab


def ssh(st: dict, command: str, user: str = "root", timeout: float = 60) -> subprocess.CompletedProcess:
    return on_host(st, command, user=user, timeout=timeout, check=False)


def pct(st: dict, *args: str, user: str = "root", timeout: float = 60) -> subprocess.CompletedProcess:
    prefix = "pct" if user == "root" else "sudo -n pct"
    return ssh(st, prefix + " " + shlex.join(args), user=user, timeout=timeout)


def ensure_trainer(st: dict) -> dict:
    """Other suites stop the trainer on purpose; bring it back (graceful) when it is not running."""
    if not (lab_status() or {}).get("trainer", {}).get("running"):
        trainer("graceful")
    return lab_status()


# ---------------------------------------------------------------- the PVE host


def test_status_json_names_everything_a_client_needs(status):
    assert (status["host"], status["port"]) == ("127.0.0.1", LANE.port)
    assert os.stat(status["key"]).st_mode & 0o077 == 0, "ssh refuses a group/world-readable key"
    with open(status["known_hosts"], encoding="ascii") as handle:
        assert handle.read().startswith("[127.0.0.1]:%d ssh-ed25519 " % LANE.port)
    assert set(status["users"]) == {"root", SUDO_USER, NOSUDO_USER, NARROW_USER}
    assert os.access(status["pct_narrow"], os.X_OK)
    assert status["containers"] == {MAIN_CT: "running", DECOY_CT: status["containers"][DECOY_CT]}
    assert status["hostnames"] == {MAIN_CT: "ct200", DECOY_CT: "ct201"}
    assert status["trainer"]["tmux_session"] == "dflash"
    assert os.path.isdir(status["fakegpu"]["dir"])


def test_pct_exec_hostname_over_ssh(status):
    res = pct(status, "exec", MAIN_CT, "--", "hostname")
    assert (res.returncode, res.stdout, res.stderr) == (0, "ct200\n", "")


def test_pct_exec_returns_the_commands_exit_code_and_keeps_streams_apart(status):
    res = pct(status, "exec", MAIN_CT, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "err\n")


def test_pct_exec_keep_env_as_real_pct(status):
    kept = pct(status, "exec", MAIN_CT, "--", "sh", "-c", 'echo "$PATH|$SSH_CONNECTION"')
    # run_cli_handler fixes PATH; --keep-env (the default) passes the ssh session's env on
    assert kept.stdout.startswith("/sbin:/bin:/usr/sbin:/usr/bin|127.0.0.1 ")
    cleared = pct(status, "exec", MAIN_CT, "--keep-env", "0", "--", "sh", "-c", 'echo "$PATH|$SSH_CONNECTION"')
    assert cleared.stdout == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|\n"


def test_pct_exec_on_stopped_201_fails_like_real_pct(status):
    require_stopped(status)
    res = pct(status, "exec", DECOY_CT, "--", "true")
    assert (res.returncode, res.stdout, res.stderr) == (255, "", f"container '{DECOY_CT}' not running!\n")


def test_pct_unknown_and_invalid_vmids(status):
    res = pct(status, "exec", "999", "--", "true")
    assert res.returncode == 255
    assert res.stderr == "Configuration file 'nodes/%s/lxc/999.conf' does not exist\n" % status["node"]
    res = pct(status, "status", "abc")
    assert res.returncode == 255
    assert res.stderr.splitlines()[:2] == [
        "400 Parameter verification failed.",
        "vmid: invalid format - value does not look like a valid VM ID",
    ]


def test_pct_status_list_config(status):
    assert pct(status, "status", MAIN_CT).stdout == "status: running\n"
    verbose = dict(line.split(": ", 1) for line in pct(status, "status", MAIN_CT, "--verbose").stdout.splitlines())
    assert verbose["name"] == "ct200" and verbose["status"] == "running" and int(verbose["pid"]) > 1
    listing = pct(status, "list").stdout.splitlines()
    assert listing[0].split() == ["VMID", "Status", "Lock", "Name"]
    rows = {line.split()[0]: line.split() for line in listing[1:]}
    assert rows[MAIN_CT] == [MAIN_CT, "running", "ct200"]
    assert rows[DECOY_CT][2] == "ct201"
    config = pct(status, "config", MAIN_CT).stdout.splitlines()
    assert "hostname: ct200" in config
    keys = [line.split(":")[0] for line in config if not line.startswith("lxc.")]
    assert keys == sorted(keys), "pct config prints the keys sorted, lxc.* entries last"


def test_push_pull_roundtrip(status, tmp_path):
    payload = "lab roundtrip %s\n" % uuid.uuid4().hex
    src = tmp_path / "src.txt"
    src.write_text(payload)
    back = tmp_path / "back.txt"
    inside = "/tmp/lab-roundtrip-%s" % uuid.uuid4().hex[:8]
    try:
        res = pct(status, "push", MAIN_CT, str(src), inside, "--perms", "640", "--user", "nobody")
        assert (res.returncode, res.stderr) == (0, "")
        # owner names resolve inside the container, perms are octal by default
        stat = pct(status, "exec", MAIN_CT, "--", "stat", "-c", "%a %U", inside).stdout
        assert stat == "640 nobody\n"
        res = pct(status, "pull", MAIN_CT, inside, str(back))
        assert (res.returncode, res.stderr) == (0, "")
        assert back.read_text() == payload
    finally:
        pct(status, "exec", MAIN_CT, "--", "rm", "-f", inside)


def test_failed_pull_and_push_exit_0_like_real_pct(status, tmp_path):
    """pct.pm's push and pull have no exit-code handler: a failed copy prints its message and exits 0
    (tests/lab/README.md "Fidelity"). pull creates its destination before it opens the source, and File::Copy's
    result is never checked, so a failed or short copy leaves an empty file behind."""
    dest = tmp_path / "x"
    res = pct(status, "pull", MAIN_CT, "/nonexistent/file", str(dest))
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "failed to open /nonexistent/file: No such file or directory\n")
    assert dest.read_bytes() == b""
    res = pct(status, "pull", MAIN_CT, "/etc", str(tmp_path / "dir"))  # a directory: copy() fails, says nothing
    assert (res.returncode, res.stderr, (tmp_path / "dir").read_bytes()) == (0, "", b"")
    res = pct(status, "push", MAIN_CT, str(tmp_path / "missing"), "/tmp/never")
    assert (res.returncode, res.stderr) == (0, "failed to open %s for reading\n" % (tmp_path / "missing"))
    res = pct(status, "push", MAIN_CT, str(dest), "/nonexistent/dir/file")
    assert (res.returncode, res.stderr) == (0, "failed to create file: /nonexistent/dir/file: No such file or directory\n")


def test_sudo_user_runs_pct_only(status):
    res = pct(status, "status", MAIN_CT, user=SUDO_USER)
    assert (res.returncode, res.stdout) == (0, "status: running\n")
    res = pct(status, "exec", MAIN_CT, "--", "hostname", user=SUDO_USER)
    assert res.stdout == "ct200\n"
    other = ssh(status, "sudo -n /usr/bin/id -u", user=SUDO_USER)
    assert other.returncode != 0 and other.stdout == ""


def test_user_without_sudo_fails_fast(status):
    res = pct(status, "status", MAIN_CT, user=NOSUDO_USER, timeout=30)
    assert res.returncode == 1
    assert "a password is required" in res.stderr


def test_pct_lives_only_in_the_lab_hosts_namespace(status):
    # a regular file (a non-root login must see it even when the checkout sits under a 0700 directory)
    # that execs the checkout's pct
    res = ssh(status, "test -f /usr/sbin/pct && test ! -L /usr/sbin/pct && tail -n 1 /usr/sbin/pct; command -v nvidia-smi")
    assert res.stdout.splitlines() == ['exec %s "$@"' % (LAB_DIR / "pct"), "/usr/bin/nvidia-smi"]
    # the machine's own /usr/sbin stays untouched (unless it is a real PVE host)
    if not os.path.exists("/usr/share/perl5/PVE/CLI/pct.pm"):
        assert not os.path.lexists("/usr/sbin/pct")


def test_sshd_restart_keeps_sessions_and_replaces_the_listener(status):
    """`lab sshd-restart --down-for 2`: an established session goes on through it (Debian's ssh.service,
    KillMode=process), a new connection in the gap is refused, the next one reaches the new listener; bad input is
    refused naming the option, with nothing signalled."""
    session = subprocess.Popen(ssh_argv(status) + ["echo started; sleep 4; echo still here"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert session.stdout.readline().strip() == "started"
        restarting = start_sshd_restart(2.0)
        wait_for(lambda: not listening(status["port"]), 10, "the listener to close", interval=0.01)
        refused = ssh(status, "true", timeout=30)
        assert refused.returncode == 255 and "Connection refused" in refused.stderr, refused.stderr
        restarted = sshd_restart_result(restarting, 2.0)
        out, err = session.communicate(timeout=30)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert session.returncode == 0 and out.strip() == "still here", (session.returncode, out, err)
    assert restarted["new_pid"] != restarted["old_pid"] and restarted["down_s"] >= 1.9, restarted
    fresh = lab_status()
    assert fresh["sshd"]["pid"] == restarted["new_pid"] and fresh["sshd"]["running"], fresh["sshd"]
    assert ssh(status, "echo ok").stdout.strip() == "ok"
    bad = lab_cli("sshd-restart", "--down-for", "-1")
    assert bad.returncode == 1 and "--down-for -1.0: give the seconds without a listener" in bad.stderr, bad.stderr
    assert lab_status()["sshd"]["pid"] == restarted["new_pid"]


def test_start_shutdown_stop_201(status):
    require_stopped(status)
    try:
        assert pct(status, "start", DECOY_CT, timeout=90).returncode == 0
        assert pct(status, "status", DECOY_CT).stdout == "status: running\n"
        again = pct(status, "start", DECOY_CT)
        assert (again.returncode, again.stderr) == (255, f"CT {DECOY_CT} already running\n")
        assert pct(status, "exec", DECOY_CT, "--", "hostname").stdout == "ct201\n"
        res = pct(status, "shutdown", DECOY_CT, "--timeout", "60", timeout=90)
        assert (res.returncode, res.stderr) == (0, "")
        assert pct(status, "status", DECOY_CT).stdout == "status: stopped\n"
        res = pct(status, "stop", DECOY_CT)
        assert (res.returncode, res.stderr) == (255, f"CT {DECOY_CT} not running\n")
    finally:
        if pct(status, "status", DECOY_CT).stdout != "status: stopped\n":
            pct(status, "stop", DECOY_CT, timeout=90)


# ---------------------------------------------------------------- inside CT200


def test_tmux_capture_pane_shows_training_steps(status):
    # other suites stop and restart the shared trainer: look again (bounded) if one just did
    for _attempt in range(3):
        ensure_trainer(status)
        res = pct(status, "exec", MAIN_CT, "--", "tmux", "capture-pane", "-p", "-t", "dflash")
        if re.search(r"^step \d+ \| [\d.]+ Ktok/s", res.stdout, re.M):
            return
    pytest.fail("no step line in the dflash pane:\n" + res.stdout)


def test_eight_busy_gpus_in_the_container(status):
    ensure_trainer(status)
    res = pct(status, "exec", MAIN_CT, "--", "nvidia-smi", "--query-gpu=index,memory.used",
              "--format=csv,noheader,nounits")
    rows = [line.split(", ") for line in res.stdout.splitlines()]
    assert [int(row[0]) for row in rows] == list(range(8)), res.stdout + res.stderr
    assert all(int(row[1]) > 1000 for row in rows), res.stdout


def test_decoys_run_in_ct200(status):
    res = pct(status, "exec", MAIN_CT, "--", "ps", "-eo", "args")
    lines = res.stdout.splitlines()
    assert "/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers" in lines
    assert "vi /opt/lab/trainer/fake_trainer.py" in lines
    assert "watch -n 5 nvidia-smi" in lines
    unit = pct(status, "exec", MAIN_CT, "--", "systemctl", "is-active", "networkd-dispatcher.service")
    assert unit.stdout == "active\n"


def test_lab_trainer_restart_ends_only_the_recorded_trainer(status):
    before = ensure_trainer(status)["trainer"]
    decoys_before = ct200.decoy_pids(status)  # not the fork `watch` makes each interval (gone a moment later)
    after = trainer("graceful")  # as recorded under the lab's lock (other suites may restart it next)
    old = [before["host_pids"]["launcher"], before["host_pids"]["pane_shell"], *before["host_pids"]["workers"]]
    new = [after["host_pids"]["launcher"], after["host_pids"]["pane_shell"], *after["host_pids"]["workers"]]
    assert len(after["host_pids"]["workers"]) == 8 and after["running"]
    assert not set(old) & set(new)
    for pid in old:  # gone, or a zombie nobody reaps (this machine's PID 1 does not)
        try:
            with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
                assert handle.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            pass
    decoys_after = ct200.decoy_pids(status)
    assert decoys_after == decoys_before and len(decoys_after) == 3
