"""/proc parsers (table-driven on captured text) and readers (on real processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from trainer_harness import wait_exec

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    ProcError,
    ancestors_of,
    boot_time,
    container_vmid_from_cgroup,
    fd_links,
    fd_targets,
    has_live_thread,
    live_thread_cmdline,
    parse_cmdline,
    parse_nspid,
    parse_proc_status,
    parse_stat,
    parse_uid,
    read_process,
    read_process_light,
    read_starttime,
    read_stat,
    read_wchan,
    task_states,
)

pytestmark = pytest.mark.processes

STAT = ("32244 (python3) S 3012 32244 3012 34816 32244 4194560 1 0 0 0 5 3 0 0 20 0 9 0 "
        "912345 1000 10 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0")


@pytest.mark.parametrize("text, pid, comm, state, ppid, pgid, sid, start", [
    (STAT, 32244, "python3", "S", 3012, 32244, 3012, 912345),
    (STAT.replace("(python3)", "(a (b) c)"), 32244, "a (b) c", "S", 3012, 32244, 3012, 912345),
    (STAT.replace("(python3)", "(pt_main_thread)").replace(" S ", " Z ", 1), 32244, "pt_main_thread", "Z", 3012, 32244, 3012, 912345),
])
def test_parse_stat(text, pid, comm, state, ppid, pgid, sid, start):
    stat = parse_stat(text)
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.pgid, stat.sid, stat.starttime) == (
        pid, comm, state, ppid, pgid, sid, start)


@pytest.mark.parametrize("bad", ["", "12 python3 S 1", "12 (x) S 1 2 3"])
def test_parse_stat_rejects_garbage(bad):
    with pytest.raises(ProcError):
        parse_stat(bad)


def test_kernel_thread_flag():
    kthread = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 0 0 0 0 0 0"
    assert parse_stat(kthread).flags & 0x00200000


@pytest.mark.parametrize("raw, argv", [
    (b"python3\0train.py\0--nproc\0008\0", ("python3", "train.py", "--nproc", "8")),
    (b"", ()),
    (b"sshd: root@pts/0", ("sshd: root@pts/0",)),
    (b"a\0\0b\0", ("a", "", "b")),
])
def test_parse_cmdline(raw, argv):
    assert parse_cmdline(raw) == argv


def test_parse_proc_status_uid_nspid():
    status = parse_proc_status("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t5020\t32244\n")
    assert parse_uid(status) == 1000 and parse_nspid(status) == (5020, 32244)
    assert parse_uid({}) is None and parse_nspid({}) == ()


@pytest.mark.parametrize("text, vmid", [
    ("0::/lxc/200/ns/user.slice/user-0.slice\n", 200),
    ("0::/lxc/200\n", 200),
    ("12:pids:/lxc.payload.201/system.slice\n0::/lxc.payload.201/system.slice\n", 201),
    ("0::/lxc.payload.200-1/.lxc\n", 200),
    ("0::/lxc.payload.200-x/\n", None),
    ("0::/lxc.monitor/200\n", None),
    ("0::/lxc.monitor.200\n", None),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("0::/lxc/2000x/\n", None),
])
def test_container_vmid_from_cgroup(text, vmid):
    assert container_vmid_from_cgroup(text) == vmid


def test_readers_on_real_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "marker-arg"])
    try:
        wait_exec(child.pid, "marker-arg")
        info = read_process(child.pid)
        assert info is not None and info.ppid == os.getpid() and info.cmdline[-1] == "marker-arg"
        assert info.identity == (child.pid, read_starttime(child.pid))
        assert os.getpid() in ancestors_of(child.pid)
        assert isinstance(read_wchan(child.pid), str)
        assert fd_targets(child.pid)
        assert fd_targets(child.pid) == [target for fd_path, target in fd_links(child.pid)]
        stat = read_stat(child.pid)
        assert stat is not None and (stat.pid, stat.ppid, stat.starttime) == (child.pid, os.getpid(), info.starttime)
        light = read_process_light(child.pid)
        assert light is not None and light.identity == info.identity and light.cmdline == info.cmdline
        assert light.uid is None and light.cgroup == "" and light.nspid == ()  # the light read skips status/cgroup
        assert task_states(child.pid) and has_live_thread(child.pid)
        assert live_thread_cmdline(child.pid) == info.cmdline
    finally:
        child.kill()
        child.wait()
    assert read_process(child.pid) is None and read_starttime(child.pid) is None
    assert read_stat(child.pid) is None and read_process_light(child.pid) is None
    assert task_states(child.pid) == [] and not has_live_thread(child.pid) and live_thread_cmdline(child.pid) == ()


def test_parse_stat_tpgid():
    assert parse_stat(STAT).tpgid == 32244  # field 8: the terminal's foreground process group


def test_boot_time(tmp_path):
    import time

    assert 0 < boot_time() < time.time()
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    assert boot_time(str(tmp_path)) == 1700000000.0
    (tmp_path / "stat").write_text("cpu  1 2 3\n")
    with pytest.raises(ProcError, match="no btime"):
        boot_time(str(tmp_path))
