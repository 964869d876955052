"""training_stop end to end on this host: the real module (own process), real trainer trees, real tmux, real decoys.

Short rung timeouts keep each test at a second or two; assertions are about which
rung ended the job, what was signalled and what survived, never about speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from trainer_harness import (
    PYTHON,
    TRAINER,
    ZOMBIE_LEADER,
    Decoy,
    Tmux,
    Trainer,
    alive,
    cmdline,
    have_tmux,
    latest_checkpoint,
    pids_with,
    read_stat,
)

from tests.support.module import run_module
from tests.support.playbook import run_playbook
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.processes]

SHORT = [{"signal": "SIGINT", "timeout": 5}, {"signal": "SIGTERM", "timeout": 2}, {"signal": "SIGKILL", "timeout": 5}]
QUICK = [{"signal": "SIGINT", "timeout": 0.5}, {"signal": "SIGTERM", "timeout": 2}, {"signal": "SIGKILL", "timeout": 5}]


@pytest.fixture(scope="module")
def decoys(tmp_path_factory):
    """What the incident's `grep python` also counted: never to be signalled by any test here."""
    if not have_tmux():
        pytest.skip("tmux is not installed")
    work = str(tmp_path_factory.mktemp("decoys"))
    daemon = Decoy(work, "networkd-dispatcher", ["--run-startup-triggers"])
    editor = Decoy(work, "vim", [TRAINER])
    tmux = Tmux(work)
    record = os.path.join(work, "tmux-decoy.signals")
    tmux.new_session("dflash-eval", "%s %s/networkd-dispatcher --eval --record %s" % (PYTHON, work, record))
    wait_for(lambda: os.path.exists(record), 10, what="tmux decoy up", interval=0.02)
    pane_decoy = tmux.pane_pids("dflash-eval")[0]
    yield {"daemon": daemon, "editor": editor, "tmux": tmux, "pane": pane_decoy, "record": record}
    for decoy in (daemon, editor):
        decoy.cleanup()
    try:
        os.kill(pane_decoy, signal.SIGKILL)  # it ignores the SIGHUP kill-server sends
    except ProcessLookupError:
        pass
    tmux.kill_server()


@pytest.fixture
def untouched(decoys):
    yield
    assert decoys["daemon"].untouched(), decoys["daemon"].signals()
    assert decoys["editor"].untouched(), decoys["editor"].signals()
    assert alive(decoys["pane"]) and open(decoys["record"]).read().split() == ["up"]


@pytest.fixture
def job(tmp_path, untouched):
    started = []

    def make(behaviour, start=True, **kwargs):
        trainer = Trainer(str(tmp_path / ("job%d" % len(started))), behaviour, **kwargs)
        os.makedirs(trainer.workdir)
        started.append(trainer)
        return trainer.start() if start else trainer

    yield make
    for trainer in started:
        trainer.cleanup()


def pids_of(result):
    return sorted(entry["pid"] for entry in result["selected"])


def test_graceful_stops_on_the_first_rung_with_checkpoint(job):
    trainer = job("graceful", nproc=3)
    expected = sorted(pid for pid, _start in trainer.identities())
    result = run_module("training_stop", {"match": trainer.regex, "ladder": SHORT})
    assert result["rc"] == 0, result
    assert result["changed"] is True and result["stopped_by"] == "SIGINT" and result["stopped_by_index"] == 0
    assert pids_of(result) == expected and result["survivors"] == [] and result["unkillable"] == []
    assert result["rungs"][0]["targets"] == [trainer.proc.pid]  # Ctrl-C semantics: the launcher only
    assert result["selected"][0]["pid"] == trainer.proc.pid and result["selected"][0]["depth"] == 0
    assert {e["how"] for e in result["selected"]} == {"match"} and result["pidfd"] is True
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682
    assert trainer.proc.wait(timeout=5) == 0
    again = run_module("training_stop", {"match": trainer.regex, "ladder": SHORT})
    assert again["rc"] == 0 and again["changed"] is False and again["selected"] == [] and again["rungs"] == []


