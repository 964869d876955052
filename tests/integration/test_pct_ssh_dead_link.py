# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The SSH link to the PVE host dies during the SIGTERM rung: the task fails within the bound, the ladder finishes.

On the lab: CT200 runs the ``stubborn`` trainer (it ignores SIGINT and SIGTERM,
only SIGKILL ends it); ``training_stop`` runs inside CT200 through real
``ansible`` and ``gpuops.repurpose.pct_ssh``. During its SIGTERM rung the link
is cut three ways: the pct_ssh control master killed, the PVE host's sshd
processes serving that connection killed, and the same frozen (SIGSTOP: a
silent host). Each time:

- the ``ansible`` run fails (unreachable, saying the connection died) within the
  documented detection bound, never at ``command_timeout``;
- the ladder inside CT200 still climbs to SIGKILL: no process of the job is
  left, none stopped (state T);
- the record it left says so, and the re-run (a fresh connection) reports it:
  what was stopped, by which rung, when; a second re-run changes nothing.

The CT200 trainer is restarted with its earlier behaviour afterwards. Only
processes this test identified by their PIDs are signalled. Skipped when the
lab is not up.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LAB = os.path.join(ROOT, "tests", "lab", "lab")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (  # noqa: E402
    container_vmid_from_cgroup,
    iter_processes,
)
from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh  # noqa: E402

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

TRAINER = r"^\S*python3 /opt/lab/trainer/fake_trainer\.py "
# rung 1 (Ctrl-C) 2 s, rung 2 (SIGTERM) 10 s: the cut lands 4 s after the ladder started, inside SIGTERM
LADDER = [{"signal": "SIGINT", "via": "tmux", "timeout": 2}, {"signal": "SIGTERM", "timeout": 10},
          {"signal": "SIGKILL", "timeout": 5}]
CUT_AFTER_S = 4.0
ARGS = {"tmux_session": "dflash", "ladder": LADDER, "lock_timeout": 60}
# the connection's defaults (server_alive_interval 5, server_alive_count_max 3) and what a task adds around them
BOUND_S = _pct_ssh.dead_after(_pct_ssh.Settings(host="pve1.example.internal")) + 1.0
SLACK_S = 15.0  # ansible's own start and end on a loaded 2-core machine


def lab_status() -> dict | None:
    try:
        done = subprocess.run([LAB, "status"], capture_output=True, text=True, timeout=60, check=False)
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


@pytest.fixture(scope="module")
def lab() -> dict:
    if os.geteuid() != 0:
        pytest.skip("the CT200 lab needs root")
    status = lab_status()
    if not status or not status.get("up"):
        pytest.skip("the CT200 lab is not up (run: tests/lab/lab up)")
    return status


