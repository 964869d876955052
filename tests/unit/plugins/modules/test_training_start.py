"""training_start end to end on this host: the real module (own process), a real private tmux server per test
(``tmux_socket`` in the test's directory, never the user's default server), a real stdlib trainer.

The trainer prints ``step N`` lines from its ``--resume-from`` checkpoint's step + 1 and needs ``--data`` to be a
directory. Its worker (a child process) holds the files given with ``--hold`` open: files named ``nvidia0``,
``nvidia1`` in the test's directory stand in for GPU device files, matched through ``gpu_devices``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from trainer_harness import Tmux, alive, cmdline, have_tmux, kill_all_with, pids_with

from tests.support.module import run_module
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not have_tmux(), reason="tmux is not installed"), pytest.mark.processes]

TRAINER = r'''
import argparse, os, re, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--resume-from", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--hold", nargs="*", default=[])
parser.add_argument("--tag", default="")
parser.add_argument("--worker", action="store_true")
args = parser.parse_args()
if args.worker:
    held = [open(path, "rb") for path in args.hold]
    time.sleep(600)
    sys.exit(0)
if not os.path.isdir(args.data):
    sys.exit("trainer: --data %s is not a directory" % args.data)
if args.hold:
    subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--resume-from", args.resume_from,
                      "--data", args.data, "--hold", *args.hold])
step = int(re.search(r"(\d+)", os.path.basename(args.resume_from)).group(1))
print("resuming from %s at step %d" % (args.resume_from, step), flush=True)
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    step += 1
    print("step %d | 21.5 Ktok/s | loss 1.234" % step, flush=True)
    time.sleep(0.1)
'''


class Lab:
    """One test's directory: the trainer, its data, stand-in device files, a private tmux server and a record."""

    def __init__(self, root: str, python: str = sys.executable) -> None:
        self.root = root
        self.trainer = os.path.join(root, "trainer.py")
        self.data = os.path.join(root, "data")
        self.devices = [os.path.join(root, "nvidia%d" % i) for i in range(2)]
        self.python = python
        with open(self.trainer, "w") as handle:
            handle.write(TRAINER)
        os.makedirs(self.data)
        for path in self.devices:
            open(path, "w").close()
        self.tmux = Tmux(root)
        self.record_path = os.path.join(root, "launch", "dflash.json")

    def argv(self, *extra: str, data: str = "/data/old") -> list[str]:
        return [self.python, self.trainer, "--resume-from", os.path.join(self.root, "ckpt-step000700.bin"),
                "--data", data, *extra]

    def record(self, argv: list[str], **changes) -> str:
        record = {"version": 1, "tmux_session": "dflash", "tmux_window": "0", "argv": argv, "cwd": self.root,
                  "user": "root", "uid": os.geteuid(), "env": {"CUDA_VISIBLE_DEVICES": "0,1"},
                  "step_line": "step 700 | 21.5 Ktok/s | loss 1.234", "step": 700,
                  "checkpoint": {"path": argv[3], "step": 700, "kind": "file", "whole": True, "why": "", "mtime": 1.0,
                                 "size": 5},
                  "checkpoint_skipped": [], "stopped_at": 1767225600.0, "stopped_by": "SIGINT via tmux"}
        record.update(changes)
        os.makedirs(os.path.dirname(self.record_path), mode=0o700, exist_ok=True)
        with open(self.record_path, "w") as handle:
            json.dump(record, handle)
        os.chmod(self.record_path, 0o600)
        return self.record_path

    def args(self, **args) -> dict:
        return dict({"record": self.record_path, "tmux_socket": self.tmux.socket, "timeout": 20, "interval": 0.1},
                    **args)

    def gpu_args(self, **args) -> dict:
        return self.args(**dict({"gpus": ["0", "1"], "gpu_devices": [os.path.join(self.root, "nvidia[0-9]*")]}, **args))

    def sessions(self) -> list[str]:
        done = self.tmux.run("list-sessions", "-F", "#{session_name}", check=False)
        return done.stdout.split() if done.returncode == 0 else []

    def windows(self, session: str = "dflash") -> list[str]:
        return self.tmux.run("list-windows", "-t", "=" + session, "-F", "#{window_index} #{window_name}").stdout.split(
            "\n")[:-1]

    def cleanup(self) -> None:
        if os.path.exists(self.tmux.socket):
            self.tmux.kill_server()
        kill_all_with(self.root)


