"""The fake GPUs themselves: real holder processes, the real fake nvidia-smi, real PID namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import fakegpu
import pytest
from fakegpu_harness import FakeGpus

NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"


@pytest.fixture
def fake(tmp_path):
    gpus = FakeGpus(str(tmp_path), release_delay=30)
    yield gpus
    gpus.close()


def can_unshare_pid() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False).returncode == 0


IN_NEW_PIDNS = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
needs_pidns = pytest.mark.skipif(not can_unshare_pid(), reason="needs root and unshare --pid (a container's view)")


def query(fake, *extra):
    res = fake.smi("--query-gpu=index,uuid,name,memory.used,memory.total,pci.bus_id", "--format=csv,noheader,nounits",
                   *extra)
    assert res.returncode == 0, res.stdout
    return [line.split(", ") for line in res.stdout.splitlines()]


def test_init_is_idempotent_and_stable(fake):
    before = {n: os.stat(os.path.join(fake.dir, "dev", n)).st_ino for n in os.listdir(os.path.join(fake.dir, "dev"))}
    assert sorted(before) == ["nvidia%d" % i for i in range(8)] + ["nvidiactl"]
    rows = query(fake)
    fakegpu.init(fake.dir, release_delay=30)
    after = {n: os.stat(os.path.join(fake.dir, "dev", n)).st_ino for n in before}
    assert after == before  # bind mounts of the device files stay valid
    assert query(fake) == rows
    assert [r[0] for r in rows] == [str(i) for i in range(8)]
    assert {r[2] for r in rows} == {NAME} and {r[4] for r in rows} == {"97887"}
    assert len({r[1] for r in rows}) == 8 and all(r[1].startswith("GPU-") for r in rows)
    assert rows[0][5] == "00000000:01:00.0" and {r[3] for r in rows} == {"4"}


def test_formats_like_real_nvidia_smi(fake):
    fake.hold([2], mib=1000)
    res = fake.smi("--query-gpu=index,memory.used,memory.total", "--format=csv")
    assert res.stdout.splitlines()[:4] == ["index, memory.used [MiB], memory.total [MiB]", "0, 4 MiB, 97887 MiB",
                                           "1, 4 MiB, 97887 MiB", "2, 1004 MiB, 97887 MiB"]
    # nounits keeps the unit in the header, as the real one does
    assert fake.smi("--query-gpu=memory.used", "--format=csv,nounits", "-i", "2").stdout == "memory.used [MiB]\n1004\n"
    listing = fake.smi("-L").stdout.splitlines()
    assert listing[0] == "GPU 0: %s (UUID: %s)" % (NAME, fakegpu.gpu_uuid(0))
    table = fake.smi().stdout
    assert "| NVIDIA-SMI 580.95.05" in table and "1004MiB /  97887MiB" in table
    assert {len(line) for line in table.splitlines()[1:] if line} == {91}
    bad = fake.smi("--query-gpu=index,bogus", "--format=csv")
    assert (bad.returncode, bad.stdout.strip()) == (2, 'Field "bogus" is not a valid field to query.')
    assert fake.smi("--frobnicate").returncode == 2


def test_memory_tracks_live_holders_and_release_delay(fake):
    holder = fake.hold([0, 1], mib=80000)
    assert fake.used()[0] == fake.used()[1] == 80004
    before_kill = time.time()
    fake.kill(holder)
    # no reader looks: the driver daemon alone notices the death, at the moment the fds closed
    deaths = []
    for _attempt in range(500):
        deaths = fake.events("death")
        if len(deaths) == 2:
            break
        time.sleep(0.01)
    assert [e["recorded_by"] for e in deaths] == ["driver", "driver"]
    assert all(e["t"] >= before_kill for e in deaths)
    assert fake.used()[0] == 80004  # within the 30 s release delay: still held
    assert all(e["release_at"] == pytest.approx(e["t"] + 30) for e in deaths)
    fake.config(release_delay=0)
    assert fake.used()[0] == 4 and os.listdir(os.path.join(fake.dir, "holders")) == []


def test_lazy_death_without_the_driver(tmp_path):
    fake = FakeGpus(str(tmp_path), release_delay=0, driver=False)
    try:
        holder = fake.hold([3], mib=5000)
        assert fake.used()[3] == 5004
        fake.kill(holder)
        assert fake.used()[3] == 4
        assert [e["recorded_by"] for e in fake.events("death")] == ["reader"]
    finally:
        fake.close()


def test_never_release_mode(fake):
    fake.config(never_release=True, release_delay=0)
    fake.kill(fake.hold([4], mib=20000))
    assert fake.used()[4] == 20004
    assert fake.used()[4] == 20004
    fake.config(never_release=False)
    assert fake.used()[4] == 4


def test_forked_child_keeps_the_allocation(fake):
    fake.config(release_delay=0)
    code = ("import os,time; import fakegpu; fakegpu.hold(5, 7000)\n"
            "if os.fork() == 0:\n    time.sleep(60)\nelse:\n    print(os.getpid(), flush=True); time.sleep(60)\n")
    env = dict(fake.env, PYTHONPATH=os.path.dirname(fakegpu.__file__))  # the child imports the same fakegpu
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    fake.procs.append(proc)
    proc.stdout.readline()
    child = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid]
    fake.kill(proc)
    assert fake.used()[5] == 7004  # the forked child still has the device open
    for pid in child:
        os.kill(pid, 9)
    for _attempt in range(200):
        if fake.used()[5] == 4:
            break
        time.sleep(0.01)
    assert fake.used()[5] == 4


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_host_lists_host_pids(fake):
    holder = fake.hold([6], mib=12345)
    res = fake.smi("--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid"
    assert lines[1:] == ["%d, %s, 12345 MiB, %s" % (holder.pid, sys.executable, fakegpu.gpu_uuid(6))]
    assert "%d      C" % holder.pid in fake.smi().stdout


@needs_pidns
def test_container_view_lists_no_processes(fake):
    """In another PID namespace (a container), memory shows but no process does: NVML under LXC."""
    holder = fake.hold([6], mib=12345)
    res = fake.smi("--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv,noheader",
                   prefix=IN_NEW_PIDNS)
    assert (res.returncode, res.stdout) == (0, "")
    assert "No running processes found" in fake.smi(prefix=IN_NEW_PIDNS).stdout
    inside = fake.smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "6", prefix=IN_NEW_PIDNS)
    assert inside.stdout == "12349\n"
    # a holder inside the namespace is listed on the host under its host PID
    inner = fake.hold([7], mib=1000, prefix=IN_NEW_PIDNS)
    apps = fake.smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader,nounits").stdout.splitlines()
    host_pids = {int(line.split(", ")[0]) for line in apps}
    assert holder.pid in host_pids and inner.pid not in host_pids  # inner.pid is unshare's; its child holds
    assert len(host_pids) == 2


@pytest.mark.parametrize("mode, rc, text", [
    ("no_devices", 6, "No devices were found"),
    ("no_driver", 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    ("no_nvml", 12, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system."),
    ("empty", 0, ""),
])
def test_broken_modes(fake, mode, rc, text):
    fake.config(mode=mode)
    res = fake.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert res.returncode == rc and res.stdout.startswith(text)


def test_lost_gpu_and_na(fake):
    fake.config(mode="gpu_lost", lost_gpus=[2])
    res = fake.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    assert res.returncode == 15
    assert "Unable to determine the device handle for GPU00000000:41:00.0: GPU is lost." in res.stdout
    assert "2, 4" not in res.stdout and "3, 4" in res.stdout
    fake.config(mode="na")
    assert fake.smi("--query-gpu=memory.used", "--format=csv,noheader", "-i", "0").stdout == "[N/A]\n"
    fake.config(mode="not_supported")
    assert fake.smi("--query-gpu=memory.used", "--format=csv,noheader", "-i", "0").stdout == "[Not Supported]\n"