@contextlib.contextmanager
def lab_lock(status: dict, timeout: float = 600):
    """The lab's own operation lock: no ``lab trainer`` restarts CT200 meanwhile."""
    fd = os.open(status["lock_file"], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < end, "the lab lock stayed busy for %ss" % timeout
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < end, "timed out after %ss waiting for %s" % (timeout, what)
        time.sleep(0.2)


def trainer_procs() -> dict[int, str]:
    """Host pid -> state of the fake trainer's processes in CT200."""
    return {info.pid: info.state for info in iter_processes()
            if container_vmid_from_cgroup(info.cgroup) == 200 and re.search(TRAINER, info.command)}


def records(status: dict) -> list[dict]:
    """training_stop's ladder records in CT200's /run (read through the container init's root)."""
    init = subprocess.run(["lxc-info", "-P", status["lxcpath"], "-n", "200", "-pH"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()
    found = []
    for path in glob.glob("/proc/%s/root/run/gpuops-repurpose/training_stop-*.json" % init):
        try:
            with open(path) as handle:
                found.append(json.load(handle))
        except (OSError, ValueError):
            pass
    return found


def my_record(status: dict, since: float) -> dict:
    mine = [r for r in records(status) if "tmux_session=dflash" in r.get("selection", "") and r.get("started", 0) >= since]
    return max(mine, key=lambda r: r["started"]) if mine else {}


def adhoc(env: dict, args: dict, timeout: float = 300) -> subprocess.Popen:
    argv = [os.path.join(BIN, "ansible"), "ct200", "-i", os.path.join(ROOT, "inventories", "lab"), "-o",
            "-m", "gpuops.repurpose.training_stop", "-a", json.dumps(args)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL)


def result_of(out: str) -> tuple[str, dict]:
    line = [ln for ln in out.splitlines() if ln.startswith("ct200 | ")]
    assert line, out
    rest = line[0][len("ct200 | "):]
    if " => " in rest:
        status, _sep, payload = rest.partition(" => ")
        return status.strip(), json.loads(payload)
    status, _sep, msg = rest.partition(": ")  # UNREACHABLE!: MSG, on one line
    return status.strip(), {"msg": msg}


def master_pid(control_dir: str) -> tuple[_pct_ssh.MasterClient, int]:
    socks = glob.glob(os.path.join(control_dir, "*.sock"))
    assert len(socks) == 1, socks
    client = _pct_ssh.MasterClient(socks[0])
    return client, client._call({"op": "ping"}, timeout=5)[0]["pid"]


def _tcp_table() -> dict[int, tuple[int, int]]:
    table = {}
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            table[int(f[9])] = (int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16))
    return table


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in glob.glob("/proc/%d/fd/*" % pid):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def serving_sshd(status: dict, client_pid: int) -> list[int]:
    """The lab sshd's processes holding the server end of CLIENT_PID's connection (matched by its local port)."""
    port = status["port"]
    table = _tcp_table()
    ports = {table[i][0] for i in _socket_inodes(client_pid) if i in table and table[i][1] == port}
    assert len(ports) == 1, ports
    (peer,) = ports
    listener = status["sshd"]["pid"]
    found = []
    for info in iter_processes():
        if info.pid != client_pid and any(table.get(i) == (port, peer) for i in _socket_inodes(info.pid)):
            found.append(info.pid)
    # only the lab sshd's own children: never anything else on this machine
    assert found and all(_descends_from(pid, listener) for pid in found), (found, listener)
    return found


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open("/proc/%d/stat" % pid) as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


@pytest.fixture
def stubborn(lab):
    before = lab.get("trainer", {}).get("behaviour") or "graceful"
    subprocess.run([LAB, "trainer", "stubborn"], check=True, capture_output=True, timeout=300)
    yield
    subprocess.run([LAB, "trainer", before], check=False, capture_output=True, timeout=300)


@pytest.mark.parametrize("cut", ["master_killed", "sshd_child_killed", "sshd_child_frozen"])
def test_link_cut_during_sigterm_rung(lab, stubborn, tmp_path, cut):
    control_dir = str(tmp_path / "cp")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=control_dir)
    frozen: list[int] = []
    with lab_lock(lab):
        job = wait_for(lambda: len(trainer_procs()) == 9 and trainer_procs(), 60, "the stubborn trainer (9 processes)")
        since = time.time() - 1
        run = adhoc(env, ARGS)
        try:
            record = wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 60,
                              "the ladder to start")
            time.sleep(max(0.0, record["started"] + CUT_AFTER_S - time.time()))
            client, pid = master_pid(control_dir)
            if cut == "master_killed":
                os.kill(pid, signal.SIGKILL)
            else:
                victims = serving_sshd(lab, pid)
                for victim in victims:
                    os.kill(victim, signal.SIGSTOP if cut == "sshd_child_frozen" else signal.SIGKILL)
                if cut == "sshd_child_frozen":
                    frozen = victims
            cut_at = time.monotonic()
            out, _ = run.communicate(timeout=BOUND_S + SLACK_S)
            detected_in = time.monotonic() - cut_at
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        try:
            state, result = result_of(out)
            assert state == "UNREACHABLE!" and run.returncode != 0, out
            if cut == "master_killed":
                assert "control master" in result["msg"] and "went away" in result["msg"], result
            else:
                assert "the SSH connection died" in result["msg"], result
                if cut == "sshd_child_frozen":
                    assert "answered no keepalive" in result["msg"], result
            assert detected_in <= BOUND_S + SLACK_S
            # the ladder goes on without its caller: SIGTERM's 10 s, then SIGKILL
            wait_for(lambda: not trainer_procs(), 10 + 5 + 30, "the ladder to finish the job on its own")
            record = wait_for(lambda: my_record(lab, since).get("state") in ("done", "failed") and my_record(lab, since),
                              30, "the ladder's record")
            assert record["state"] == "done" and record["stopped_by"] == "SIGKILL", record
            assert [r["signal"] for r in record["rungs"]] == ["SIGINT", "SIGTERM", "SIGKILL"], record
            assert record["stopped_count"] >= len(job)
            if cut != "master_killed":  # the master stays behind its dead connection at most DEAD_DRAIN_S
                wait_for(lambda: not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split(") ")[1][0] == "Z",
                         _pct_ssh.DEAD_DRAIN_S + 5, "the control master to exit")
        finally:
            for victim in frozen:
                os.kill(victim, signal.SIGKILL)
                os.kill(victim, signal.SIGCONT)

        rerun = adhoc(env, ARGS)
        out, _ = rerun.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [], out
        assert result["previous"]["pid"] == record["pid"] and result["previous"]["stopped_by"] == "SIGKILL"
        note = [n for n in result["notes"] if n.startswith("nothing selected now; ")]
        assert note and "stopped the job with SIGKILL" in note[0] and "training_stop pid %d" % record["pid"] in note[0], result
        again = adhoc(env, ARGS)
        out, _ = again.communicate(timeout=300)
        state, result = result_of(out)
        assert state == "SUCCESS" and not result["changed"] and result["selected"] == [] and result["rungs"] == [], out
        for sock in glob.glob(os.path.join(control_dir, "*.sock")):
            _pct_ssh.MasterClient(sock).stop()