@pytest.fixture
def lab(tmp_path):
    lab = Lab(str(tmp_path))
    yield lab
    lab.cleanup()


@pytest.fixture
def start():
    """The module runner (tests/support/module.py), pointed at this module."""
    return functools.partial(run_module, "training_start")


def trainers(lab: Lab) -> list[int]:
    """The trainer's processes (not the tmux server: it keeps the new-session command line, trainer path included)."""
    return [pid for pid in pids_with(lab.trainer) if not cmdline(pid).startswith("tmux ")]


def proc_argv(pid: int) -> list[str]:
    with open("/proc/%d/cmdline" % pid, "rb") as handle:
        return handle.read().decode().split("\0")[:-1]


def proc_env(pid: int) -> dict[str, str]:
    with open("/proc/%d/environ" % pid, "rb") as handle:
        return dict(item.split("=", 1) for item in handle.read().decode().split("\0") if "=" in item)


def test_starts_from_the_record_with_overrides_proves_it_trains_and_a_rerun_changes_nothing(lab, start):
    # an argument ending in ';' and one with a tmux format reach the job as they are (no tmux or shell parsing)
    argv = lab.argv("--tag", "x#{pane_id};", "--hold", *lab.devices)
    lab.record(argv)
    result = start(lab.gpu_args(overrides={"--data": lab.data}))
    assert result["rc"] == 0, result
    wanted = argv[:5] + [lab.data] + argv[6:]
    assert result["argv"] == wanted
    assert result["changed"] is True and result["launched"] is True and result["already_running"] is False
    assert result["min_step"] == 700 and result["first_step"] == 701
    assert result["step_line"] == "step 701 | 21.5 Ktok/s | loss 1.234"
    assert result["exit_status"] is None and result["pane_tail"] == []
    assert "new-session" in result["plan"][0] and "above step 700" in result["plan"][1]

    root = result["tree"][0]["pid"]
    assert proc_argv(root) == wanted  # exactly the argv: no shell in between
    assert os.readlink("/proc/%d/cwd" % root) == lab.root
    assert proc_env(root)["CUDA_VISIBLE_DEVICES"] == "0,1"
    worker = [e["pid"] for e in result["tree"] if "--worker" in e["cmdline"]]
    assert len(worker) == 1 and result["tree"][1]["ppid"] == root
    assert [(g["gpu"], g["index"], g["pids"], g["via"]) for g in result["gpus_held"]] == [
        ("0", 0, worker, ["device"]), ("1", 1, worker, ["device"])]
    # proven: the window now closes with the job, like one started by hand
    assert lab.tmux.run("show-options", "-w", "-v", "-t", "=dflash:", "remain-on-exit").stdout.strip() == "off"

    again = start(lab.gpu_args(overrides={"--data": lab.data}))
    assert again["rc"] == 0, again
    assert again["changed"] is False and again["launched"] is False and again["already_running"] is True
    assert again["pane"] == result["pane"] and again["tree"][0]["pid"] == root and again["first_step"] == 701
    assert again["plan"][0].startswith("already running: pid %d" % root)
    assert len(trainers(lab)) == 2  # the launcher and its worker, once
    assert lab.windows() == ["0 train"]


def test_a_job_that_exits_at_start_fails_with_its_last_lines_and_exit_status(lab, start):
    lab.record(lab.argv("--bogus", data=lab.data))
    result = start(lab.args())
    assert result["rc"] == 1 and result["launched"] is True, result
    assert result["exit_status"] == 2  # argparse's
    assert any("unrecognized arguments: --bogus" in line for line in result["pane_tail"]), result["pane_tail"]
    assert result["pane_tail"][-1].startswith("Pane is dead (status 2")
    assert result["msg"].startswith("the job exited with status 2 before it showed that it trains: no step line above "
                                    "step 700, none shown. Last lines: ")
    assert "Nothing was retried" in result["msg"] and "gpu_free_wait" in result["msg"]
    # its pane was read, then closed: the session it made is gone, nothing runs, nothing is retried
    assert lab.sessions() == [] and trainers(lab) == []


