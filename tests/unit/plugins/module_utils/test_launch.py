"""training_start's pure parts: overrides by argument name, the tmux command line, the launch record's checks, and
what is read back from tmux, /proc and the pane. No process is started here (tests/unit/plugins/modules/
test_training_start.py runs the module for real)."""

from __future__ import annotations

import json
import os
import re

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    GpuError,
    GpuInfo,
    GpuProcess,
    Holder,
    Sample,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch import gpus as _launch_gpus
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch import start as _launch
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.gpus import (
    GpuTarget,
    GpuWatch,
    busy_holders,
    gpus_held,
    resolve_gpus,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import record_file_problem
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.start import (
    DEFAULT_STEP_REGEX,
    LaunchError,
    apply_overrides,
    argument_names,
    env_values,
    launch_plan,
    name_problem,
    read_record,
    record_min_step,
    version_problem,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.watch import (
    first_step_after,
    job_tree,
    last_output,
    running_in_panes,
    same_argv,
    tail_lines,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ProcessInfo
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import (
    Pane,
    parse_panes,
    parse_tmux_version,
    tmux_arg,
)

pytestmark = pytest.mark.processes

ARGV = ["python3", "/opt/lab/trainer/fake_trainer.py", "--behaviour", "stubborn", "--nproc", "8",
        "--ckpt-dir", "/root/dflash/checkpoints", "--data=/data/old"]
STEP = re.compile(DEFAULT_STEP_REGEX)


# ---------------------------------------------------------------- overrides

def test_an_override_replaces_the_value_after_the_name():
    out = apply_overrides(ARGV, {"--ckpt-dir": "/new/ckpt"})
    assert out == ARGV[:7] + ["/new/ckpt", "--data=/data/old"]
    assert ARGV[7] == "/root/dflash/checkpoints"  # the input is not changed


def test_an_override_replaces_the_equals_form():
    assert apply_overrides(ARGV, {"--data": "/data/new"})[-1] == "--data=/data/new"


def test_every_occurrence_is_replaced_and_several_overrides_apply():
    argv = ["torchrun", "--data", "a", "train.py", "--data=b", "--lr", "1e-4"]
    assert apply_overrides(argv, {"--data": "/x", "--lr": "3e-4"}) == [
        "torchrun", "--data", "/x", "train.py", "--data=/x", "--lr", "3e-4"]


def test_a_value_that_looks_like_an_option_name_is_not_confused_with_one():
    # "--data=--x" is the equals form of --data, and a name that only prefixes another (--data-dir) is not it
    argv = ["p", "--data-dir", "/d", "--data", "/old"]
    assert apply_overrides(argv, {"--data": "--x"}) == ["p", "--data-dir", "/d", "--data", "--x"]


def test_an_unknown_name_names_the_option_and_the_arguments_argv_has():
    with pytest.raises(LaunchError) as info:
        apply_overrides(ARGV, {"--dta": "/x"})
    msg = str(info.value)
    assert msg.startswith("overrides: argv has no argument --dta; it has: ")
    assert "--behaviour, --nproc, --ckpt-dir, --data" in msg


def test_a_flag_has_no_value_to_replace():
    with pytest.raises(LaunchError, match="--no-gpu takes no value in argv .--data follows it."):
        apply_overrides(["p", "--no-gpu", "--data", "x"], {"--no-gpu": "1"})
    with pytest.raises(LaunchError, match="--last takes no value in argv .it is the last argument."):
        apply_overrides(["p", "--last"], {"--last": "1"})


@pytest.mark.parametrize("name", ["data", "-", "--", "--data=x", 3])
def test_a_name_must_be_an_option_name(name):
    with pytest.raises(LaunchError, match="is not an argument name"):
        apply_overrides(ARGV, {name: "x"})


@pytest.mark.parametrize("value", [None, True, ["a"], {"a": 1}])
def test_a_value_must_be_a_string(value):
    with pytest.raises(LaunchError, match="give a string .an override replaces the value of an argument, it never "
                                          "removes one."):
        apply_overrides(ARGV, {"--data": value})


def test_numbers_are_taken_as_their_text():
    assert apply_overrides(ARGV, {"--nproc": 4})[5] == "4"


def test_argv0_is_the_program_not_an_argument():
    assert argument_names(["--weird-program", "-v", "-1", "--x=1", "-", "--", "--x"]) == ["-v", "--x"]
    with pytest.raises(LaunchError, match="has no argument --weird-program"):
        apply_overrides(["--weird-program", "x"], {"--weird-program": "y"})


def test_env_values_are_strings_with_valid_names():
    assert env_values({"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": 8}) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "8"}
    with pytest.raises(LaunchError, match="env: 'A=B' is not an environment variable name"):
        env_values({"A=B": "x"})
    with pytest.raises(LaunchError, match="env: the value of X is None"):
        env_values({"X": None})


# ---------------------------------------------------------------- the tmux command

def test_plan_without_the_session_creates_it_and_keeps_the_pane_in_the_same_command():
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0,1"}
    plan = launch_plan(ARGV, "/root/dflash", "dflash", "train", env, session_exists=False)
    assert plan == ["tmux", "new-session", "-d", "-P", "-F", "#{pane_id}\t#{pane_pid}\t#{window_id}", "-s", "dflash",
                    "-n", "train", "-c", "/root/dflash", "-e", "CUDA_VISIBLE_DEVICES=0,1", "-e", "PATH=/usr/bin:/bin",
                    "--", *ARGV, ";", "set-option", "-w", "-t", "=dflash:", "remain-on-exit", "on"]


def test_plan_with_the_session_adds_a_window_at_a_free_index():
    plan = launch_plan(ARGV, "/root/dflash", "dflash", "train", {}, session_exists=True, window_index=3,
                       socket="/run/t.sock")
    assert plan[:10] == ["tmux", "-S", "/run/t.sock", "new-window", "-d", "-P", "-F",
                         "#{pane_id}\t#{pane_pid}\t#{window_id}", "-t", "=dflash:3"]
    assert plan[10:15] == ["-n", "train", "-c", "/root/dflash", "--"]
    assert plan[-6:] == ["set-option", "-w", "-t", "=dflash:3", "remain-on-exit", "on"]
    with pytest.raises(ValueError):
        launch_plan(ARGV, "/", "dflash", "train", {}, session_exists=True)


def test_plan_as_another_user_goes_through_runuser():
    plan = launch_plan(["python3", "t.py"], "/home/lab", "s", "train", {}, session_exists=False, run_as="lab")
    assert plan[:5] == ["runuser", "-u", "lab", "--", "tmux"]
    assert plan.index("--", 5) == plan.index("python3") - 1


def test_plan_escapes_what_tmux_would_split_or_expand():
    # tmux ends a command at an argument ending in ';' and expands '#{...}' in -c: both reach the job as given
    plan = launch_plan(["p", "a;", "\\;", "#{pane_id}"], "/w/#1", "s", "train", {"X": "1;"}, session_exists=False)
    assert plan[plan.index("--") + 1:plan.index(";")] == ["p", "a\\;", "\\\\;", "#{pane_id}"]
    assert plan[plan.index("-c") + 1] == "/w/##1" and plan[plan.index("-e") + 1] == "X=1\\;"
    assert tmux_arg("plain") == "plain" and tmux_arg(";") == "\\;"


@pytest.mark.parametrize("text, version", [("tmux 3.3a", (3, 3)), ("tmux 2.9", (2, 9)), ("tmux next-3.4", (3, 4)),
                                           ("tmux master", None)])
def test_tmux_versions(text, version):
    assert parse_tmux_version(text) == version


def test_old_tmux_is_refused_with_the_fix():
    assert "needs tmux 3.0 or later" in version_problem((2, 9), new_session=False, with_env=False)
    msg = version_problem((3, 1), new_session=True, with_env=True, session="dflash")
    assert "new-session -e needs tmux 3.2" in msg and "tmux new-session -d -s dflash" in msg
    assert version_problem((3, 1), new_session=False, with_env=True) == ""  # new-window -e is 3.0
    assert version_problem((3, 1), new_session=True, with_env=False) == ""
    assert version_problem(None, new_session=True, with_env=True) == ""


def test_names_tmux_would_rewrite_are_refused():
    assert "':' '.'" in name_problem("tmux_session", "a:b.c", ":.#")
    assert name_problem("tmux_window", "", "#") == "tmux_window must not be empty"
    assert name_problem("tmux_session", "dflash-2", ":.#") == ""


# ---------------------------------------------------------------- the record

RECORD = {"version": 1, "tmux_session": "dflash", "tmux_window": "0", "argv": ARGV, "cwd": "/root/dflash",
          "user": "root", "uid": 0, "env": {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin:/bin"},
          "step_line": "step 700 | 21.5 Ktok/s | loss 1.234", "step": 700,
          "checkpoint": {"path": "/root/dflash/checkpoints/ckpt-step000700.bin", "step": 690, "kind": "file",
                         "whole": True, "why": "", "mtime": 1.0, "size": 5},
          "checkpoint_skipped": [], "stopped_at": 1767225600.0, "stopped_by": "SIGINT via tmux"}


def write(path, data, mode=0o600):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    os.chmod(path, mode)
    return str(path)


def test_a_good_record_reads(tmp_path):
    assert read_record(write(tmp_path / "dflash.json", RECORD), "dflash")["argv"] == ARGV
    assert read_record(write(tmp_path / "dflash.json", RECORD))["cwd"] == "/root/dflash"


def test_a_missing_record_names_the_options_that_give_the_command_by_hand(tmp_path):
    with pytest.raises(LaunchError) as info:
        read_record(str(tmp_path / "nope.json"))
    assert "no launch record at %s" % (tmp_path / "nope.json") in str(info.value)
    assert "argv, cwd and user" in str(info.value)


def test_a_record_for_another_session_is_refused(tmp_path):
    with pytest.raises(LaunchError, match="is for tmux session 'dflash', not 'eval'"):
        read_record(write(tmp_path / "dflash.json", RECORD), "eval")


def test_bad_json_is_refused(tmp_path):
    with pytest.raises(LaunchError, match="cannot read the launch record .*argv, cwd and user"):
        read_record(write(tmp_path / "dflash.json", '{"argv": ['))


@pytest.mark.parametrize("change, fragment", [
    ({"argv": []}, "holds no argv"),
    ({"cwd": None}, "has no cwd"),
    ({"user": ""}, "has no user"),
    ({"version": 2}, "has version 2; this collection reads version 1"),
    ({"env": {"A": 1}}, "env is not a mapping of names to strings"),
])
def test_a_record_missing_what_the_launch_needs_is_refused(tmp_path, change, fragment):
    with pytest.raises(LaunchError, match=re.escape(fragment)):
        read_record(write(tmp_path / "dflash.json", dict(RECORD, **change)))


def test_a_record_others_can_write_is_not_run(tmp_path):
    with pytest.raises(LaunchError, match="writable by group or others .mode 0620."):
        read_record(write(tmp_path / "dflash.json", RECORD, mode=0o620))
    assert "belongs to uid 1000, not root" in record_file_problem("/r.json", 1000, 0o100600, 0)
    assert record_file_problem("/r.json", 1000, 0o100600, 1000) == ""  # the module's own user


def test_min_step_is_the_checkpoint_step_else_the_last_step():
    assert record_min_step(RECORD) == 690
    assert record_min_step(dict(RECORD, checkpoint=None)) == 700
    assert record_min_step(dict(RECORD, checkpoint={"step": True}, step=None)) is None


# ---------------------------------------------------------------- tmux, /proc and the pane read back

def test_pane_states_of_exactly_the_session():
    text = ("%0\t100\t0\t\t\t@0\t0\tshell\tdflash\n"
            "%1\t200\t1\t2\t\t@1\t1\ttrain\tdflash\n"
            "%2\t300\t1\t\t15\t@2\t2\ttrain\tdflash\n"
            "%3\t400\t0\t\t\t@3\t0\ttrain\tdflash-eval\n")
    panes = parse_panes(text, "dflash")
    assert [(p.pane_id, p.dead, p.exit_status, p.window_index) for p in panes] == [
        ("%0", False, None, 0), ("%1", True, 2, 1), ("%2", True, -15, 2)]


def proc(pid, ppid, cmdline, pgid=None, sid=None):
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid or pid, sid=sid or pid, state="S", starttime=pid * 10, comm="x",
                       cmdline=tuple(cmdline))


def test_same_argv_allows_a_shimmed_interpreter_only():
    assert same_argv(["/root/.pyenv/versions/3.11/bin/python3", "t.py"], ["python3", "t.py"])
    assert not same_argv(["python3", "t.py", "--x"], ["python3", "t.py"])
    assert not same_argv(["python", "t.py"], ["python3", "t.py"])
    assert not same_argv([], ["python3"])


def test_running_in_panes_finds_the_job_under_a_shell_and_skips_dead_panes():
    table = {p.pid: p for p in [
        proc(100, 1, ["bash"]), proc(101, 100, ["python3", "t.py"]), proc(102, 101, ["python3", "t.py"]),
        proc(200, 1, ["python3", "t.py"]),  # the PID of a dead pane, reused by someone else
    ]}
    live = Pane("%0", 100, False, None, "@0", 0, "shell")
    dead = Pane("%1", 200, True, 1, "@1", 1, "train")
    found = running_in_panes([live, dead], table, ["python3", "t.py"])
    assert [(pane.pane_id, info.pid) for pane, info in found] == [("%0", 101)]  # not its worker 102, not 200


def test_the_tree_is_the_root_and_everything_below_it_and_in_its_session():
    table = {p.pid: p for p in [
        proc(10, 1, ["tmux"]), proc(20, 10, ["launcher"]), proc(21, 20, ["worker"]),
        proc(22, 1, ["orphan"], pgid=22, sid=20), proc(30, 10, ["other"])]}
    assert [(e["pid"], e["ppid"], e["cmdline"]) for e in job_tree(20, table)] == [
        (20, 10, "launcher"), (21, 20, "worker"), (22, 1, "orphan")]


def test_first_step_after_min_step():
    text = "loading ckpt-step000700\nstep 700 | resumed\nstep 701 | loss 1.2\nstep 702 | loss 1.1\n"
    assert first_step_after(text, STEP, 700) == ("step 701 | loss 1.2", 701)
    assert first_step_after(text, STEP, None) == ("step 700 | resumed", 700)
    assert first_step_after(text, STEP, 702) is None
    assert first_step_after("it=9 s\n", re.compile(r"it=\d+"), 5) == ("it=9 s", 9)  # no group: the first number


def test_tail_drops_empty_screen_rows_but_keeps_the_dead_pane_line():
    text = "a\n\nerror: bad\n" + "\n" * 20 + "Pane is dead (status 2, now)\n\n\n"
    assert tail_lines(text) == ["a", "", "error: bad", "Pane is dead (status 2, now)"]
    assert tail_lines("\n".join(str(i) for i in range(100)), 30)[0] == "70"
    assert last_output(["a", "error: bad", "Pane is dead (status 2, now)"]) == "a | error: bad"
    assert last_output([]) == "no output"


# ---------------------------------------------------------------- GPUs

GPUS = [GpuInfo(0, "GPU-aaa", "H200", 1, 100), GpuInfo(1, "GPU-bbb", "H200", 1, 100)]


def holder(pid, gpu):
    return Holder(pid=pid, name="python3", cmdline="python3 t.py", gpu=gpu, device="/dev/nvidia%s" % gpu)


def test_gpus_by_index_or_uuid_with_a_backend():
    targets = resolve_gpus(["1", "gpu-AAA"], GPUS, set(), "")
    assert targets == [GpuTarget("1", 1, "GPU-bbb"), GpuTarget("gpu-AAA", 0, "GPU-aaa")]
    with pytest.raises(GpuError, match=r"gpus: no GPU '7' here; present: 0 \(GPU-aaa\), 1 \(GPU-bbb\)"):
        resolve_gpus(["7"], GPUS, set(), "")


def test_gpus_without_a_backend_need_indices_with_device_files():
    assert resolve_gpus(["0"], None, {0, 1}, "") == [GpuTarget("0", 0, None)]
    with pytest.raises(GpuError, match=r"no device file for GPU 2 among gpu_devices \(/dev/nvidia\[0-9\]\*"):
        resolve_gpus(["2"], None, {0, 1}, "/dev/nvidia[0-9]* matched /dev/nvidia0, /dev/nvidia1")
    with pytest.raises(GpuError, match="'GPU-aaa' is not an index, and neither NVML nor nvidia-smi answers"):
        resolve_gpus(["GPU-aaa"], None, {0}, "")


def test_held_only_by_the_tree_through_device_files_or_the_backend():
    targets = [GpuTarget("0", 0, "GPU-aaa"), GpuTarget("1", 1, "GPU-bbb")]
    holders = [holder(21, 0), holder(99, 1)]  # 99 is not the job's
    assert gpus_held(targets, {20, 21}, holders, ()) == [
        {"gpu": "0", "index": 0, "uuid": "GPU-aaa", "pids": [21], "via": ["device"]}]
    held = gpus_held(targets, {20, 21}, holders, [GpuProcess(21, "GPU-bbb", 5000), GpuProcess(21, "GPU-aaa", 10)])
    assert [(h["gpu"], h["via"]) for h in held] == [("0", ["backend", "device"]), ("1", ["backend"])]


def test_busy_holders_are_those_on_expected_gpus():
    targets = [GpuTarget("1", 1, None)]
    assert [h.pid for h in busy_holders(targets, [holder(5, 0), holder(6, 1), holder(7, None)])] == [6]


class FakeBackend:
    """What open_backend returns: the GPUs, and (for the process list) PIDs this test chooses."""

    def __init__(self, processes=()):
        self.processes, self.closed, self.samples = tuple(processes), False, 0

    def sample(self):
        self.samples += 1
        return Sample(at=0.0, gpus=tuple(GPUS), processes=self.processes, backend="nvml")

    def close(self):
        self.closed = True


def test_gpu_watch_maps_uuids_and_asks_the_backend_only_when_device_files_fall_short(monkeypatch, tmp_path):
    backend = FakeBackend([GpuProcess(4242, "GPU-bbb", 30000)])
    monkeypatch.setattr(_launch_gpus, "open_backend", lambda kind, path, call_timeout: backend)
    monkeypatch.setattr(_launch_gpus, "backend_pids_are_ours", lambda: True)
    watch = GpuWatch(["GPU-BBB"], [str(tmp_path / "nvidia[0-9]*")])  # no device file: the backend alone says
    assert watch.targets == [GpuTarget("GPU-BBB", 1, "GPU-bbb")] and watch.notes == []
    assert watch.held({4242}) == [{"gpu": "GPU-BBB", "index": 1, "uuid": "GPU-bbb", "pids": [4242],
                                   "via": ["backend"]}]
    assert watch.held({1}) == [] and backend.samples == 3
    watch.close()
    assert backend.closed and watch.backend is None


def test_gpu_watch_without_a_backend_reads_device_files_and_says_so(monkeypatch, tmp_path):
    def no_backend(kind, path, call_timeout):
        raise GpuError("nvidia-smi not found on PATH")

    monkeypatch.setattr(_launch_gpus, "open_backend", no_backend)
    (tmp_path / "nvidia0").write_text("")
    watch = GpuWatch(["0"], [str(tmp_path / "nvidia[0-9]*")])
    assert watch.targets == [GpuTarget("0", 0, None)] and watch.backend is None
    assert watch.notes == ["GPUs checked through gpu_devices only (no NVML or nvidia-smi answer: nvidia-smi not found "
                           "on PATH)"]
    with open(tmp_path / "nvidia0") as held_open:  # this process holds it, but scans leave themselves out
        assert held_open and watch.held({os.getpid()}) == []
    with pytest.raises(GpuError, match="no device file for GPU 1 among gpu_devices"):
        GpuWatch(["1"], [str(tmp_path / "nvidia[0-9]*")])


def test_no_gpus_no_backend():
    watch = GpuWatch([], ["/dev/nvidia[0-9]*"])
    assert watch.targets == [] and watch.backend is None and watch.call_timeout() == 30.0


# ---------------------------------------------------------------- resume and the record by session

def params(**given):
    base = dict(record=None, record_dir="", argv=None, cwd=None, user=None, tmux_session=None, tmux_window="train",
                env={}, overrides={}, resume_arg="", checkpoint=None, min_step=None)
    return dict(base, **given)


def test_set_argument_replaces_either_form_or_appends():
    assert _launch.set_argument(["t", "--resume-from", "a"], "--resume-from", "b") == ["t", "--resume-from", "b"]
    assert _launch.set_argument(["t", "--resume-from=a"], "--resume-from", "b") == ["t", "--resume-from=b"]
    assert _launch.set_argument(["t", "--x", "1"], "--resume-from", "b") == ["t", "--x", "1", "--resume-from", "b"]


def test_the_record_by_session_resumes_from_its_checkpoint_past_its_step(tmp_path):
    write(tmp_path / "dflash.json", dict(RECORD, cwd=str(tmp_path), user="root", uid=os.geteuid()))
    if os.geteuid() != 0:
        pytest.skip("the record's user is root")
    job = _launch.resolve_job(params(record_dir=str(tmp_path), tmux_session="dflash", resume_arg="--resume-from",
                                     overrides={"--data": "/srv/merged"}))
    assert job.argv == ARGV[:-1] + ["--data=/srv/merged", "--resume-from", RECORD["checkpoint"]["path"]]
    assert job.min_step == 690 and job.checkpoint["path"] == RECORD["checkpoint"]["path"] and job.record["step"] == 700
    # a checkpoint given by hand: its step from its name; no resume_arg: the argv as recorded
    mine = _launch.resolve_job(params(record_dir=str(tmp_path), tmux_session="dflash", resume_arg="--resume-from",
                                      checkpoint="/ck/ckpt-step000650.bin"))
    assert mine.argv[-2:] == ["--resume-from", "/ck/ckpt-step000650.bin"] and mine.min_step == 650
    plain = _launch.resolve_job(params(record_dir=str(tmp_path), tmux_session="dflash"))
    assert plain.argv == ARGV and plain.checkpoint is None


def test_record_dir_needs_the_session():
    with pytest.raises(LaunchError, match="tmux_session is required with record_dir"):
        _launch.resolve_job(params(record_dir="/var/lib/gpuops/launch"))
