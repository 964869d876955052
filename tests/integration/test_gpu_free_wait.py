"""gpu_free_wait run for real (as Ansible runs a module) against the fake GPUs and real holder processes.

Host-side: each test has its own FAKEGPU_DIR with its driver daemon. The module
runs as a real process (tests/support/module.py, how Ansible executes it on a
target) or through ``ansible localhost -m``; nothing in it is
patched. The lab-marked test needs ``tests/lab/lab up``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import fakegpu
import pytest
from fakegpu_harness import NVIDIA_SMI, FakeGpus

from tests.support.lab import DECOY_CT, MAIN_CT, lab_status, trainer
from tests.support.module import module_command, module_env, module_result, run_module
from tests.support.playbook import adhoc_json_result, run_adhoc
from tests.support.procfs import cmdline_text, descendants
from tests.support.wait import wait_for


@pytest.fixture
def fake(tmp_path):
    gpus = FakeGpus(str(tmp_path), release_delay=0.5)
    yield gpus
    gpus.close()


def free_wait_args(fake, check=False, **args) -> dict:
    """ARGS for gpu_free_wait against FAKE's GPUs (its nvidia-smi and device nodes unless given)."""
    args.setdefault("nvidia_smi_path", NVIDIA_SMI)
    args.setdefault("device_paths", [fake.device_glob])
    if check:
        args["_ansible_check_mode"] = True
    return args


def module_cmd(fake, check=False, **args) -> list:
    return module_command("gpu_free_wait", free_wait_args(fake, check=check, **args))


def run_free_wait(fake, check=False, **args) -> dict:
    out = run_module("gpu_free_wait", free_wait_args(fake, check=check, **args), env=module_env(fake.env))
    assert (out["rc"] != 0) == bool(out.get("failed")), out
    return out


def test_already_free_is_ok_unchanged(fake, tmp_path):
    out = run_free_wait(fake, interval=0.1, timeout=10)
    assert out["free"] is True and out["changed"] is False and not out.get("failed")
    assert out["samples"] == 2  # stable_for default
    assert out["holders"] == [] and out["holders_before"] == []
    assert len(out["gpus"]) == 8
    g0 = out["gpus"][0]
    assert g0["name"] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition" and g0["memory_total_mib"] == 97887
    assert g0["uuid"] == fakegpu.gpu_uuid(0) and g0["memory_used_mib_before"] == g0["memory_used_mib_after"] == 4
    assert out["backend"] == "nvidia_smi"


def sampling_started(module_pid: int) -> bool:
    """The module has begun its first memory sample (an ``nvidia-smi --query-gpu`` child): it has already listed
    the holders it reports in ``holders_before``."""
    return any("--query-gpu" in cmdline_text(pid) for pid in descendants(module_pid))


