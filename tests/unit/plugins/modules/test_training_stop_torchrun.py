"""training_stop against a REAL torchrun job on this host (issue 11).

Real PyTorch (CPU, gloo) from the cached venv ``tests/lab/torchrun_job/torch-venv`` builds, a real DDP
job with DataLoader workers and atomic checkpoints (``tests/lab/torchrun_job/train.py``), launched as the
incident's team launches it: ``tmux new-session -d -s dflash "torchrun ..."`` on a private tmux server
(its own socket), so the server keeps that command line. Decoys on the same server and outside it must
never be signalled. The real module runs in its own process. Rung timeouts are short to keep CI time
down; the assertions are about which rung stopped the job, what was signalled and what survived.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import yaml
from trainer_harness import Decoy, Tmux, alive, have_tmux

from tests.support.module import module_command, module_env, run_module
from tests.support.paths import ROOT
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

JOB_DIR = os.path.join(ROOT, "tests", "lab", "torchrun_job")
TRAIN = os.path.join(JOB_DIR, "train.py")
with open(os.path.join(ROOT, "roles", "stop_training", "defaults", "main.yml")) as _handle:
    ROLE_MATCH = yaml.safe_load(_handle)["stop_training_match"]


@pytest.fixture(scope="module")
def venv():
    """The cached torch venv (built on first use, as scripts/setup does; reused after)."""
    done = subprocess.run([os.path.join(JOB_DIR, "torch-venv")], capture_output=True, text=True, timeout=1800,
                          check=False)
    if done.returncode != 0:
        pytest.fail("tests/lab/torchrun_job/torch-venv could not build the torch venv:\n%s" % done.stderr[-3000:])
    return done.stdout.strip().splitlines()[-1]


def children_of(pid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(name))
    return found


def argv_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


class Node:
    """A private tmux server started the incident's way, with its decoys, and the job's files."""

    def __init__(self, venv, work, ckpt_every=0, save_seconds=0.0, ignore=False, shutdown_timeout=30):
        self.work = work
        self.ckpt = os.path.join(work, "ckpt")
        self.gpu = os.path.join(work, "gpu")
        os.makedirs(self.gpu)
        for index in range(2):
            open(os.path.join(self.gpu, "nvidia%d" % index), "w").close()  # the ranks hold these as CUDA ranks hold /dev/nvidiaN
        self.tmux = Tmux(work)
        command = ("env TORCH_ELASTIC_SHUTDOWN_TIMEOUT=%d %s/bin/torchrun --standalone --nproc_per_node=2 %s "
                   "--ckpt-dir %s --hold %s/nvidia%%d --step-sleep 0.1 --num-workers 2 --ckpt-every %d "
                   "--save-seconds %s%s" % (shutdown_timeout, venv, TRAIN, self.ckpt, self.gpu, ckpt_every,
                                            save_seconds, " --ignore-signals" if ignore else ""))
        # the job's session starts the server: the server's argv is this whole tmux new-session command line
        self.tmux.run("new-session", "-d", "-s", "dflash", "-x", "200", "-y", "50", command)
        self.server = int(self.tmux.run("display-message", "-p", "#{pid}").stdout.strip())
        self.tmux.new_session("dflash-eval", "less %s" % TRAIN)
        self.tmux.new_session("shell", "bash --norc -i")
        self.daemon = Decoy(work, "networkd-dispatcher", ["--run-startup-triggers"])
        self.agent = self.tmux.pane_pids("dflash")[0]
        self.others = {name: self.tmux.pane_pids(name)[0] for name in ("dflash-eval", "shell")}
        wait_for(lambda: self.step() >= 5, 120, what="the torchrun job's 5th step line in the pane", interval=0.02)
        self.ranks = children_of(self.agent)
        self.workers = [w for rank in self.ranks for w in children_of(rank)]

    def step(self):
        pane = self.tmux.run("capture-pane", "-p", "-t", "=dflash:", check=False).stdout
        steps = [int(word) for line in pane.splitlines()
                 if line.startswith("step ") for word in line.split()[1:2] if word.isdigit()]
        return steps[-1] if steps else 0

    def job(self):
        return [self.agent] + self.ranks + self.workers

    def selection(self, **extra):
        args = {"tmux_session": "dflash", "tmux_socket": self.tmux.socket, "match": ROLE_MATCH,
                "gpu_devices": [os.path.join(self.gpu, "nvidia*")], "lock_dir": os.path.join(self.work, "locks")}
        args.update(extra)
        return args

    def checkpoints(self):
        return sorted(name for name in os.listdir(self.ckpt) if name.endswith(".pt")) if os.path.isdir(self.ckpt) else []

    def assert_untouched(self):
        """No other session, the tmux server, nor a decoy was signalled."""
        assert alive(self.server), "the tmux server was killed"
        assert self.daemon.untouched(), self.daemon.signals()
        for name, pid in self.others.items():
            assert alive(pid) and self.tmux.pane_pids(name) == [pid], "session %s was touched" % name

    def cleanup(self):
        for pid in self.job():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.daemon.cleanup()
        for pid in self.others.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.tmux.kill_server()


@pytest.fixture
def node(venv, tmp_path):
    if not have_tmux():
        pytest.skip("tmux is not installed")
    made = []

    def make(**kwargs):
        made.append(Node(venv, str(tmp_path / ("n%d" % len(made))), **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.cleanup()


def loaded_step(venv, path):
    """torch.load the checkpoint in the venv (a torn file would not load): its step."""
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                           "import sys, torch; print(torch.load(sys.argv[1])['step'])", path],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_role_match_on_a_tmux_new_session_torchrun_stops_the_job_by_ctrl_c_and_nothing_else(node, venv):
    """Defect 1: the server's argv is `tmux new-session ... torchrun ...`; it must never be the job's root."""
    job = node(save_seconds=1.0, shutdown_timeout=3)
    assert "torchrun" in " ".join(argv_of(job.server))  # the server really keeps the job's command line
    plan = run_module("training_stop", job.selection(ladder=[{"signal": "INT", "via": "tmux", "timeout": 20},
                                                             {"signal": "TERM", "timeout": 5}, {"signal": "KILL", "timeout": 5}]),
                      check_mode=True)
    selected = {entry["pid"] for entry in plan["selected"]}
    assert set(job.job()) <= selected, plan  # agent, ranks in their own sessions, DataLoader workers
    assert job.server not in selected and not selected & set(job.others.values()), plan
    # the pre-fix role regex, unanchored, hits the server too: it is left out, saying why
    old = run_module("training_stop", job.selection(match=r"(^|[/\s])torchrun(\s|$)"), check_mode=True)
    assert {entry["pid"] for entry in old["selected"]} == selected, old
    assert {entry["pid"]: entry["why"] for entry in old["left_out"]}[job.server].startswith("a tmux server")
    result = run_module("training_stop", job.selection(ladder=[{"signal": "INT", "via": "tmux", "timeout": 20},
                                                               {"signal": "TERM", "timeout": 5}, {"signal": "KILL", "timeout": 5}]))
    assert result["rc"] == 0 and result["stopped_by"] == "SIGINT via tmux", result
    assert len(result["rungs"]) == 1 and len(result["rungs"][0]["targets"]) == 1  # one pane, one Ctrl-C
    assert not any(alive(pid) for pid in job.job())
    job.assert_untouched()
    final = job.checkpoints()[-1]
    assert loaded_step(venv, os.path.join(job.ckpt, final)) == int(final[5:11])
    assert result["gpu_holders"] == [] and result["previous"] is None


def test_orphaned_ranks_after_the_agent_is_killed_are_named_then_stopped(node, venv):
    """Defect 2: kill -9 the agent; its ranks train on with the pane closed and match no launcher regex."""
    job = node()
    os.kill(job.agent, signal.SIGKILL)
    wait_for(lambda: "dflash" not in job.tmux.run("list-sessions", "-F", "#{session_name}").stdout.split(), 10,
             what="the dflash pane to close", interval=0.02)
    progress = os.path.getmtime(job.ckpt) if os.path.isdir(job.ckpt) else 0
    assert all(alive(pid) for pid in job.ranks), "the ranks outlive their agent"

    named = run_module("training_stop", job.selection(ladder=[{"signal": "INT", "via": "tmux", "timeout": 20},
                                                              {"signal": "TERM", "timeout": 5}, {"signal": "KILL", "timeout": 5}]))
    assert named["rc"] != 0 and named["selected"] == [] and not named["changed"], named
    assert "orphaned ranks" in named["msg"] and "Nothing was signalled" in named["msg"]
    assert set(job.ranks) <= {holder["pid"] for holder in named["gpu_holders"]}
    assert all(alive(pid) for pid in job.ranks + job.workers)

    stopped = run_module("training_stop", job.selection(gpu_holders="stop", ladder=[
        {"signal": "INT", "via": "tmux", "timeout": 20}, {"signal": "TERM", "timeout": 5}, {"signal": "KILL", "timeout": 5}]))
    assert stopped["rc"] == 0, stopped
    assert {entry["pid"] for entry in stopped["selected"] if entry["how"] == "gpu_holder"} >= set(job.ranks)
    # no pane to type into: the ranks got SIGINT to their process groups, as torchrun would have forwarded it
    assert stopped["stopped_by"] == "SIGINT" and "no tmux pane" in stopped["rungs"][0]["errors"][-1]
    assert not any(alive(pid) for pid in job.ranks + job.workers) and stopped["gpu_holders"] == []
    final = job.checkpoints()[-1]
    assert loaded_step(venv, os.path.join(job.ckpt, final)) == int(final[5:11]) and os.path.getmtime(job.ckpt) > progress
    job.assert_untouched()


def test_a_signal_ignoring_periodic_checkpointer_reaches_sigkill_within_the_rungs(node):
    """Defect 3: it ignores SIGTERM and checkpoints every 0.5 s; its step counter advances: no grace at all."""
    job = node(ckpt_every=5, ignore=True, shutdown_timeout=120)
    result = run_module("training_stop", job.selection(progress_paths=[job.ckpt], progress_stall=3, max_grace=120, ladder=[
        {"signal": "TERM", "timeout": 3}, {"signal": "KILL", "timeout": 5}]))
    assert result["rc"] == 0 and result["stopped_by"] == "SIGKILL", result
    first = result["rungs"][0]
    assert first["training"] and first["extended_by"] == 0 and first["steps"][1] - first["steps"][0] > 1, first
    assert not any(alive(pid) for pid in job.job())
    job.assert_untouched()


def test_a_real_save_started_after_ctrl_c_is_not_cut_short(node, venv):
    """Rank 0's save takes 5 s after Ctrl-C; the rung given as 2 s outlasts torchrun's own teardown instead."""
    job = node(save_seconds=5.0, shutdown_timeout=10)
    before = job.checkpoints()
    result = run_module("training_stop", job.selection(progress_paths=[job.ckpt], progress_stall=2, ladder=[
        {"signal": "INT", "via": "tmux", "timeout": 2}, {"signal": "TERM", "timeout": 2}, {"signal": "KILL", "timeout": 5}]))
    assert result["rc"] == 0 and result["stopped_by"] == "SIGINT via tmux", result
    assert any("lengthened from 2s to 15s" in note for note in result["notes"]), result["notes"]
    assert result["rungs"][0]["waited"] > 4  # the save's own duration, not cut at 2 s
    saved = [name for name in job.checkpoints() if name not in before]
    assert len(saved) == 1 and loaded_step(venv, os.path.join(job.ckpt, saved[0])) == int(saved[0][5:11])
    assert not [name for name in os.listdir(job.ckpt) if name.endswith(".tmp")]
    job.assert_untouched()


def test_a_second_run_waits_or_fails_naming_the_first_and_reports_its_outcome(node):
    """Defect 4: the first ladder (the playbook that started it killed) is still climbing when a re-run comes."""
    job = node(ignore=True, shutdown_timeout=120)
    args = job.selection(ladder=[{"signal": "TERM", "timeout": 6}, {"signal": "KILL", "timeout": 5}])
    first = subprocess.Popen(module_command("training_stop", args), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=module_env(), cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        locks = os.path.join(job.work, "locks")
        wait_for(lambda: any(name.endswith(".json") and json.load(open(os.path.join(locks, name))).get("state") == "running"
                             for name in os.listdir(locks)) if os.path.isdir(locks) else False, 30,
                 what="the first ladder to start", interval=0.02)
        refused = run_module("training_stop", dict(args, lock_timeout=0.5))
        assert refused["rc"] != 0 and "another ladder is still running" in refused["msg"], refused
        assert "training_stop pid %d" % first.pid in refused["msg"] and "Nothing was signalled" in refused["msg"]
        waited = run_module("training_stop", dict(args, lock_timeout=60))
        out, _err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    first_result = json.loads(out)
    assert first_result["stopped_by"] == "SIGKILL", first_result
    assert waited["rc"] == 0 and waited["lock_waited"] > 0 and waited["selected"] == [], waited
    assert waited["stopped_by"] is None and not waited["changed"]  # it never credits itself with the first's work
    previous = waited["previous"]
    assert previous["pid"] == first.pid and previous["state"] == "done" and previous["stopped_by"] == "SIGKILL"
    assert any("waited" in note and "training_stop pid %d" % first.pid in note for note in waited["notes"])
    assert any("stopped the job with SIGKILL" in note for note in waited["notes"])
    job.assert_untouched()


def test_a_ladder_killed_part_way_is_reported_as_interrupted(node):
    """kill -9 the module itself mid-ladder: the kernel drops its lock; the next run says what happened."""
    job = node(ignore=True, shutdown_timeout=120)
    args = job.selection(ladder=[{"signal": "TERM", "timeout": 30}, {"signal": "KILL", "timeout": 5}])
    first = subprocess.Popen(module_command("training_stop", args),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=module_env(), cwd=ROOT,
                             stdin=subprocess.DEVNULL)
    locks = os.path.join(job.work, "locks")
    wait_for(lambda: any(name.endswith(".json") for name in os.listdir(locks)) if os.path.isdir(locks) else False, 30,
             what="the first ladder to start", interval=0.02)
    first.kill()
    first.wait()
    result = run_module("training_stop", dict(args, ladder=[{"signal": "TERM", "timeout": 2}, {"signal": "KILL", "timeout": 5}],
                                              lock_timeout=5))
    assert result["rc"] == 0 and result["stopped_by"] == "SIGKILL" and result["lock_waited"] < 5, result
    assert result["previous"]["state"] == "interrupted" and result["previous"]["pid"] == first.pid
    job.assert_untouched()
