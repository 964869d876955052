"""Table-driven tests of the nvidia-smi parsers, GPU selection, the judgement and the wait loop,
plus the /proc holder scan against real processes holding real files."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils import _wait
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import free as _gpu_free
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import holders as _gpu_holders
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import judge as _gpu_judge
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import nvidia_smi as _nvidia_smi
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu import nvidia_smi_backend as _nvidia_smi_backend
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    GpuError,
    GpuInfo,
    GpuProcess,
    GpuTimeout,
    Sample,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import read_process

pytestmark = pytest.mark.processes

U0 = "GPU-72e5f72d-18ee-5e60-842e-9c4a48fc83cd"
U1 = "GPU-981ec1ea-ec8c-5678-b94e-043da42b32b1"
NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
GOOD = (
    "0, %s, %s, 80004, 97887, 00000000:01:00.0\n"
    "1, %s, %s, 4, 97887, 00000000:21:00.0\n" % (U0, NAME, U1, NAME)
)


def test_parse_gpu_csv_good():
    gpus = _nvidia_smi.parse_gpu_csv(GOOD)
    assert [(g.index, g.uuid, g.name, g.used_mib, g.total_mib, g.bus_id) for g in gpus] == [
        (0, U0, NAME, 80004, 97887, "00000000:01:00.0"),
        (1, U1, NAME, 4, 97887, "00000000:21:00.0"),
    ]


def test_parse_gpu_csv_accepts_units_left_in():
    assert _nvidia_smi.parse_gpu_csv("0, %s, %s, 12 MiB, 97887 MiB, 00000000:01:00.0" % (U0, NAME))[0].used_mib == 12


@pytest.mark.parametrize("text, fragment", [
    ("", "empty output"),
    ("\n\n", "empty output"),
    ("No devices were found\n", "No devices were found"),
    ("0, %s, %s, [N/A], 97887, 00000000:01:00.0" % (U0, NAME), "[N/A]"),
    ("0, %s, %s, [Not Supported], 97887, 00000000:01:00.0" % (U0, NAME), "[Not Supported]"),
    ("0, %s, %s, [GPU is lost], 97887, 00000000:01:00.0" % (U0, NAME), "GPU is lost"),
    ("0, %s, NVIDIA RTX PRO" % U0, "expected 6 fields"),
    ("0, %s, %s, 4, 97887, 00000000:01:00.0\n\x00\x1b[?\ufffd, , ,\n" % (U0, NAME), "garbled"),
    ("index, uuid, name, memory.used [MiB], memory.total [MiB], pci.bus_id", "bad index or uuid"),
    ("x, %s, %s, 4, 97887, b" % (U0, NAME), "bad index or uuid"),
    ("0, not-a-uuid, %s, 4, 97887, b" % NAME, "bad index or uuid"),
    ("0, %s, %s, 4.5, 97887, b" % (U0, NAME), "4.5"),
    ("0, %s, %s, -1, 97887, b" % (U0, NAME), "-1"),
])
def test_parse_gpu_csv_never_reads_bad_output_as_free(text, fragment):
    with pytest.raises(GpuError) as err:
        _nvidia_smi.parse_gpu_csv(text)
    assert fragment in str(err.value)


@pytest.mark.parametrize("rc, out, fragment", [
    (6, "No devices were found\n", "rc 6: no GPU was found"),
    (0, "No devices were found\n", "rc 6"),
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure ...\n",
     "rc 9: the NVIDIA driver is not loaded"),
    (12, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.", "rc 12"),
    (15, "0, a\nUnable to determine the device handle for GPU00000000:41:00.0: GPU is lost.  Reboot\n",
     "GPU00000000:41:00.0: GPU is lost"),
    (2, 'Field "foo" is not a valid field to query.\n', "rc 2: a supplied argument"),
    (77, "", "(rc 77: unknown exit code): (no output)"),
])
def test_check_nvidia_smi_names_the_cause(rc, out, fragment):
    with pytest.raises(GpuError) as err:
        _nvidia_smi.check_nvidia_smi(rc, out, "")
    assert fragment in str(err.value)


def test_check_nvidia_smi_ok():
    _nvidia_smi.check_nvidia_smi(0, GOOD, "")


def test_parse_apps_csv():
    text = "4242, /usr/bin/python3, 80000, %s\n77, Xorg, [N/A], %s\n" % (U0, U1)
    assert _nvidia_smi.parse_apps_csv(text) == [
        GpuProcess(pid=4242, gpu_uuid=U0, used_mib=80000, name="/usr/bin/python3"),
        GpuProcess(pid=77, gpu_uuid=U1, used_mib=None, name="Xorg"),
    ]
    assert _nvidia_smi.parse_apps_csv("") == []
    with pytest.raises(GpuError):
        _nvidia_smi.parse_apps_csv("pid, process_name\n")


def gpus_of(*used):
    return [GpuInfo(index=i, uuid="GPU-%08d-0000-0000-0000-000000000000" % i, name=NAME, used_mib=u, total_mib=97887)
            for i, u in enumerate(used)]


@pytest.mark.parametrize("wanted, expected", [
    ([], [0, 1, 2]),
    (["2", "0"], [0, 2]),
    (["GPU-00000001-0000-0000-0000-000000000000"], [1]),
    (["gpu-00000001-0000-0000-0000-000000000000", "1"], [1]),
])
def test_select_gpus(wanted, expected):
    assert [g.index for g in _gpu_judge.select_gpus(gpus_of(1, 2, 3), wanted)] == expected


def test_select_unknown_gpu_names_what_is_there():
    with pytest.raises(GpuError, match=r"no GPU '7' here; present: 0 \(GPU-00000000"):
        _gpu_judge.select_gpus(gpus_of(1, 2), ["7"])


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(gpus=["zero"]), "gpus: 'zero' is neither"),
    (dict(gpus=["-1"]), "gpus: '-1'"),
    (dict(max_used_mib=-1), "max_used_mib must be >= 0"),
    (dict(stable_for=0), "stable_for must be >= 1"),
    (dict(timeout=-1), "timeout must be >= 0"),
    (dict(interval=0), "interval must be > 0"),
    (dict(delay=-0.1), "delay must be >= 0"),
    (dict(container=99), "container must be a Proxmox VMID"),
])
def test_validate_options_rejects(kwargs, fragment):
    args = dict(gpus=[], max_used_mib=512, stable_for=2, timeout=10, interval=1, delay=0, container=None)
    args.update(kwargs)
    with pytest.raises(GpuError, match=fragment.replace("(", r"\(")):
        _gpu_judge.validate_options(**args)


def test_validate_options_normalises():
    assert _gpu_judge.validate_options([0, " 3 ", U0], 0, 1, 0, 0.1, 0, 200) == ["0", "3", U0]


@pytest.mark.parametrize("used, limit, free", [
    ((4, 4), 512, True), ((512, 4), 512, True), ((513, 4), 512, False), ((4, 80004), 512, False), ((0,), 0, True),
])
def test_judge(used, limit, free):
    assert _gpu_judge.judge(gpus_of(*used), {}, limit) is free


class P:
    """A ProcessInfo-like stand-in for the lookup seam (the judgement is under test, not /proc)."""

    def __init__(self, comm, cgroup="0::/user.slice", cmdline=None):
        self.comm, self.cgroup, self.cmdline = comm, cgroup, tuple(cmdline or [comm])


def test_discount_only_known_memory_of_ignored_or_out_of_scope_processes():
    gpus = gpus_of(80004, 30004)
    procs = (GpuProcess(10, gpus[0].uuid, 80000), GpuProcess(11, gpus[1].uuid, 20000),
             GpuProcess(12, gpus[1].uuid, 10000), GpuProcess(13, gpus[1].uuid, None))
    sample = Sample(at=0, gpus=tuple(gpus), processes=procs, backend="x")
    table = {10: P("python3", "0::/lxc/200/ns/user.slice"), 11: P("python3", "0::/lxc.payload.201/init.scope"),
             12: P("Xorg"), 13: P("python3", "0::/lxc/201/ns")}
    lookup = table.get
    # unscoped: only Xorg's known 10000 MiB is discounted
    assert _gpu_judge.discounted_mib(sample, ["Xorg"], None, lookup) == {gpus[1].uuid: 10000}
    # container 200: CT201's and the host's known MiB do not count; CT200's does; unknown MiB always counts
    discount = _gpu_judge.discounted_mib(sample, ["Xorg"], 200, lookup)
    assert discount == {gpus[1].uuid: 30000}
    assert _gpu_judge.judge(gpus[1:], discount, 512) is True
    assert _gpu_judge.judge(gpus[:1], discount, 512) is False
    # a PID foreign to this namespace cannot be attributed: it counts
    assert _gpu_judge.discounted_mib(sample, ["Xorg"], 200, lambda pid: None) == {}


@pytest.mark.parametrize("comm, argv, patterns, hit", [
    ("Xorg", ["/usr/lib/xorg/Xorg", ":0"], ["Xorg"], "Xorg"),
    ("python3", ["/usr/bin/nvidia-persistenced"], ["nvidia-persistenced"], "nvidia-persistenced"),
    ("gnome-shell", [], ["gnome-*"], "gnome-*"),
    ("python3", ["python3", "Xorg"], ["Xorg"], ""),
    ("xorg", ["xorg"], ["Xorg"], ""),
])
def test_name_ignored(comm, argv, patterns, hit):
    assert _gpu_judge.name_ignored(comm, argv, patterns) == hit


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def run_wait(busy_until, timeout=10.0, interval=1.0, delay=0.0, stable_for=1, pattern=None):
    clock = FakeClock()
    calls = []

    def sample_fn():
        calls.append(clock.now)
        return Sample(at=clock.now, gpus=(), processes=(), backend="x")

    def free_fn(sample):
        if pattern is not None:
            return pattern[len(calls) - 1], {}
        return sample.at >= busy_until, {}

    waiter = _wait.Waiter(timeout=timeout, interval=interval, delay=delay, stable_for=stable_for,
                          sleep=clock.sleep, clock=clock.clock)
    return waiter.wait(sample_fn, free_fn), calls, clock


def test_wait_free_at_once_takes_stable_for_samples():
    result, calls, _clock = run_wait(busy_until=0, stable_for=3)
    assert result.free and result.samples == 3 and not result.timed_out


def test_wait_detects_release_at_the_next_sample():
    result, calls, _clock = run_wait(busy_until=1003.5, interval=0.5)
    assert result.free
    assert calls[-1] == 1003.5 and calls[-2] == 1003.0  # the first sample after the release ends it


def test_wait_stable_for_restarts_on_a_dip():
    result, calls, _clock = run_wait(busy_until=None, stable_for=2, pattern=[True, False, True, True])
    assert result.free and result.samples == 4


def test_wait_times_out_bounded_and_delay_counts():
    result, calls, clock = run_wait(busy_until=10 ** 9, timeout=5, interval=2, delay=1)
    assert not result.free and result.timed_out
    assert calls[0] == 1001.0  # delay before the first sample
    assert clock.now - 1000.0 == 5  # never sleeps past the deadline
    assert all(s <= 2 for s in clock.sleeps[1:])


def test_wait_timeout_zero_samples_once():
    result, calls, _clock = run_wait(busy_until=10 ** 9, timeout=0)
    assert result.samples == 1 and not result.free


def test_a_sample_cut_at_the_waits_end_ends_it_timed_out_on_the_last_whole_sample():
    clock = FakeClock()
    samples = []

    def sample_fn():
        if len(samples) == 3:
            raise _wait.SampleCut("the fourth call was cut")
        samples.append(Sample(at=clock.now, gpus=(), processes=(), backend="x"))
        return samples[-1]

    waiter = _wait.Waiter(timeout=10, interval=1, sleep=clock.sleep, clock=clock.clock)
    result = waiter.wait(sample_fn, lambda sample: (False, {}))
    assert (result.free, result.timed_out, result.cut) == (False, True, "the fourth call was cut")
    assert result.samples == 3 and result.last is samples[2] and result.first is samples[0]
    assert len(result.history) == 3  # the cut sample is not one


def test_a_sample_cut_before_any_whole_one_is_the_waits_failure():
    def sample_fn():
        raise _wait.SampleCut("cut")

    with pytest.raises(_wait.SampleCut, match="cut"):
        _wait.Waiter(timeout=1, interval=1).wait(sample_fn, lambda sample: (False, {}))


@pytest.mark.parametrize("given, hang", [(5.0, True), (30.0, True), (4.9, False), (0.5, False)])
def test_only_a_call_given_a_working_calls_time_proves_a_hang(given, hang):
    assert GpuTimeout("x", given).proves_hang is hang


@pytest.mark.parametrize("timeout, elapsed, bound", [
    (0, 0, 5.0),  # timeout 0 samples once: the one call still gets the 5 s a slow, working driver can need
    (1, 0.9, 4.1),  # a short wait's calls end by 5 s into it
    (8, 0, 8.0),
    (8, 7.0, 1.0),  # a call started late ends with the wait
    (8, 7.9, 0.5),  # ... but is never given less than 0.5 s
    (120, 0, 30.0),  # the per-call cap
    (120, 100, 20.0),
])
def test_nvidia_smi_call_bound(timeout, elapsed, bound):
    assert _gpu_free.nvidia_smi_call_bound(timeout, elapsed) == bound


def test_check_mode_waiter_samples_once_even_when_busy():
    calls = []

    def sample_fn():
        calls.append(1)
        return Sample(at=time.time(), gpus=(), processes=(), backend="x")

    result = _wait.CheckModeWaiter().wait(sample_fn, lambda s: (False, {}))
    assert calls == [1] and result.samples == 1 and not result.free and not result.timed_out


def test_deferred_processes_are_fetched_once():
    fetched = []

    def fetch():
        fetched.append(1)
        return (GpuProcess(1, U0, 5),), "note"

    sample = Sample(at=0, gpus=(), processes=None, backend="x", fetch=fetch)
    sample.ensure_processes()
    sample.ensure_processes()
    assert fetched == [1] and sample.processes == (GpuProcess(1, U0, 5),) and sample.notes == ("note",)


# ---- the /proc scan, against real processes holding real files -----------------------------------

HOLD = """
import os, sys, time
fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def devices(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia3", "nvidiactl", "other"):
        (dev / name).write_text("")
    return dev


@pytest.fixture
def spawn():
    procs = []

    def start(*paths, exe=sys.executable):
        proc = subprocess.Popen([exe, "-c", HOLD, *map(str, paths)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_scan_finds_holders_like_fuser(devices, spawn):
    a = spawn(devices / "nvidia0", devices / "nvidiactl")
    b = spawn(devices / "nvidia1", devices / "nvidia3")
    c = spawn(devices / "nvidiactl")
    d = spawn(devices / "other")
    found = _gpu_holders.scan_holders([str(devices / "nvidia*")])
    got = sorted((h.pid, h.gpu) for h in found)
    assert got == sorted([(a.pid, 0), (b.pid, 1), (b.pid, 3), (c.pid, None)])
    assert d.pid not in {h.pid for h in found}
    mine = next(h for h in found if h.pid == a.pid)
    assert mine.device == str(devices / "nvidia0") and mine.name.startswith("python")
    assert "-c" in mine.cmdline and mine.container is None


def test_scan_matches_by_identity_under_another_path(devices, spawn, tmp_path):
    # A bind mount shows the same inode under another name; a hard link does too, without mount privileges.
    other = tmp_path / "elsewhere"
    other.mkdir()
    os.link(devices / "nvidia3", other / "nvidia3")
    holder = spawn(other / "nvidia3")
    found = _gpu_holders.scan_holders([str(devices / "nvidia*")])
    assert [(h.pid, h.gpu, h.device) for h in found] == [(holder.pid, 3, str(devices / "nvidia3"))]


def test_scan_excludes_pids_and_is_empty_without_devices(devices, spawn, tmp_path):
    holder = spawn(devices / "nvidia0")
    assert _gpu_holders.scan_holders([str(devices / "nvidia*")], exclude_pids={holder.pid}) == []
    assert _gpu_holders.scan_holders([str(tmp_path / "none" / "nvidia*")]) == []


def test_classify_and_merge(devices, spawn, tmp_path):
    xorg = tmp_path / "Xorg"
    xorg.symlink_to(sys.executable)
    train = spawn(devices / "nvidia0")
    x = spawn(devices / "nvidia1", exe=str(xorg))
    idle = spawn(devices / "nvidia3")
    gpus = gpus_of(80004, 300, 4, 4)
    found = _gpu_holders.scan_holders([str(devices / "nvidia*")])
    procs = (GpuProcess(train.pid, gpus[0].uuid, 80000), GpuProcess(3999999, gpus[0].uuid, 10))
    sample = Sample(at=0, gpus=tuple(gpus), processes=procs, backend="x")
    merged, foreign = _gpu_holders.merge_backend_processes(found, sample, gpus, read_process)
    assert foreign == [{"pid": 3999999, "name": "", "gpu_uuid": gpus[0].uuid, "used_mib": 10}]
    counted, ignored = _gpu_holders.classify_holders(merged, gpus[:2], ["Xorg"], None, read_process)
    assert [(h.pid, h.gpu, h.used_mib, h.gpu_uuid) for h in counted] == [(train.pid, 0, 80000, gpus[0].uuid)]
    assert [(h.pid, h.ignored) for h in ignored] == [(x.pid, "ignore_processes: Xorg")]
    assert idle.pid not in {h.pid for h in counted + ignored}  # GPU 3 was not selected
    # scoped to a container: host processes do not count
    counted, ignored = _gpu_holders.classify_holders(merged, gpus[:2], [], 200, read_process)
    assert counted == [] and {h.ignored for h in ignored} == {"outside container 200 (host)"}
    assert "pid %d" % train.pid in ignored[0].describe()


def test_resolve_nvidia_smi(tmp_path):
    with pytest.raises(GpuError, match="not found on PATH"):
        _nvidia_smi_backend.resolve_nvidia_smi("nvidia-smi-does-not-exist")
    with pytest.raises(GpuError, match="is not an executable file"):
        _nvidia_smi_backend.resolve_nvidia_smi(str(tmp_path / "nvidia-smi"))
    assert _nvidia_smi_backend.resolve_nvidia_smi("sh").endswith("/sh")


def test_run_command_bounded_and_c_locale(tmp_path):
    rc, out, _err = _nvidia_smi_backend.run_command(["sh", "-c", "echo $LC_ALL"], 5)
    assert (rc, out) == (0, "C\n")
    with pytest.raises(GpuError, match="did not answer within 0.5 s"):
        _nvidia_smi_backend.run_command(["sleep", "5"], 0.5)


def test_inside_a_container_a_backend_pid_never_names_a_local_process(devices, spawn, tmp_path):
    """The driver reports host PIDs; in another PID namespace a local process with the same number is another
    process: it gets no MiB, is not added as a holder, and its memory is never discounted."""
    xorg = tmp_path / "Xorg"
    xorg.symlink_to(sys.executable)
    local = spawn(devices / "nvidia0", exe=str(xorg))  # same number as the host's real GPU user, by chance
    gpus = gpus_of(80004, 300, 4, 4)
    found = _gpu_holders.scan_holders([str(devices / "nvidia*")])
    sample = Sample(at=0, gpus=tuple(gpus), processes=(GpuProcess(local.pid, gpus[0].uuid, 80000),), backend="x")
    merged, foreign = _gpu_holders.merge_backend_processes(found, sample, gpus, read_process, pids_are_ours=False)
    assert [(h.pid, h.used_mib) for h in merged] == [(local.pid, None)]
    assert foreign == [{"pid": local.pid, "name": "", "gpu_uuid": gpus[0].uuid, "used_mib": 80000}]
    # matched by number, the local Xorg's "ignored" process would take the 80000 MiB off GPU 0: free by mistake
    assert _gpu_judge.discounted_mib(sample, ["Xorg"], None, read_process) == {gpus[0].uuid: 80000}
    assert _gpu_judge.discounted_mib(sample, ["Xorg"], None, _gpu_free.no_process) == {}
    # in the initial PID namespace (the PVE host) the same numbers are the same processes
    merged, foreign = _gpu_holders.merge_backend_processes(found, sample, gpus, read_process, pids_are_ours=True)
    assert [(h.pid, h.used_mib) for h in merged] == [(local.pid, 80000)] and foreign == []


def test_the_initial_pid_namespace_is_told_by_its_inode(tmp_path):
    assert _gpu_holders.backend_pids_are_ours() is (os.stat("/proc/self/ns/pid").st_ino == 0xEFFFFFFC)
    assert _gpu_holders.backend_pids_are_ours(str(tmp_path / "missing")) is False