def test_release_after_delay_is_detected_within_one_interval(fake, tmp_path):
    holder = fake.hold([0, 1], mib=80000)
    interval = 0.2
    proc = subprocess.Popen(module_cmd(fake, gpus=["0", "1"], interval=interval, stable_for=1, timeout=60),
                            env=module_env(fake.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the release comes after the module has seen the holder (on a loaded machine its start-up alone can take
    # longer than the 0.5 s below), then after a few busy samples
    wait_for(lambda: sampling_started(proc.pid), 30, "the module's first sample", interval=0.002)
    time.sleep(0.5)
    fake.kill(holder)
    stdout, stderr = proc.communicate(timeout=60)
    out = module_result(stdout, stderr, proc.returncode)
    assert out["free"] is True and out["changed"] is True, stderr
    hist = out["history"]
    assert [h["free"] for h in hist[-2:]] == [False, True] and not any(h["free"] for h in hist[:-1])
    release_at = min(e["release_at"] for e in fake.events("death"))
    busy, free = hist[-2], hist[-1]
    # the memory dropped between the last busy sample and the first free one ...
    assert busy["t"] <= release_at <= free["t"] + free["took"] + 0.01
    # ... and that free sample came one interval after the busy one ended
    assert free["t"] - (busy["t"] + busy["took"]) <= interval + 0.3
    assert out["gpus"][0]["memory_used_mib_before"] == 80004 and out["gpus"][0]["memory_used_mib_after"] == 4
    assert [h["pid"] for h in out["holders_before"]] == [holder.pid, holder.pid]
    assert out["holders"] == []


def test_holder_that_never_exits_fails_naming_it(fake, tmp_path):
    holder = fake.hold([3], mib=80000)
    out = run_free_wait(fake, timeout=1, interval=0.2)
    assert out["failed"] and out["free"] is False
    msg = out["msg"]
    assert "GPU memory not released within 1.0 s" in msg and "GPU 3 80004 MiB" in msg
    # named by its PID and its command line from the start (cut at 120 characters, wherever the checkout lives)
    assert "pid %d python [%s" % (holder.pid, " ".join(holder.args)[:120]) in msg, msg
    assert "on GPU 3, 80000 MiB" in msg and msg.endswith("Nothing was signalled.")
    assert [(h["pid"], h["gpu"], h["used_mib"], h["container"]) for h in out["holders"]] == [
        (holder.pid, 3, 80000, None)]
    assert holder.poll() is None  # it only reports


def test_check_mode_samples_once_and_reports(fake, tmp_path):
    holder = fake.hold([2], mib=40000)
    out = run_free_wait(fake, check=True, timeout=30)
    assert not out.get("failed") and out["changed"] is False
    assert out["free"] is False and out["samples"] == 1 and "would wait up to 30.0 s" in out["msg"]
    assert [h["pid"] for h in out["holders"]] == [holder.pid]


def test_ansible_cli_runs_it(fake, tmp_path):
    holder = fake.hold([5], mib=1000)
    env = dict(fake.env, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    args = {"nvidia_smi_path": NVIDIA_SMI, "device_paths": [fake.device_glob], "gpus": ["5"],
            "timeout": 5, "interval": 0.2, "max_used_mib": 512}
    checked = run_adhoc("localhost", "gpuops.repurpose.gpu_free_wait", args, inventory=None, check=True, env=env,
                        timeout=120)
    res = adhoc_json_result(checked, "localhost")
    assert res["free"] is False and res["samples"] == 1 and not res.get("failed")
    fake.kill(holder)
    real = run_adhoc("localhost", "gpuops.repurpose.gpu_free_wait", args, inventory=None, env=env, timeout=120)
    res = adhoc_json_result(real, "localhost")
    assert real.returncode == 0 and res["free"] is True and res["gpus"][0]["index"] == 5


def test_ignore_list_is_honoured(fake, tmp_path):
    xorg = tmp_path / "bin" / "Xorg"
    xorg.parent.mkdir()
    xorg.symlink_to(sys.executable)
    x = fake.hold([2], mib=2000, argv0=str(xorg))
    out = run_free_wait(fake, gpus=["2"], timeout=5, interval=0.2)
    assert out["free"] is True and out["changed"] is False
    assert out["holders"] == []
    assert [(h["pid"], h["name"], h["ignored"]) for h in out["ignored_holders"]] == [
        (x.pid, "Xorg", "ignore_processes: Xorg")]
    g = out["gpus"][0]
    assert (g["memory_used_mib_after"], g["memory_counted_mib_after"]) == (2004, 4)  # Xorg's MiB discounted
    out = run_free_wait(fake, gpus=["2"], timeout=0.5, interval=0.2, ignore_processes=[])
    assert out["failed"] and "pid %d Xorg" % x.pid in out["msg"]


@pytest.mark.parametrize("mode, fragment", [
    ("no_devices", "nvidia-smi failed (rc 6: no GPU was found): No devices were found"),
    ("no_driver", "rc 9: the NVIDIA driver is not loaded): NVIDIA-SMI has failed because it couldn't communicate"),
    ("no_nvml", "rc 12: the NVML library (libnvidia-ml.so) could not be found"),
    ("garbled", "nvidia-smi printed"),
    ("empty", "nvidia-smi printed no GPUs (empty output)"),
    ("na", "memory.used of GPU 0 as '[N/A]'"),
    ("not_supported", "memory.used of GPU 0 as '[Not Supported]'"),
    ("gpu_lost", "rc 15: a GPU has fallen off the bus or become inaccessible): Unable to determine the device handle"),
])
def test_broken_backend_is_a_clear_failure(fake, tmp_path, mode, fragment):
    fake.config(mode=mode, lost_gpus=[2])
    out = run_free_wait(fake, timeout=5, interval=0.2)
    assert out["failed"] and out["free"] is False and out["samples"] == 0
    assert fragment in out["msg"], out["msg"]


def test_hung_and_missing_nvidia_smi(fake, tmp_path):
    out = run_free_wait(fake, nvidia_smi_path=str(tmp_path / "nope" / "nvidia-smi"))
    assert out["failed"] and "is not an executable file" in out["msg"]
    out = run_free_wait(fake, backend="nvml")
    assert out["failed"] and "backend nvml" in out["msg"] and "use backend: auto or nvidia_smi" in out["msg"]
    fake.config(mode="hang", hang_seconds=60)
    # a short timeout still gives the call the per-call floor (5 s), and nothing more
    out = run_free_wait(fake, timeout=1)
    assert out["failed"] and "did not answer within 5 s (hung driver or lost GPU?)" in out["msg"], out["msg"]
    assert out["elapsed"] < 5.5, out


def test_a_process_list_call_that_hangs_fails_the_wait_as_a_hung_driver(fake, tmp_path):
    """The driver hangs between a sample's memory query and its process list (asked only while memory is held):
    the list is advisory when nvidia-smi says it cannot give one, but a call that does not answer is the hung
    driver, and the wait fails naming it within its timeout instead of reporting "not released"."""
    hung = tmp_path / "hung-process-list"  # sleep under a name only this test's calls have
    hung.symlink_to(shutil.which("sleep"))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *--query-compute-apps*) exec %s 60;; esac\nexec %s \"$@\"\n"
                   % (shlex.quote(str(hung)), shlex.quote(NVIDIA_SMI)))
    smi.chmod(0o755)
    holder = fake.hold([3], mib=80000)
    out = run_free_wait(fake, nvidia_smi_path=str(smi), timeout=6, interval=0.2)
    fake.kill(holder)
    assert out["failed"] and out["free"] is False, out
    assert "did not answer within" in out["msg"] and "(hung driver or lost GPU?)" in out["msg"], out["msg"]
    assert out["elapsed"] <= 6 + 1, out  # the call was cut to the wait's time left
    left = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if str(hung) in cmdline_text(pid)]
    assert left == [], "the hung call was left running"


def test_a_memory_query_the_waits_end_cuts_short_is_a_timeout_on_the_last_whole_sample(fake, tmp_path):
    """The driver stops answering 4 s into a 6 s wait: the call started then gets the wait's last 2 s, less than a
    working nvidia-smi may need, so its timeout proves nothing; the wait ends "not released" naming the holder
    from the last whole sample, and says which call was cut."""
    first = tmp_path / "first-call"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        "[ -e {first} ] || date +%s.%N > {first}\n"
        "now=$(date +%s.%N); began=$(cat {first})\n"
        "if awk -v n=\"$now\" -v b=\"$began\" 'BEGIN {{ exit !(n - b >= 4) }}'; then exec sleep 60; fi\n"
        "exec {smi} \"$@\"\n".format(first=shlex.quote(str(first)), smi=shlex.quote(NVIDIA_SMI)))
    smi.chmod(0o755)
    holder = fake.hold([3], mib=80000)
    out = run_free_wait(fake, nvidia_smi_path=str(smi), timeout=6, interval=0.2)
    fake.kill(holder)
    assert out["failed"] and out["free"] is False, out
    assert out["msg"].startswith("GPU memory not released within 6"), out["msg"]
    assert "pid %d" % holder.pid in out["msg"] and "GPU 3 80004 MiB" in out["msg"], out["msg"]
    assert "the last nvidia-smi call was cut at the wait's end" in out["msg"], out["msg"]
    assert out["holders"][0]["pid"] == holder.pid and out["samples"] >= 2, out
    assert out["elapsed"] <= 6 + 1, out


