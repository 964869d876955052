"""Selection rules, table-driven over synthetic process tables (the rules are pure functions)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from trainer_harness import wait_exec

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    ProcessInfo,
    read_process,
    read_starttime,
    read_stat,
    read_tpgid,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import (
    SelectError,
    broad_match_reason,
    closure,
    compile_regex,
    is_interactive_shell,
    job_groups,
    late_children,
    parse_pid_file,
    program_of,
    select,
    started_after,
    top_of,
    torchrun_shutdown_timeout,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import (
    PANES_FORMAT,
    Pane,
    last_step,
    parse_panes,
    tmux_capture_argv,
    tmux_list_panes_argv,
)
from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

PVE_CT200 = "0::/lxc/200/ns/user.slice\n"
PVE_CT201 = "0::/lxc/201/ns/user.slice\n"
TRAIN = "/opt/lab/trainer/fake_trainer.py"


def proc(pid, ppid, cmd, pgid=None, sid=None, uid=0, cgroup="0::/user.slice\n", kthread=False, nspid=None):
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid or pid, sid=sid or pid, state="S", starttime=1000 + pid,
                       comm=cmd.split()[0].rsplit("/", 1)[-1][:15] if cmd else "kworker", cmdline=tuple(cmd.split()),
                       uid=uid, is_kernel_thread=kthread, cgroup=cgroup, nspid=nspid or (pid,))


def table(*procs):
    return {p.pid: p for p in procs}


# A box like the incident's: sshd -> bash (session 100) -> the launcher, 2 workers in their own sessions,
# plus a networkd-dispatcher-like daemon, an editor with the script open and a kernel thread.
BOX = table(
    proc(1, 0, "/sbin/init"),
    proc(2, 0, "", kthread=True),
    proc(50, 1, "/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers"),
    proc(90, 1, "sshd: root@pts/0", sid=90),
    proc(100, 90, "-bash", sid=100),
    proc(200, 100, "/usr/bin/python3 %s --behaviour graceful --nproc 2 --ckpt-dir /ck" % TRAIN, pgid=200, sid=100),
    proc(201, 200, "/usr/bin/python3 %s --worker --rank 0 --ckpt-dir /ck" % TRAIN),
    proc(202, 200, "/usr/bin/python3 %s --worker --rank 1 --ckpt-dir /ck" % TRAIN),
    proc(300, 100, "vim %s" % TRAIN, pgid=300, sid=100),
    proc(999, 100, "/usr/bin/python3 -m ansible.modules.training_stop", pgid=999, sid=100),
)


def run_select(tbl=BOX, self_pid=999, ancestors=(100, 90, 1), **kwargs):
    return select(table=tbl, self_pid=self_pid, ancestors=list(ancestors), **kwargs)


@pytest.mark.parametrize("cmd, program", [
    (["/usr/bin/python3", "-u", TRAIN, "--worker"], TRAIN),
    (["python3.11", "-W", "ignore", "train.py"], "train.py"),
    (["/usr/bin/python3", "/usr/bin/networkd-dispatcher", "--run-startup-triggers"], "/usr/bin/networkd-dispatcher"),
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node", "8", "train.py"], "-m torch.distributed.run"),
    (["vim", TRAIN], "vim"),
    (["/usr/bin/env", "FOO=1", "python3", "train.py"], "train.py"),
    (["bash", "-c", "sleep 1"], "-c "),
    ([], ""),
])
def test_program_of(cmd, program):
    assert program_of(cmd) == program


def test_closure_follows_ppid_and_led_groups_not_the_enclosing_session():
    members = closure({200: "pids"}, BOX, lambda info: True)
    assert sorted(members) == [200, 201, 202]  # not bash (100) nor the vim in bash's session
    assert members[200].depth == 0 and members[201].depth == 1 and members[201].how == "child"


def test_closure_keeps_reparented_descendants_through_their_led_session():
    # worker 201 forked a data loader (401) into its session, then the intermediate (400) died
    tbl = dict(BOX)
    tbl[401] = proc(401, 1, "/usr/bin/python3 dataloader", pgid=201, sid=201)
    members = closure({200: "pids"}, tbl, lambda info: True)
    assert members[401].how in ("group", "session")


def test_select_pids_never_includes_protected_or_excluded():
    sel = run_select(pids=[200], excludes=[re.compile(r"--rank 1\b")])
    assert sorted(sel.members) == [200, 201]
    with pytest.raises(SelectError, match="pids: 1 is PID 1"):
        run_select(pids=[1])
    with pytest.raises(SelectError, match="pids: 100 is this module's own process or one of its ancestors"):
        run_select(pids=[100])


def test_select_missing_pid_is_a_note_not_an_error():
    sel = run_select(pids=[4242])
    assert sel.members == {} and sel.notes == ["pids: 4242 is not running"]


def test_match_precise_selects_the_job():
    sel = run_select(match=re.compile(r"fake_trainer\.py .*--ckpt-dir /ck"))
    assert sel.refused == ""
    assert sorted(sel.members) == [200, 201, 202]
    assert {m.how for m in sel.members.values()} == {"match"}


@pytest.mark.parametrize("regex, hit_pids", [
    (r"python", [50, 200]),                 # networkd-dispatcher-like daemon
    (r"fake_trainer\.py", [200, 300]),     # the editor with the script open
])
def test_broad_match_refused_and_lists_what_it_would_hit(regex, hit_pids):
    sel = run_select(match=re.compile(regex))
    assert sel.refused.startswith("match hits 2 unrelated process groups")
    for pid in hit_pids:
        assert "pid %d " % pid in sel.refused
    assert "allow_broad_match" in sel.refused
    assert sel.refused == run_select(match=re.compile(regex)).refused  # deterministic


def test_broad_match_allowed_on_request():
    sel = run_select(match=re.compile("fake_trainer"), allow_broad_match=True)
    assert sel.refused == "" and 300 in sel.members and 200 in sel.members


def test_exclude_makes_a_broad_match_precise():
    sel = run_select(match=re.compile(r"fake_trainer\.py"), excludes=[re.compile(r"^vim ")])
    assert sel.refused == "" and sorted(sel.members) == [200, 201, 202]


def test_orphaned_workers_of_one_launcher_are_one_job():
    tbl = {pid: p for pid, p in BOX.items() if pid not in (200,)}
    tbl[201] = proc(201, 1, "/usr/bin/python3 %s --worker --rank 0 --ckpt-dir /ck" % TRAIN)
    tbl[202] = proc(202, 1, "/usr/bin/python3 %s --worker --rank 1 --ckpt-dir /ck" % TRAIN)
    sel = run_select(tbl, match=re.compile(r"--ckpt-dir /ck"))
    assert sel.refused == "" and sorted(sel.members) == [201, 202]
    assert top_of([201, 202], tbl) == [201, 202]


def test_two_runs_of_the_same_script_under_different_shells_are_refused():
    tbl = dict(BOX)
    tbl[500] = proc(500, 90, "-bash", sid=500)
    tbl[501] = proc(501, 500, "/usr/bin/python3 %s --ckpt-dir /other" % TRAIN, sid=500)
    sel = run_select(tbl, match=re.compile(r"fake_trainer\.py --"), excludes=[re.compile("^vim")])
    assert sel.refused.startswith("match hits 2 unrelated")


def test_job_groups_joins_by_ancestry_and_led_group():
    assert job_groups([200, 201, 202], BOX) == [[200, 201, 202]]
    assert job_groups([50, 201], BOX) == [[50], [201]]
    assert broad_match_reason([[200, 201, 202]], BOX) == ""


def test_self_and_ancestors_never_hit_by_match():
    # the module's own command line and the ansible process above it contain the regex too
    sel = run_select(match=re.compile("training_stop"))
    assert sel.members == {}


def test_kernel_threads_and_pid1_never_selected():
    sel = run_select(match=re.compile(".*"), allow_broad_match=True)
    assert 1 not in sel.members and 2 not in sel.members and 999 not in sel.members and 100 not in sel.members


def test_container_scope_and_container_init_protected():
    tbl = table(
        proc(1, 0, "/sbin/init"),
        proc(5000, 1, "/sbin/init", cgroup=PVE_CT200, nspid=(5000, 1)),
        proc(5005, 5000, "/lib/systemd/systemd-journald", cgroup=PVE_CT200, nspid=(5005, 30)),
        proc(5010, 5000, "tmux new -s dflash", cgroup=PVE_CT200, nspid=(5010, 40)),
        proc(5020, 5010, "/usr/bin/python3 %s --ckpt-dir /ck" % TRAIN, cgroup=PVE_CT200, nspid=(5020, 32244)),
        proc(6000, 1, "/sbin/init", cgroup=PVE_CT201, nspid=(6000, 1)),
        proc(6020, 6000, "/usr/bin/python3 %s --ckpt-dir /ck" % TRAIN, cgroup=PVE_CT201, nspid=(6020, 32244)),
    )
    sel = run_select(tbl, self_pid=77, ancestors=[1], match=re.compile(r"fake_trainer"), container=200)
    assert sel.refused == "" and sorted(sel.members) == [5020]
    alone = run_select(tbl, self_pid=77, ancestors=[1], container=200)
    assert 5000 not in alone.members and alone.refused  # journald, tmux + trainer: not one job
    everything = run_select(tbl, self_pid=77, ancestors=[1], container=200, allow_broad_match=True)
    assert sorted(everything.members) == [5005, 5010, 5020]
    with pytest.raises(SelectError, match="container's init"):
        run_select(tbl, self_pid=77, ancestors=[1], pids=[5000])


def test_tmux_pane_shell_is_left_alone_what_runs_in_it_is_the_job():
    sel = run_select(panes=[Pane("%0", 100)], self_pid=7777, ancestors=[1])
    # bash (100) is the pane's prompt: its children are the roots, the shell itself is never signalled
    assert 100 not in sel.members and {200, 201, 202, 300} <= set(sel.members)
    assert sel.members[200].how == "tmux_session" and sel.members[200].depth == 0
    assert "its shell (pid 100) is left running" in sel.notes[0]


def test_tmux_pane_running_a_command_is_the_job():
    tbl = dict(BOX)
    tbl[600] = proc(600, 1, "sh -c python3 %s --ckpt-dir /x" % TRAIN, sid=600)
    tbl[601] = proc(601, 600, "python3 %s --ckpt-dir /x" % TRAIN, sid=600, pgid=600)
    sel = run_select(tbl, panes=[Pane("%1", 600)], self_pid=7777, ancestors=[1])
    assert sorted(sel.members) == [600, 601] and sel.members[600].how == "tmux_session"


@pytest.mark.parametrize("cmd, shell", [
    (["-bash"], True), (["bash"], True), (["/bin/zsh", "-l"], True), (["bash", "--norc", "-i"], True),
    (["sh", "-c", "python3 x.py"], False), (["bash", "-lc", "x"], False), (["bash", "run.sh"], False),
    (["python3"], False), ([], False),
])
def test_is_interactive_shell(cmd, shell):
    assert is_interactive_shell(cmd) is shell


def test_parse_panes_exact_session_and_argv_and_a_dead_pane_marked():
    def row(pane_id, pid, dead, session, status="", window="train"):
        return "\t".join([pane_id, pid, dead, status, "0", "@1", "1", window, session])

    text = "\n".join([row("%0", "1234", "0", "dflash"), row("%1", "99", "0", "dflash-eval"), row("%3", "100", "0", "dflash"),
                      "garbage", row("%4", "x", "0", "dflash"), row("%5", "4321", "1", "dflash", status="2")])
    # %5 is dead (remain-on-exit): its PID may belong to an unrelated process by now, and tmux_panes leaves it out
    assert parse_panes(text, "dflash") == [Pane("%0", 1234, False, None, "@1", 1, "train"),
                                           Pane("%3", 100, False, None, "@1", 1, "train"),
                                           Pane("%5", 4321, True, 2, "@1", 1, "train")]
    assert parse_panes(text, "dfl") == []
    assert tmux_list_panes_argv("/tmp/s") == ["tmux", "-S", "/tmp/s", "list-panes", "-a", "-F", PANES_FORMAT]


@pytest.mark.parametrize("text, ok", [("32244\n", 32244), ("  7 ", 7), ("", None), ("abc", None), ("1 2", None), ("0", None)])
def test_parse_pid_file(text, ok):
    if ok is None:
        with pytest.raises(SelectError, match="pid_file: .* must hold one positive PID"):
            parse_pid_file(text)
    else:
        assert parse_pid_file(text) == ok


def test_compile_regex_names_the_option():
    with pytest.raises(SelectError, match=r"^match: '\(' is not a valid regular expression"):
        compile_regex("match", "(")


def test_late_children_only_born_after_the_snapshot_and_not_excluded():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "late-child-marker"])
    try:
        wait_exec(child.pid, "late-child-marker")
        ident = (child.pid, read_starttime(child.pid))
        found = [(child.pid, ident[1], os.getpgid(child.pid))]
        assert late_children(found, seen=set()) == found
        assert late_children(found, seen={ident}) == []  # it was there at snapshot time and left out
        assert late_children(found, seen=set(), excludes=[re.compile("late-child-marker")]) == []
        assert late_children([(child.pid, ident[1] + 1, 0)], seen=set()) == []  # not that process
    finally:
        child.kill()
        child.wait()


def test_started_after_and_read_tpgid_on_this_process(tmp_path):
    me = read_process(os.getpid())
    assert started_after(me, 0.0) and not started_after(me, time.time())
    assert read_tpgid(os.getpid()) == read_stat(os.getpid()).tpgid
    assert read_tpgid(2 ** 22 + 1) == 0  # no such process
    (tmp_path / "stat").write_text("cpu  1 2 3\n")
    with pytest.raises(SelectError, match="no btime"):
        started_after(me, 0.0, proc_root=str(tmp_path))


def test_tmux_nested_interactive_shells_are_left_alone_what_runs_in_them_is_the_job():
    # the pane's bash (100), then "bash" typed at its prompt (150), then the job typed in that one
    tbl = table(
        proc(1, 0, "/sbin/init"),
        proc(100, 1, "-bash", sid=100),
        proc(150, 100, "bash", pgid=150, sid=100),
        proc(200, 150, "/usr/bin/python3 %s --ckpt-dir /ck" % TRAIN, pgid=200, sid=100),
        proc(201, 200, "/usr/bin/python3 %s --worker --rank 0 --ckpt-dir /ck" % TRAIN),
        proc(400, 1, "bash", sid=400),  # a shell in another pane of another session: not this pane's
    )
    sel = run_select(tbl, panes=[Pane("%0", 100)], self_pid=7777, ancestors=[1])
    assert sorted(sel.members) == [200, 201] and sel.members[200].depth == 0
    assert "its shells (pids 100, 150) are left running; what runs in it is the job" in sel.notes[0]
    idle = run_select(tbl, panes=[Pane("%1", 400)], self_pid=7777, ancestors=[1])
    assert idle.members == {} and "its shell (pid 400) is left running; nothing runs in it" in idle.notes[0]


# The incident's node: a tmux server started by `tmux new-session -d -s dflash "torchrun ..."` keeps that
# command line; its panes: the job (dflash), a prompt with `less train.py` (dflash-eval), a pipe-pane `cat`.
SERVER_CMD = "tmux new-session -d -s dflash /venv/bin/torchrun --standalone --nproc_per_node=2 train.py"
RANK = "/venv/bin/python3 -u train.py --ckpt-dir /ck"
NODE = table(
    proc(1, 0, "/sbin/init"),
    proc(50, 1, "/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers"),
    ProcessInfo(pid=700, ppid=1, pgid=700, sid=700, state="S", starttime=1700, comm="tmux: server",
                cmdline=tuple(SERVER_CMD.split()), uid=0),
    proc(710, 700, "/venv/bin/python3 /venv/bin/torchrun --standalone --nproc_per_node=2 train.py", sid=710),
    proc(711, 710, RANK, sid=711),
    proc(712, 710, RANK, sid=712),
    proc(713, 711, RANK, pgid=711, sid=711),  # a DataLoader worker (forked: same command line)
    proc(720, 700, "-bash", sid=720),
    proc(721, 720, "less train.py", sid=720),
    proc(730, 700, "sh -c cat >> /tmp/dflash.log", sid=730),
    proc(731, 730, "cat", pgid=730, sid=730),
    proc(740, 1, "tmux attach -t dflash", sid=740),  # a client attached from a login: its argv names the session
    proc(999, 1, "/usr/bin/python3 -m ansible.modules.training_stop", sid=999),
)
OLD_ROLE_REGEX = r"(^|[/\s])torchrun(\s|$)|-m\s+torch\.distributed\.(run|launch)\b"


def _role_default_match():
    path = os.path.join(ROOT, "roles", "stop_training", "defaults", "main.yml")
    import yaml
    with open(path) as handle:
        return yaml.safe_load(handle)["stop_training_match"]


@pytest.mark.parametrize("regex, members, left_out", [
    # the pre-fix role regex hits the tmux server (an ancestor of the job): it is left out, not the job's root
    (OLD_ROLE_REGEX, [710, 711, 712, 713], {700: "a tmux server"}),
    (r"torchrun|attach -t dflash", [710, 711, 712, 713], {700: "a tmux server", 740: "a terminal multiplexer"}),
    (r"^-bash$|less", [721], {720: "an interactive shell"}),
    (r"train\.py", None, {700: "a tmux server"}),  # still refused: the job and `less train.py` are two jobs
])
def test_match_never_selects_tmux_servers_clients_or_prompts(regex, members, left_out):
    sel = run_select(NODE, ancestors=[1], match=re.compile(regex))
    assert sorted(sel.left_out) == sorted(left_out)
    for pid in left_out:
        assert sel.left_out[pid][0].startswith(left_out[pid])
        assert any(note.startswith("match: pid %d left out, %s" % (pid, left_out[pid])) for note in sel.notes)
        assert pid not in sel.members
    if members is None:
        assert sel.refused.startswith("match hits 2 unrelated") and "less train.py" in sel.refused
    else:
        assert sel.refused == "" and sorted(sel.members) == members
        assert 700 not in sel.members and 720 not in sel.members and 731 not in sel.members


def test_match_leaves_out_any_ancestor_of_a_pane_process():
    # a pane of tmux_session whose process sits under a wrapper that matches (`script -c torchrun ...`)
    tbl = dict(NODE)
    tbl[800] = proc(800, 1, "script -q -c torchrun-wrapper /tmp/typescript", sid=800)
    tbl[801] = proc(801, 800, "/venv/bin/torchrun --standalone train.py", sid=801)
    sel = run_select(tbl, ancestors=[1], match=re.compile("torchrun"), panes=[Pane("%9", 801)])
    assert sel.left_out[800][0] == "an ancestor of a tmux pane's process, not the job"
    assert 800 not in sel.members and 801 in sel.members


@pytest.mark.parametrize("cmd, hit", [
    ("/venv/bin/torchrun --standalone --nproc_per_node=4 train.py", True),
    ("torchrun --nnodes 1 train.py", True),
    ("/venv/bin/python3 /venv/bin/torchrun --standalone train.py", True),
    ("/usr/bin/python3.11 -u /opt/venv/bin/torchrun train.py", True),
    ("python3 -m torch.distributed.run --nproc-per-node 8 train.py", True),
    ("/venv/bin/python -u -m torch.distributed.launch train.py", True),
    (SERVER_CMD, False),                                  # the tmux server that started the session
    ("tmux attach -t torchrun", False),
    ("less /venv/bin/torchrun", False),
    ("vim torchrun", False),
    ("bash -c torchrun --standalone train.py", False),    # a wrapper shell: the pane's process, not the program
    ("/venv/bin/python3 -u train.py --ckpt-dir /ck", False),  # a rank: reached from the launcher, never a root
    ("/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers", False),
    ("python3 my_torchrun_notes.py", False),
])
def test_role_default_match_is_anchored_to_the_program_run(cmd, hit):
    assert bool(re.search(_role_default_match(), cmd)) is hit


@pytest.mark.parametrize("text, regex, step", [
    ("step 1 loss 2.3\nstep 2 loss 2.2\nstep 13 loss 2.0\n", r"\bstep\s+(\d+)", 13),
    ("[rank0] step 7\n[rank1] step 8\nsaving checkpoint\n", r"\bstep\s+\d+", 8),   # the role's regex: no group
    ("epoch 3 step=41 loss=0.1\n", r"step=(\d+)", 41),
    ("no steps here\n", r"\bstep\s+(\d+)", None),
    ("steps 5\n", r"\bstep\s+(\d+)", None),
])
def test_last_step_of_a_pane(text, regex, step):
    assert last_step(text, re.compile(regex)) == step
    assert tmux_capture_argv("%3", 50, "/tmp/s") == ["tmux", "-S", "/tmp/s", "capture-pane", "-p", "-J", "-t", "%3", "-S", "-50"]


@pytest.mark.parametrize("cmd, environ, timeout", [
    ("/venv/bin/python3 /venv/bin/torchrun --standalone --nproc_per_node=4 train.py", {}, 30.0),
    ("torchrun --standalone train.py", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 90.0),
    ("torchrun --shutdown-timeout 12 train.py --shutdown-timeout 99", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 12.0),
    ("torchrun --shutdown_timeout=7 train.py", {}, 7.0),
    ("torchrun train.py", {"PET_SHUTDOWN_TIMEOUT": "5", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 5.0),
    ("python3 -m torch.distributed.run --nproc-per-node 8 train.py", None, 30.0),  # environ not readable
    ("torchrun train.py", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, 30.0),
    ("/venv/bin/python3 -u train.py", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, None),  # a rank, not the agent
    ("tmux new-session -d -s dflash torchrun train.py", {}, None),
])
def test_torchrun_shutdown_timeout(cmd, environ, timeout):
    assert torchrun_shutdown_timeout(cmd.split(), environ) == timeout