def test_a_job_that_dies_later_reports_its_own_error(lab, start):
    lab.record(lab.argv())  # --data /data/old does not exist: the trainer says so and exits 1
    result = start(lab.args(timeout=10))
    assert result["rc"] == 1 and result["exit_status"] == 1, result
    assert "trainer: --data /data/old is not a directory" in result["pane_tail"]
    assert "Last lines: trainer: --data /data/old is not a directory." in result["msg"]


def test_check_mode_reports_the_plan_and_launches_nothing(lab, start):
    lab.record(lab.argv(data=lab.data))
    result = start(lab.args(), check_mode=True, diff=True)
    assert result["rc"] == 0, result
    assert result["changed"] is True and result["launched"] is False and result["tree"] == []
    assert result["plan"][0].startswith("tmux -S %s new-session -d" % lab.tmux.socket)
    assert result["diff"] == {"before": "", "after": " ".join(result["argv"]) + "\n"}
    assert not os.path.exists(lab.tmux.socket) and trainers(lab) == []


def test_an_override_for_an_argument_not_in_argv_fails_before_anything_moves(lab, start):
    lab.record(lab.argv(data=lab.data))
    result = start(lab.args(overrides={"--dta": "/x"}))
    assert result["rc"] == 1 and result["launched"] is False and result["changed"] is False
    assert result["msg"] == "overrides: argv has no argument --dta; it has: --resume-from, --data"
    assert not os.path.exists(lab.tmux.socket) and trainers(lab) == []


def test_an_existing_session_gets_a_new_window_and_keeps_the_operators_pane(lab, start):
    lab.tmux.run("new-session", "-d", "-s", "dflash", "-n", "shell", "--", "sleep", "600")  # the operator's pane
    argv = lab.argv(data=lab.data)
    # by hand this time: argv, cwd, the module's user, extra env
    result = start({"argv": argv, "cwd": lab.root, "tmux_session": "dflash", "tmux_socket": lab.tmux.socket,
                    "env": {"OMP_NUM_THREADS": 4}, "min_step": 705, "timeout": 20, "interval": 0.1})
    assert result["rc"] == 0, result
    assert "new-window" in result["plan"][0] and "-t =dflash:1" in result["plan"][0]
    assert result["first_step"] == 706 and result["min_step"] == 705
    assert lab.windows() == ["0 shell", "1 train"]
    assert proc_env(result["tree"][0]["pid"])["OMP_NUM_THREADS"] == "4"


def test_a_gpu_the_job_does_not_hold_times_out_and_the_job_is_left_running(lab, start):
    lab.record(lab.argv("--hold", lab.devices[0], data=lab.data))
    result = start(lab.gpu_args(timeout=2))
    assert result["rc"] == 1, result
    assert [g["gpu"] for g in result["gpus_held"]] == ["0"] and result["first_step"] == 701
    assert "did not show within 2 s that it trains: GPU 1 not held by its processes." in result["msg"]
    assert "It was left running" in result["msg"]
    assert result["exit_status"] is None and result["pane_tail"][-1].startswith("step ")
    assert alive(result["tree"][0]["pid"])


def test_a_gpu_already_held_refuses_the_launch(lab, start):
    lab.record(lab.argv("--hold", *lab.devices, data=lab.data))
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(600)",
                              lab.devices[1]], cwd=lab.root)
    try:
        wait_for(lambda: any(os.path.realpath(os.path.join("/proc/%d/fd" % other.pid, fd)) == lab.devices[1]
                             for fd in os.listdir("/proc/%d/fd" % other.pid)), 10, what="the other holder",
                 interval=0.02)
        result = start(lab.gpu_args())
        assert result["rc"] == 1 and result["launched"] is False, result
        assert result["msg"].startswith("gpus: already held before the launch: pid %d" % other.pid)
        assert lab.sessions() == []
        dry = start(lab.gpu_args(), check_mode=True)  # a dry run of stop-then-start stopped nothing
        assert dry["rc"] == 0 and any("already held" in note for note in dry["notes"]), dry
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("args, fragment", [
    ({"gpus": ["0", "5"]}, "gpus: no device file for GPU 5 among gpu_devices"),
    ({"gpus": ["GPU-0f6e"]}, "'GPU-0f6e' is not an index, and neither NVML nor nvidia-smi answers"),
    ({"tmux_session": "eval"}, "is for tmux session 'dflash', not 'eval'"),
    ({"tmux_window": "a#b"}, "tmux_window 'a#b' holds '#'"),
    ({"step_regex": "step (\\d+"}, "step_regex: missing ), unterminated subpattern"),
    ({"env": {"A-B": "1"}}, "env: 'A-B' is not an environment variable name"),
])
def test_bad_options_fail_before_anything_moves(lab, start, args, fragment):
    lab.record(lab.argv(data=lab.data))
    result = start(lab.gpu_args(**args))
    assert result["rc"] == 1 and fragment in result["msg"], result["msg"]
    assert not os.path.exists(lab.tmux.socket)