@pytest.mark.parametrize("args, fragment", [
    (dict(gpus=["9"]), "gpus: no GPU '9' here; present: 0 (GPU-"),
    (dict(gpus=["first"]), "gpus: 'first' is neither a GPU index"),
    (dict(interval=0), "interval must be > 0"),
    (dict(stable_for=0), "stable_for must be >= 1"),
    (dict(container=5), "container must be a Proxmox VMID"),
])
def test_bad_input_names_the_option(fake, tmp_path, args, fragment):
    out = run_free_wait(fake, timeout=2, **args)
    assert out["failed"] and fragment in out["msg"]


def can_unshare_pid() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not can_unshare_pid(), reason="needs root and unshare --pid (a container's PID namespace)")
def test_blind_backend_still_finds_holders_through_proc(fake, tmp_path):
    """As inside an LXC container: nvidia-smi lists no processes, the /proc scan still names the holder."""
    args = module_cmd(fake, timeout=0.6, interval=0.2)
    script = ("%s %s hold --gpu 4 --mib 30000 >/dev/null & sleep 0.5; %s; kill $!"
              % (sys.executable, fakegpu.__file__, shlex.join(args)))
    res = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script],
                         env=module_env(fake.env), capture_output=True, text=True, timeout=60, check=False)
    out = module_result(res.stdout, res.stderr, res.returncode)
    assert out["failed"] and out["gpus"][4]["memory_used_mib_after"] == 30004
    [holder] = out["holders"]
    assert holder["gpu"] == 4 and holder["used_mib"] is None  # the backend is blind here
    assert holder["pid"] < 100 and "fakegpu.py hold --gpu 4" in holder["cmdline"]  # a PID of the new namespace
    assert "pid %d python" % holder["pid"] in out["msg"] and "MiB unknown" in out["msg"]


CGROUP_ROOT = "/sys/fs/cgroup/pids"


def fake_ct_cgroup(vmid: int) -> str | None:
    """A real cgroup named like plain LXC's payload cgroup, for a process to live in (cgroup v1 pids)."""
    path = os.path.join(CGROUP_ROOT, "lxc.payload.%d" % vmid)
    if os.geteuid() != 0 or not os.access(CGROUP_ROOT, os.W_OK):
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path