def test_stubborn_only_sigkill_ends_it_and_last_checkpoint_survives(job):
    trainer = job("stubborn", extra=["--ckpt-every", "1"])
    wait_for(lambda: latest_checkpoint(trainer.ckpt_dir), 10, what="a periodic checkpoint", interval=0.02)
    result = run_module("training_stop", {"match": trainer.regex, "ladder": [
        {"signal": "INT", "timeout": 0.5}, {"signal": "TERM", "timeout": 0.5}, {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGKILL" and [r["remaining"] for r in result["rungs"]] == [3, 3, 0]
    assert not pids_with(trainer.ckpt_dir)
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682  # what was saved before stays intact


def test_orphans_reparented_workers_caught_by_sigterm(job):
    trainer = job("orphans", nproc=3)
    workers = trainer.workers()
    result = run_module("training_stop", {"pids": [trainer.proc.pid], "ladder": QUICK})
    assert result["rc"] == 0, result
    assert result["rungs"][0]["targets"] == [trainer.proc.pid] and result["rungs"][0]["exited"] == [trainer.proc.pid]
    assert result["stopped_by"] == "SIGTERM"
    assert sorted(result["rungs"][1]["targets"]) == sorted(workers)
    assert {e["how"] for e in result["selected"] if e["pid"] in workers} == {"child"}
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_respawn_launcher_signalled_first_restarts_nothing(job):
    trainer = job("respawn", nproc=3)
    result = run_module("training_stop", {"match": trainer.regex, "ladder": QUICK})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGTERM"
    assert result["rungs"][1]["targets"][0] == trainer.proc.pid  # before its workers
    assert trainer.restarts() == [] and result["late_children"] == []
    assert not pids_with(trainer.ckpt_dir)
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_slow_checkpoint_not_killed_while_it_grows(job):
    trainer = job("slow_checkpoint", extra=["--checkpoint-seconds", "2.5"])
    result = run_module("training_stop", {
        "match": trainer.regex, "progress_paths": [trainer.ckpt_dir], "progress_stall": 1,
        "ladder": [{"signal": "INT", "timeout": 0.5}, {"signal": "TERM", "timeout": 0.5},
                   {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGINT" and result["rungs"][0]["extended_by"] > 0
    path, step = latest_checkpoint(trainer.ckpt_dir)
    assert step >= 682 and not [n for n in os.listdir(trainer.ckpt_dir) if n.endswith(".tmp")]


def test_slow_checkpoint_without_progress_paths_is_cut_short(job):
    """The contrast: the same ladder without progress_paths kills mid-save; `latest` still never names a torn file."""
    trainer = job("slow_checkpoint", extra=["--checkpoint-seconds", "2.5"])
    result = run_module("training_stop", {"match": trainer.regex, "ladder": [
        {"signal": "INT", "timeout": 0.5}, {"signal": "TERM", "timeout": 0.5}, {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0 and result["stopped_by"] == "SIGKILL"
    assert latest_checkpoint(trainer.ckpt_dir) is None  # the 2.5 s save never finished; no torn file is named


def test_sigstopped_job_is_continued_and_stops_gracefully(job):
    trainer = job("graceful")
    for pid, _start in trainer.identities():
        os.kill(pid, signal.SIGSTOP)
    result = run_module("training_stop", {"match": trainer.regex, "ladder": SHORT})
    assert result["rc"] == 0 and result["stopped_by"] == "SIGINT", result
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_check_mode_reports_plan_and_signals_nothing(job):
    trainer = job("graceful")
    before = trainer.identities()
    result = run_module("training_stop", {"match": trainer.regex}, check_mode=True, diff=True)
    assert result["rc"] == 0 and result["changed"] is True and result["rungs"] == []
    assert result["plan"] == ["SIGINT to the launcher, wait 45s", "SIGTERM to every process, wait 30s",
                              "SIGKILL to every process, wait 10s"]
    assert pids_of(result) == sorted(p for p, _start in before)
    assert str(trainer.proc.pid) in result["diff"]["before"] and result["diff"]["after"] == ""
    assert all(alive(pid, start) for pid, start in before) and "got SIG" not in trainer.log()


def test_diff_shows_before_and_after(job):
    trainer = job("graceful")
    result = run_module("training_stop", {"match": trainer.regex, "ladder": SHORT}, diff=True)
    assert result["rc"] == 0
    assert result["diff"]["before"].count("fake_trainer.py") == 3 and result["diff"]["after"] == ""


def test_broad_match_refused_lists_hits_and_signals_nothing(job, decoys):
    trainer = job("graceful")
    before = trainer.identities()
    result = run_module("training_stop", {"match": "python", "ladder": SHORT})
    assert result["rc"] == 1 and result["msg"].startswith("match hits ")
    assert "networkd-dispatcher" in result["msg"] and "allow_broad_match" in result["msg"]
    editor = run_module("training_stop", {"match": r"fake_trainer\.py", "ladder": SHORT})
    assert editor["rc"] == 1 and "program vim" not in editor["msg"] and "/vim " in editor["msg"]
    assert all(alive(pid, start) for pid, start in before) and "got SIG" not in trainer.log()
    # the fix the message suggests (a regex with a unique argument) works
    fixed = run_module("training_stop", {"match": trainer.regex, "exclude": [r"/vim "], "ladder": SHORT})
    assert fixed["rc"] == 0 and fixed["stopped_by"] == "SIGINT"


BAD = [
    ({"match": "(unclosed"}, "match: '(unclosed' is not a valid regular expression"),
    ({"match": "X", "exclude": ["[z-a]"]}, "exclude: '[z-a]' is not a valid regular expression"),
    ({"match": "X", "ladder": [{"signal": "SIGFOO", "timeout": 1}]}, "ladder[0].signal: unknown signal 'SIGFOO'"),
    ({"match": "X", "ladder": [{"signal": "INT", "timeout": -3}]}, "ladder[0].timeout: timeout must be a finite number of seconds >= 0"),
    ({"match": "X", "ladder": []}, "ladder: must be a non-empty list"),
    ({"match": "X", "kill_timeout": -1}, "kill_timeout: must be a finite number of seconds >= 0"),
    ({"match": "X", "max_grace": -1}, "max_grace: must be a finite number"),
    ({"pids": [0]}, "pids: 0 is not a PID"),
    ({"pids": [1]}, "pids: 1 is PID 1 and is never signalled"),
    ({"pid_file": "{dir}"}, "pid_file: cannot read {dir}"),
    ({"pid_file": "{garbage}"}, "pid_file: {garbage} must hold one positive PID"),
    ({"ladder": SHORT}, "one of the following is required: pids, pid_file, match, tmux_session, container"),
    ({"match": "X", "ladder": [{"signal": "INT", "timeout": 1, "via": "tmux"}]}, "needs tmux_session"),
    ({"tmux_session": "dflash", "container": 200}, "mutually exclusive"),
    ({"match": "X", "container": 5}, "container: 5 is not a Proxmox VMID"),
]


def test_every_bad_input_names_the_option_and_signals_nothing(job, tmp_path):
    trainer = job("graceful")
    before = trainer.identities()
    garbage = tmp_path / "garbage.pid"
    garbage.write_text("not a pid\n")
    for args, message in BAD:
        args = json.loads(json.dumps(args).replace("{dir}", str(tmp_path)).replace("{garbage}", str(garbage)))
        if "match" in args:
            args["match"] = args["match"].replace("X", trainer.regex)
        result = run_module("training_stop", args)
        message = message.replace("{dir}", str(tmp_path)).replace("{garbage}", str(garbage))
        assert result["rc"] == 1 and message in result["msg"], (args, result["msg"])
        assert result.get("rungs", []) == []
    assert all(alive(pid, start) for pid, start in before) and "got SIG" not in trainer.log()


def test_pid_file_selects_and_detects_reuse(job, tmp_path):
    trainer = job("graceful")
    pid_file = tmp_path / "launcher.pid"
    pid_file.write_text("%d\n" % trainer.proc.pid)
    old = time.time() - 86400
    os.utime(pid_file, (old, old))  # written a day ago: the process holding this PID now started later
    reused = run_module("training_stop", {"pid_file": str(pid_file), "ladder": SHORT})
    assert reused["rc"] == 0 and reused["changed"] is False and "PID reused" in reused["notes"][0]
    pid_file.write_text("%d\n" % trainer.proc.pid)
    result = run_module("training_stop", {"pid_file": str(pid_file), "ladder": SHORT})
    assert result["rc"] == 0 and result["stopped_by"] == "SIGINT" and result["selected"][0]["how"] == "pid_file"
    missing = run_module("training_stop", {"pid_file": str(tmp_path / "gone.pid"), "ladder": SHORT})
    assert missing["rc"] == 0 and missing["changed"] is False and "does not exist" in missing["notes"][0]


def test_without_sigkill_survivors_fail_the_module(job):
    trainer = job("stubborn")
    result = run_module("training_stop", {"match": trainer.regex, "ladder": [{"signal": "TERM", "timeout": 0.3}]})
    assert result["rc"] == 1 and "still running" in result["msg"] and len(result["survivors"]) == 3
    assert result["unkillable"] == [] and all(alive(pid) for pid in result["survivors"])


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="SYS_exit number is for x86_64")
def test_zombie_leader_with_live_thread_is_selected_and_not_taken_for_gone(tmp_path, untouched):
    marker = str(tmp_path / "zombie-leader-marker")
    child = subprocess.Popen([PYTHON, "-c", ZOMBIE_LEADER, marker], start_new_session=True)
    try:
        wait_for(lambda: read_stat(child.pid)[0] == "Z", 10, what="leader thread exit", interval=0.02)
        result = run_module("training_stop", {"match": marker, "ladder": [{"signal": "INT", "timeout": 0.3},
                                                                          {"signal": "TERM", "timeout": 5}, {"signal": "KILL", "timeout": 5}]})
        assert result["rc"] == 0, result
        assert pids_of(result) == [child.pid] and marker in result["selected"][0]["cmdline"]
        assert result["rungs"][0]["remaining"] == 1 and result["stopped_by"] == "SIGTERM"
        assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_process_it_may_not_signal_is_reported_and_fails_bounded(untouched):
    """The module without CAP_KILL against another user's process: EPERM on every rung, reported, bounded."""
    victim = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "300"])
    try:
        wait_for(lambda: "sleep" in cmdline(victim.pid), 10, what="victim exec", interval=0.02)
        result = run_module("training_stop", {"pids": [victim.pid], "kill_timeout": 0.3, "ladder": [
            {"signal": "TERM", "timeout": 0.2}, {"signal": "KILL", "timeout": 5}]},
            prefix=["setpriv", "--bounding-set=-kill", "--inh-caps=-kill"])
        assert result["rc"] == 1 and "could not be signalled" in result["msg"] and "become" in result["msg"]
        assert [r["signal"] for r in result["rungs"]] == ["SIGTERM", "SIGKILL"]
        assert all("not permitted" in r["errors"][0] for r in result["rungs"])
        assert result["rungs"][1]["timeout"] == 0.3  # a SIGKILL rung waits at most kill_timeout
        entry = result["unkillable"][0]
        assert entry["pid"] == victim.pid and entry["state"] in ("S", "R") and "wchan" in entry and entry["error"]
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


# ---------------------------------------------------------------- tmux

@pytest.fixture
def tmux_job(job, decoys):
    def make(behaviour, typed=False, **kwargs):
        trainer = job(behaviour, start=False, **kwargs)
        command = " ".join(trainer.argv) + " > %s 2>&1" % trainer.log_path
        if typed:
            # as the operator did: a shell in the pane, the command typed at its prompt
            decoys["tmux"].new_session("dflash", "bash --norc -i")
            decoys["tmux"].run("send-keys", "-t", "=dflash:", "-l", command)
            decoys["tmux"].run("send-keys", "-t", "=dflash:", "Enter")
        else:
            decoys["tmux"].new_session("dflash", command)
        trainer.wait_ready()
        return trainer

    yield make
    decoys["tmux"].run("kill-session", "-t", "=dflash", check=False)


def test_tmux_ctrl_c_stops_graceful_and_spares_the_other_session(tmux_job, decoys):
    trainer = tmux_job("graceful")
    result = run_module("training_stop", {"tmux_session": "dflash", "tmux_socket": decoys["tmux"].socket, "ladder": [
        {"signal": "INT", "timeout": 5, "via": "tmux"}, {"signal": "TERM", "timeout": 2}, {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGINT via tmux" and len(result["rungs"][0]["targets"]) == 1
    assert result["selected"][0]["how"] == "tmux_session"
    assert decoys["pane"] not in pids_of(result)
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_tmux_typed_at_a_shell_prompt_stops_job_keeps_shell(tmux_job, decoys):
    trainer = tmux_job("graceful", typed=True)
    shell = decoys["tmux"].pane_pids("dflash")[0]
    launcher = trainer.launcher()
    result = run_module("training_stop", {"tmux_session": "dflash", "tmux_socket": decoys["tmux"].socket, "ladder": [
        {"signal": "INT", "timeout": 5, "via": "tmux"}, {"signal": "TERM", "timeout": 2}, {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGINT via tmux" and shell not in pids_of(result)
    assert result["selected"][0]["pid"] == launcher and result["selected"][0]["how"] == "tmux_session"
    assert alive(shell) and decoys["tmux"].pane_pids("dflash") == [shell]
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


def test_tmux_typed_stubborn_escalates_to_sigkill_and_the_shell_and_pane_stay(tmux_job, decoys):
    """What roles/stop_training used to do itself (pane shells' children as pids, shells excluded), done by the module."""
    trainer = tmux_job("stubborn", typed=True)
    shell = decoys["tmux"].pane_pids("dflash")[0]
    args = {"tmux_session": "dflash", "tmux_socket": decoys["tmux"].socket, "ladder": [
        {"signal": "INT", "timeout": 0.5, "via": "tmux"}, {"signal": "TERM", "timeout": 0.5}, {"signal": "KILL", "timeout": 5}]}
    plan = run_module("training_stop", args, check_mode=True)
    assert plan["rc"] == 0 and shell not in pids_of(plan) and len(plan["selected"]) == 3, plan
    note = "its shell (pid %d) is left running; what runs in it is the job" % shell
    assert any(note in line for line in plan["notes"]), plan["notes"]
    result = run_module("training_stop", args)
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGKILL" and shell not in pids_of(result)
    # SIGTERM and SIGKILL went to every process of the job, never to the prompt's shell
    assert shell not in result["rungs"][1]["targets"] + result["rungs"][2]["targets"]
    assert not pids_with(trainer.ckpt_dir)
    assert alive(shell) and decoys["tmux"].pane_pids("dflash") == [shell]


def test_tmux_ctrl_c_is_not_trusted_stubborn_escalates(tmux_job, decoys):
    trainer = tmux_job("stubborn")
    result = run_module("training_stop", {"tmux_session": "dflash", "tmux_socket": decoys["tmux"].socket, "ladder": [
        {"signal": "INT", "timeout": 0.5, "via": "tmux"}, {"signal": "TERM", "timeout": 0.5}, {"signal": "KILL", "timeout": 5}]})
    assert result["rc"] == 0, result
    assert result["stopped_by"] == "SIGKILL" and result["rungs"][0]["remaining"] > 0
    assert not pids_with(trainer.ckpt_dir)


def test_missing_tmux_session_or_server_selects_nothing(decoys, tmp_path, untouched):
    result = run_module("training_stop", {"tmux_session": "dflash", "tmux_socket": decoys["tmux"].socket})
    assert result["rc"] == 0 and result["changed"] is False and result["selected"] == []
    assert "no tmux session 'dflash'" in result["notes"][0]
    no_server = run_module("training_stop", {"tmux_session": "dflash", "tmux_socket": str(tmp_path / "nothing.sock")})
    assert no_server["rc"] == 0 and no_server["changed"] is False and no_server["selected"] == []


# ---------------------------------------------------------------- through ansible itself

def test_through_ansible_playbook_check_then_run_then_idempotent(job, tmp_path):
    trainer = job("graceful")
    extra = {"it_match": trainer.regex, "it_ladder": SHORT, "ansible_python_interpreter": PYTHON}
    done = run_playbook("training_stop_localhost", "localhost,", [extra], args=["-c", "local"], timeout=120)
    assert done.rc == 0, done.output
    assert "changed=2" in done.stdout and "failed=0" in done.stdout
    assert latest_checkpoint(trainer.ckpt_dir)[1] >= 682


# ---------------------------------------------------------------- the launch record

def test_tmux_stop_writes_the_launch_record_without_secrets(job, decoys, tmp_path):
    """What restore_training starts again: argv, cwd, user, allow-listed env (no secret, whatever the list says),
    the last step line and the newest whole checkpoint; root-only, and kept by a re-run that stops nothing."""
    trainer = job("graceful", start=False, extra=["--ckpt-every", "2"])
    os.makedirs(trainer.ckpt_dir)
    tmux = decoys["tmux"]
    tmux.new_session("dflash", "bash --norc -i")
    secrets = "HF_TOKEN=hf_s3cret NCCL_IB_PASSWORD=p4ss MY_API_KEY=k3y WANDB_SECRET_THING=w4ndb"
    typed = "cd %s && export NCCL_DEBUG=INFO WANDB_PROJECT=dflash %s && %s" % (
        trainer.workdir, secrets, " ".join(trainer.argv))
    tmux.run("send-keys", "-t", "=dflash:", "-l", typed)
    tmux.run("send-keys", "-t", "=dflash:", "Enter")
    try:
        wait_for(lambda: any(n.endswith(".bin") for n in os.listdir(trainer.ckpt_dir)), 30, what="a checkpoint",
                 interval=0.02)
        # a save that died half-way, newer than every whole one: skipped by name
        with open(os.path.join(trainer.ckpt_dir, "ckpt-step009999.bin.tmp"), "wb") as handle:
            handle.write(b"torn")
        record_dir = str(tmp_path / "launch")
        args = {"tmux_session": "dflash", "tmux_socket": tmux.socket, "ladder": [
            {"signal": "INT", "timeout": 5, "via": "tmux"}, {"signal": "TERM", "timeout": 2}, {"signal": "KILL", "timeout": 5}],
            "progress_paths": [trainer.ckpt_dir], "checkpoint_patterns": ["ckpt-step*"],
            "record_dir": record_dir, "record_env": ["WANDB_*", "NCCL_IB_PASSWORD", "HF_*"]}
        assert not os.path.exists(record_dir)
        plan = run_module("training_stop", args, check_mode=True)
        assert plan["rc"] == 0 and plan["launch_record"] is None and not os.path.exists(record_dir), plan
        result = run_module("training_stop", args)
        assert result["rc"] == 0 and result["stopped_by"] == "SIGINT via tmux", result
        path = os.path.join(record_dir, "dflash.json")
        assert result["launch_record"]["path"] == path
        text = open(path).read()
        record = json.loads(text)
        assert record["argv"] == trainer.argv and record["cwd"] == trainer.workdir
        assert record["uid"] == os.getuid() and record["user"] and record["tmux_session"] == "dflash"
        assert record["env"]["NCCL_DEBUG"] == "INFO" and record["env"]["WANDB_PROJECT"] == "dflash"
        assert "PATH" in record["env"]
        for leaked in ("hf_s3cret", "p4ss", "k3y", "w4ndb", "HF_TOKEN", "NCCL_IB_PASSWORD", "MY_API_KEY"):
            assert leaked not in text, leaked
        # the pane's last line the step regex finds once the job is gone (here the shutdown save's)
        assert "step %d" % record["step"] in record["step_line"] and record["step"] >= 682
        newest = max(n for n in os.listdir(trainer.ckpt_dir) if n.endswith(".bin"))
        assert record["checkpoint"]["path"] == os.path.join(trainer.ckpt_dir, newest)
        assert record["checkpoint"]["whole"] is True and record["checkpoint"]["step"] == int(newest[9:15])
        assert [s["path"] for s in record["checkpoint_skipped"]] == [os.path.join(trainer.ckpt_dir, "ckpt-step009999.bin.tmp")]
        assert record["stopped_by"] == "SIGINT via tmux" and record["stopped_at"] > 0
        assert result["checkpoint"] == record["checkpoint"]
        assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(record_dir).st_mode & 0o777 == 0o700
        # nothing to stop now: the record stays as it is
        before = os.stat(path).st_mtime_ns
        again = run_module("training_stop", args)
        assert again["rc"] == 0 and again["selected"] == [] and again["launch_record"] is None, again
        assert os.stat(path).st_mtime_ns == before and again["checkpoint"] == record["checkpoint"]
    finally:
        tmux.run("kill-session", "-t", "=dflash", check=False)