def test_record_problems_name_the_options_that_give_the_command_by_hand(lab, start):
    result = start(lab.args())
    assert result["rc"] == 1 and "no launch record at %s" % lab.record_path in result["msg"]
    assert "argv, cwd and user" in result["msg"]
    lab.record(lab.argv(data=lab.data))
    os.chmod(lab.record_path, 0o666)
    assert "writable by group or others" in start(lab.args())["msg"]
    both = start(lab.args(argv=["x"], cwd=lab.root))
    assert both["rc"] == 1 and "mutually exclusive: record|argv" in both["msg"]
    by_hand = start({"argv": ["x"], "cwd": lab.root})
    assert by_hand["msg"] == "tmux_session is required when the command is given by hand (argv, cwd)"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root, runuser and /usr/bin/python3")
def test_another_user_runs_in_its_own_tmux_server(start):
    # nobody must reach the trainer, its data and the socket: a world-readable directory of its own, not tmp_path
    root = tempfile.mkdtemp(prefix="gpuops-start-")
    os.chmod(root, 0o755)
    lab = Lab(root, python="/usr/bin/python3")
    sockets = os.path.join(root, "sockets")
    os.makedirs(sockets)
    os.chown(sockets, 65534, 65534)
    lab.tmux.socket = os.path.join(sockets, "tmux.sock")
    try:
        lab.record(lab.argv(data=lab.data), user="nobody", uid=65534)
        result = start(lab.args())
        assert result["rc"] == 0, result
        assert result["plan"][0] == "start as user nobody through runuser (its own tmux server)"
        assert result["plan"][1].startswith("runuser -u nobody -- tmux -S %s new-session" % lab.tmux.socket)
        with open("/proc/%d/status" % result["tree"][0]["pid"]) as handle:
            assert [line.split()[1] for line in handle if line.startswith("Uid:")] == ["65534"]
        again = start(lab.args())
        assert again["rc"] == 0 and again["already_running"] is True and again["changed"] is False, again
        wrong = lab.record(lab.argv(data=lab.data), user="nobody", uid=4242)
        assert "nobody is uid 65534 here, but the launch record says uid 4242" in start(lab.args(record=wrong))["msg"]
    finally:
        subprocess.run(["runuser", "-u", "nobody", "--", "tmux", "-S", lab.tmux.socket, "kill-server"],
                       capture_output=True, timeout=10, check=False)
        kill_all_with(root)
        wait_for(lambda: not pids_with(root), 10, what="nobody's processes gone", interval=0.02)
        shutil.rmtree(root, ignore_errors=True)


def test_a_job_killed_by_a_signal_reports_it(lab, start):
    # a trainer that kills itself after its first line: the status is the signal, as -signal
    script = os.path.join(lab.root, "suicide.py")
    with open(script, "w") as handle:
        handle.write("import os, signal, time\nprint('step 1', flush=True)\ntime.sleep(0.5)\n"
                     "os.kill(os.getpid(), signal.SIGTERM)\n")
    result = start({"argv": [sys.executable, script], "cwd": lab.root, "tmux_session": "s", "min_step": 5,
                    "tmux_socket": lab.tmux.socket, "timeout": 20, "interval": 0.1})
    assert result["rc"] == 1 and result["exit_status"] == -signal.SIGTERM, result
    assert "killed by signal 15" in result["msg"] and "the last shown is step 1" in result["msg"]
    assert result["elapsed"] < 15  # the wait ended with the job, not at its timeout