@pytest.mark.skipif(fake_ct_cgroup(9201) is None, reason="needs root and a writable cgroup v1 pids hierarchy")
def test_container_scope_on_the_host(fake, tmp_path):
    """A holder whose cgroup says CT9201 does not block container 9200 and is named for container 9201."""
    cg = fake_ct_cgroup(9201)

    def enter():
        with open(os.path.join(cg, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))

    holder = fake.hold([6], mib=20000, preexec=enter)
    try:
        out = run_free_wait(fake, gpus=["6"], container=9200, timeout=5, interval=0.2)
        assert out["free"] is True and out["holders"] == []
        assert [(h["pid"], h["container"], h["ignored"]) for h in out["ignored_holders"]] == [
            (holder.pid, 9201, "outside container 9200 (CT9201)")]
        assert out["gpus"][0]["memory_counted_mib_after"] == 4
        out = run_free_wait(fake, gpus=["6"], container=9201, timeout=0.5, interval=0.2)
        assert out["failed"] and "pid %d" % holder.pid in out["msg"] and "in CT9201" in out["msg"]
    finally:
        fake.kill(holder, signal.SIGKILL)
        os.rmdir(cg)


@pytest.mark.lab
def test_lab_ct201_holder_does_not_block_container_200(lab, tmp_path):
    status = lab
    fdir, lxcpath = status["fakegpu"]["dir"], status["lxcpath"]
    tools = status["fakegpu"]["tools"]
    started = status["containers"].get(DECOY_CT) != "running"
    if started:
        subprocess.run(["lxc-start", "-P", lxcpath, "-n", DECOY_CT, "-d"], check=True, timeout=60)
        subprocess.run(["lxc-wait", "-P", lxcpath, "-n", DECOY_CT, "-s", "RUNNING", "-t", "30"], check=True, timeout=60)
    hold = subprocess.Popen(["lxc-attach", "-P", lxcpath, "-n", DECOY_CT, "--", "python3", tools + "/fakegpu.py",
                             "hold", "--gpu", "3", "--mib", "20000"], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout.readline().startswith("holding")
        out = run_module("gpu_free_wait", {"gpus": ["3"], "container": int(MAIN_CT), "nvidia_smi_path": NVIDIA_SMI,
                                           "device_paths": [fdir + "/dev/nvidia*"]},
                         check_mode=True, env=module_env(dict(os.environ, FAKEGPU_DIR=fdir)), timeout=60)
        ct201 = [h for h in out["ignored_holders"] if h["container"] == int(DECOY_CT)]
        assert ct201 and ct201[0]["ignored"] == f"outside container {MAIN_CT} (CT{DECOY_CT})"
        assert ct201[0]["used_mib"] == 20000
        assert all(h["container"] == int(MAIN_CT) for h in out["holders"])
        g = out["gpus"][0]
        assert g["memory_counted_mib_after"] == g["memory_used_mib_after"] - 20000
    finally:
        hold.kill()
        hold.wait()
        hold.stdout.close()
        if started:
            subprocess.run(["lxc-stop", "-P", lxcpath, "-n", DECOY_CT, "-k"], timeout=60, check=False)


def ansible_check(host: str, args: dict) -> dict:
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return adhoc_json_result(run_adhoc(host, "gpuops.repurpose.gpu_free_wait", args, check=True, env=env, timeout=180),
                             host)


@pytest.mark.lab
def test_lab_trainer_workers_seen_from_ct200_and_from_the_pve_host(lab):
    """Inside CT200 (through pct_ssh) the backend is blind and /proc names the workers by their container PIDs;
    on the PVE host the same workers appear with host PIDs, container 200, their NSpid and MiB."""
    before = lab_status()
    if not before["trainer"]["running"]:  # an earlier test in this lane left CT200 without its trainer
        trainer()
        before = lab_status()
    inside = ansible_check("ct200", {"timeout": 0})
    host = ansible_check("lab-pve", {"timeout": 0, "container": int(MAIN_CT)})
    after = lab_status()
    assert not inside.get("failed") and not host.get("failed"), (inside.get("msg"), host.get("msg"))
    assert inside["free"] is False and host["free"] is False
    assert all(h["used_mib"] is None and h["container"] is None for h in inside["holders"])
    assert all(h["container"] == int(MAIN_CT) and h["container_pid"] and h["used_mib"] for h in host["holders"])
    assert before["trainer"]["pids"] == after["trainer"]["pids"]  # a lane runs one test at a time
    workers = set(before["trainer"]["pids"]["workers"])
    assert {h["pid"] for h in inside["holders"]} == workers
    assert {h["container_pid"] for h in host["holders"]} == workers
    assert {h["pid"] for h in host["holders"]} == set(before["trainer"]["host_pids"]["workers"])