# ---------------------------------------------------------------- the role, as the issue saw it

ROLE_VARS = {
    "repurpose_datagen": False,
    "stop_training_ladder": LADDER,
    "stop_training_kill_timeout": 5,
    "stop_training_gpu_timeout": 30,
    "stop_training_gpu_interval": 0.2,
    "stop_training_restart_timeout": 60,
}


def playbook(env: dict) -> subprocess.Popen:
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(ROOT, "inventories", "lab"),
            os.path.join(ROOT, "playbooks", "repurpose_ct200.yml"), "-e", json.dumps(ROLE_VARS)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(env, PATH="%s:%s" % (BIN, env.get("PATH", "")), PYTHONUNBUFFERED="1"),
                            stdin=subprocess.DEVNULL, start_new_session=True)


def recap(output: str) -> dict[str, int]:
    m = re.search(r"^ct200\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M)
    assert m, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


def test_role_rerun_reports_the_ladder_its_dead_link_left_running(lab, stubborn, tmp_path):
    """The issue's hang: the host's sshd child killed during SIGTERM. The play fails within the bound; the
    re-run's summary says what the unwatched ladder did; a second re-run changes nothing."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    with lab_lock(lab):
        wait_for(lambda: len(trainer_procs()) == 9, 60, "the stubborn trainer (9 processes)")
        since = time.time() - 1
        play = playbook(env)
        try:
            record = wait_for(lambda: my_record(lab, since).get("state") == "running" and my_record(lab, since), 300,
                              "the role's ladder to start")
            time.sleep(max(0.0, record["started"] + CUT_AFTER_S - time.time()))
            _client, pid = master_pid(str(tmp_path / "cp"))
            for victim in serving_sshd(lab, pid):
                os.kill(victim, signal.SIGKILL)
            out, _ = play.communicate(timeout=BOUND_S + SLACK_S + 60)  # + the role's own end tasks
        finally:
            if play.poll() is None:
                os.killpg(play.pid, signal.SIGKILL)
                play.wait()
        assert play.returncode != 0 and "the SSH connection died" in out, out[-3000:]
        wait_for(lambda: not trainer_procs(), 10 + 5 + 30, "the ladder to finish the job on its own")
        record = wait_for(lambda: my_record(lab, since).get("state") == "done" and my_record(lab, since), 30,
                          "the ladder's record")
        assert record["stopped_by"] == "SIGKILL", record

        rerun = playbook(env)
        out, _ = rerun.communicate(timeout=600)
        assert rerun.returncode == 0, out[-4000:]
        assert "Stopped: nothing, no process was selected" in out
        summary = re.search(r"The last ladder for this selection \(training_stop pid (\d+), started [^)]*\) stopped the job "
                            r"with SIGKILL at \S+, (\d+) process\(es\)", out)
        assert summary and int(summary.group(1)) == record["pid"], out[-4000:]
        assert int(summary.group(2)) == record["stopped_count"]
        again = playbook(env)
        out2, _ = again.communicate(timeout=600)
        assert again.returncode == 0 and recap(out2)["changed"] == 0, out2[-4000:]
        assert "stopped the job with SIGKILL" in out2  # still the same earlier run, reported again
        for sock in glob.glob(os.path.join(str(tmp_path / "cp"), "*.sock")):
            _pct_ssh.MasterClient(sock).stop()
