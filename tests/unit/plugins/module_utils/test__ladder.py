"""The ladder: rung parsing (table-driven) and the runner on real processes (pidfd and polling fallback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from trainer_harness import ZOMBIE_LEADER, read_stat

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    describe_process,
    files_open_for_writing,
    parse_fdinfo_flags,
    read_starttime,
    stat_children,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder import (
    LadderError,
    Rung,
    default_ladder,
    fit_to_torchrun,
    parse_ladder,
    parse_signal,
    run_ladder,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.process_set import (
    ProcessSet,
    launcher_targets,
    pidfd_supported,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.save_watch import Grace, progress_scan
from tests.support.wait import wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]

INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL
MODES = [pytest.param(True, id="pidfd"), pytest.param(False, id="polling")]


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("value, number", [
    ("SIGINT", INT), ("INT", INT), ("sigterm", TERM), ("term", TERM), (2, INT), ("9", KILL), (" SIGKILL ", KILL),
])
def test_parse_signal(value, number):
    assert parse_signal(value) == number


@pytest.mark.parametrize("value, message", [
    ("SIGFOO", "unknown signal 'SIGFOO'"), ("", "signal must be a name"), (None, "signal must be a name"),
    (True, "signal must be a name"), (999, "not a signal number"), ("SIGSTOP", "does not stop a process"),
    ("CONT", "does not stop a process"),
])
def test_parse_signal_rejects(value, message):
    with pytest.raises(LadderError, match=message):
        parse_signal(value)


def test_default_ladder():
    assert default_ladder(True, 10) == [Rung(INT, 45.0, "tmux", "launcher"), Rung(TERM, 30.0, None, "all"),
                                        Rung(KILL, 10, None, "all")]
    assert parse_ladder(None, tmux=False, kill_timeout=5)[0] == Rung(INT, 45.0, None, "launcher")
    assert default_ladder(True, 10, shutdown_timeout=120)[0] == Rung(INT, 180.0, "tmux", "launcher")


@pytest.mark.parametrize("shutdown, timeouts, fitted, noted", [
    (None, [10, 2, 5], [10, 2, 5], False),    # not torchrun: the ladder as given
    (30.0, [60, 30, 10], [60, 30, 10], False),  # the role's 60 s already outlasts torchrun's 30 s
    (30.0, [10, 30, 10], [45, 30, 10], True),   # Ctrl-C rung shorter than torchrun's own teardown
    (2.0, [1, 2, 5], [7, 2, 5], True),          # TORCH_ELASTIC_SHUTDOWN_TIMEOUT=2: at least 5 s more
])
def test_fit_to_torchrun_lengthens_only_a_short_ctrl_c_rung(shutdown, timeouts, fitted, noted):
    rungs = [Rung(INT, timeouts[0], "tmux", "launcher"), Rung(TERM, timeouts[1]), Rung(KILL, timeouts[2])]
    out, notes = fit_to_torchrun(rungs, shutdown)
    assert [r.timeout for r in out] == fitted and [r.signal for r in out] == [INT, TERM, KILL]
    assert bool(notes) is noted and (not noted or "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in notes[0])


def test_parse_ladder_defaults_to_and_caps_kill():
    rungs = parse_ladder([{"signal": "INT", "timeout": 5}, {"signal": 15, "timeout": "2.5"},
                          {"signal": "KILL", "timeout": 60}], tmux=False, kill_timeout=7)
    assert [(r.signal, r.timeout, r.to) for r in rungs] == [(INT, 5, "launcher"), (TERM, 2.5, "all"), (KILL, 7, "all")]
    # (a second SIGINT rung, which this test also had, is refused since issue 11: see the error table)
    rungs = parse_ladder([{"signal": "INT", "timeout": 1, "to": "all"}], tmux=False, kill_timeout=7)
    assert [(r.signal, r.timeout, r.to) for r in rungs] == [(INT, 1, "all")]


@pytest.mark.parametrize("raw, tmux, message", [
    ([{"signal": "INT", "timeout": 60, "via": "tmux"}, {"signal": "INT", "timeout": 30}], True,
     r"^ladder\[1\]: a second SIGINT \(Ctrl-C\) rung; torchrun restarts its shutdown on a second signal"),
    ([{"signal": "INT", "timeout": 6}, {"signal": "TERM", "timeout": 3}, {"signal": 2, "timeout": 3}], False,
     r"^ladder\[2\]: a second SIGINT"),
    ([], False, r"^ladder: must be a non-empty list"),
    ("SIGINT", False, r"^ladder: must be a non-empty list"),
    (["SIGINT"], False, r"^ladder\[0\]: each rung must be a dict"),
    ([{"signal": "INT"}], False, r"^ladder\[0\]: a rung needs both signal and timeout"),
    ([{"signal": "INT", "timeout": -1}], False, r"^ladder\[0\]\.timeout: timeout must be a finite number of seconds >= 0"),
    ([{"signal": "INT", "timeout": "soon"}], False, r"^ladder\[0\]\.timeout: timeout must be a number"),
    ([{"signal": "INT", "timeout": float("nan")}], False, r"timeout must be a finite number"),
    ([{"signal": "TERM", "timeout": 1}, {"signal": "NOPE", "timeout": 1}], False, r"^ladder\[1\]\.signal: unknown signal 'NOPE'"),
    ([{"signal": "INT", "timeout": 1, "via": "tmux"}], False, r"needs tmux_session"),
    ([{"signal": "TERM", "timeout": 1, "via": "tmux"}], True, r"must be SIGINT"),
    ([{"signal": "INT", "timeout": 1, "via": "screen"}], True, r"only 'tmux'"),
    ([{"signal": "INT", "timeout": 1, "to": "workers"}], True, r"must be 'launcher' or 'all'"),
    ([{"signal": "INT", "timeout": 1, "wait": 3}], True, r"unknown key\(s\) wait"),
])
def test_parse_ladder_errors_name_the_option(raw, tmux, message):
    with pytest.raises(LadderError, match=message):
        parse_ladder(raw, tmux=tmux, kill_timeout=10)


def test_the_progress_scan_signature_sees_growth(tmp_path):
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "ckpt.tmp"
    target.write_bytes(b"a")
    before = progress_scan([str(tmp_path)]).signature
    assert progress_scan([str(tmp_path)]).signature == before
    with open(target, "ab") as handle:
        handle.write(b"b")
    assert progress_scan([str(tmp_path)]).signature != before
    assert progress_scan([str(tmp_path / "missing")]).signature == frozenset()


# ---------------------------------------------------------------- real processes

def spawn(code: str, *args: str) -> subprocess.Popen:
    """A python child running ``code``; returns once it printed 'ready' (handlers installed)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)] + list(args), stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout.readline().strip() == b"ready"
    return proc


GRACEFUL = """
    import signal, sys, time
    def stop(signum, frame):
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    while True:
        time.sleep(60)
"""

IGNORES_ALL = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(60)
"""


def hold(procs: ProcessSet, *children: subprocess.Popen, depth: int = 0) -> None:
    for child in children:
        assert procs.add(child.pid, read_starttime(child.pid), depth, os.getpgid(child.pid))


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=5)


@pytest.mark.parametrize("use_pidfd", MODES)
def test_graceful_exit_ends_the_first_rung_and_zombie_counts_as_gone(children, use_pidfd):
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    child = spawn(GRACEFUL, "0.2")
    children.append(child)
    procs = ProcessSet(use_pidfd=use_pidfd)
    hold(procs, child)
    # nobody reaps the child while the ladder runs: it stays a zombie, and a zombie is gone
    out = run_ladder([Rung(TERM, 20), Rung(KILL, 5)], procs, root_pgids=[child.pid])
    assert out.stopped_by == 0 and out.survivors == [] and out.rungs[0].exited == [child.pid]
    assert child.wait(timeout=5) == 0  # it exited by itself, not by SIGKILL


@pytest.mark.parametrize("use_pidfd", MODES)
def test_ignored_signals_escalate_to_kill(children, use_pidfd):
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    child = spawn(IGNORES_ALL)
    children.append(child)
    procs = ProcessSet(use_pidfd=use_pidfd)
    hold(procs, child)
    out = run_ladder([Rung(INT, 0.2), Rung(TERM, 0.2), Rung(KILL, 5)], procs, root_pgids=[child.pid])
    assert out.stopped_by == 2 and [r.signal for r in out.rungs] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert child.wait(timeout=5) == -KILL


def test_reused_pid_is_never_held_or_signalled(children):
    child = spawn(GRACEFUL)
    children.append(child)
    procs = ProcessSet()
    # the snapshot saw another process under this PID: a different start time
    assert not procs.add(child.pid, read_starttime(child.pid) - 1, 0, child.pid)
    out = run_ladder([Rung(KILL, 1)], procs, root_pgids=[])
    assert out.rungs == [] and out.signalled is False
    assert child.poll() is None


@pytest.mark.parametrize("use_pidfd", MODES)
def test_exit_between_snapshot_and_signal_is_not_an_error(children, use_pidfd):
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    early = spawn(GRACEFUL)
    late = spawn(GRACEFUL)
    children.extend([early, late])
    start_early = read_starttime(early.pid)
    early.kill()
    early.wait()  # gone (and reaped) before it could be held
    procs = ProcessSet(use_pidfd=use_pidfd)
    assert not procs.add(early.pid, start_early, 0, early.pid)
    hold(procs, late)
    late.kill()
    late.wait()  # gone after being held, before the first signal
    out = run_ladder([Rung(TERM, 5)], procs, root_pgids=[late.pid])
    assert out.stopped_by == 0 and out.rungs[0].already_gone == [late.pid] and out.rungs[0].targets == []
    assert out.signalled is False


def test_sigstopped_process_gets_sigcont_and_acts_on_sigterm(children):
    child = spawn(GRACEFUL)
    children.append(child)
    os.kill(child.pid, signal.SIGSTOP)
    wait_for(lambda: read_stat(child.pid)[0] == "T", 10, "the child to stop", interval=0.01)
    assert read_stat(child.pid)[0] == "T"
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 20), Rung(KILL, 5)], procs, root_pgids=[child.pid])
    assert out.stopped_by == 0  # its own SIGTERM handler ran: SIGCONT woke it
    assert child.wait(timeout=5) == 0


@pytest.mark.parametrize("use_pidfd", MODES)
def test_zombie_leader_with_live_thread_is_not_gone(children, use_pidfd):
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    if os.uname().machine != "x86_64":
        pytest.skip("SYS_exit number is for x86_64")
    child = spawn(ZOMBIE_LEADER)
    children.append(child)
    wait_for(lambda: read_stat(child.pid)[0] == "Z", 10, "the leader thread to exit", interval=0.02)
    assert read_stat(child.pid)[0] == "Z" and len(os.listdir("/proc/%d/task" % child.pid)) == 2
    procs = ProcessSet(use_pidfd=use_pidfd)
    hold(procs, child)
    # SIGINT has a python handler, but no main thread is left to run it: the process stays
    out = run_ladder([Rung(INT, 0.3), Rung(TERM, 10)], procs, root_pgids=[child.pid])
    assert out.rungs[0].remaining == 1 and out.stopped_by == 1
    assert child.wait(timeout=5) == -TERM


WRITER = """
    import os, signal, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    def stop(signum, frame):
        end = time.monotonic() + seconds
        with open(path, "ab") as handle:
            while time.monotonic() < end:
                handle.write(b"x" * 4096)
                handle.flush()
                time.sleep(0.05)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        time.sleep(60)
"""


@pytest.mark.parametrize("watch", [True, False])
def test_progress_extends_the_rung_only_while_files_change(children, tmp_path, watch):
    target = tmp_path / "ckpt.tmp"
    child = spawn(WRITER, str(target), "3")
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    # the rung's timeout is the time the save has to begin: a whole second, as a loaded machine may
    # take that long to run the writer's handler; the save then outlasts it by two
    out = run_ladder([Rung(TERM, 1.0), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(tmp_path)] if watch else [], stall=0.8, max_grace=30))
    if watch:
        assert out.stopped_by == 0 and out.rungs[0].extended_by > 0
        assert child.wait(timeout=5) == 0 and target.stat().st_size > 0
    else:
        assert out.stopped_by == 1 and child.wait(timeout=5) == -KILL


def test_progress_never_extends_past_max_grace(children, tmp_path):
    target = tmp_path / "log"
    child = spawn(WRITER, str(target), "3600")  # "saves" forever
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 0.2), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(target)], stall=5, max_grace=1.0))
    assert out.stopped_by == 1
    assert out.rungs[0].extended_by <= 1.0 - 0.2 + 1e-6  # bounded by max_grace, whatever the writer does


# A checkpoint save as real trainers do it: a nested step directory, a .tmp file written in
# shards with pauses between them (the next shard serialized, an fsync under load) that are
# longer than progress_stall, then the file and the directory renamed into place.
SAVER = """
    import os, signal, sys, time
    root, shards, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    def save(signum, frame):
        step = os.path.join(root, "step-000682.tmp")
        os.makedirs(os.path.join(step, "rank0"))
        with open(os.path.join(step, "rank0", "model.pt.tmp"), "wb") as handle:
            for _shard in range(shards):
                handle.write(b"w" * 65536)
                handle.flush()
                time.sleep(pause)  # nothing visible changes meanwhile
            os.fsync(handle.fileno())
        os.rename(os.path.join(step, "rank0", "model.pt.tmp"), os.path.join(step, "rank0", "model.pt"))
        os.rename(step, os.path.join(root, "step-000682"))
        sys.exit(0)
    signal.signal(signal.SIGTERM, save)
    print("ready", flush=True)
    while True:
        time.sleep(60)
"""


@pytest.mark.parametrize("use_pidfd", MODES)
def test_save_pausing_longer_than_progress_stall_is_not_cut_short(children, tmp_path, use_pidfd):
    """The lab's slow_checkpoint run: changes seen, then none for progress_stall while the save went on."""
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-000681").mkdir()  # an older checkpoint next to it
    (ckpt / "step-000681" / "model.pt").write_bytes(b"o" * 1000)
    child = spawn(SAVER, str(ckpt), "4", "0.6")
    children.append(child)
    procs = ProcessSet(use_pidfd=use_pidfd)
    hold(procs, child)
    out = run_ladder([Rung(TERM, 1.0), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.3, max_grace=30))
    assert out.stopped_by == 0 and child.wait(timeout=5) == 0, [r.as_dict() for r in out.rungs]
    assert (ckpt / "step-000682" / "rank0" / "model.pt").stat().st_size == 4 * 65536
    assert not (ckpt / "step-000682.tmp").exists()


def test_a_save_hung_with_its_file_open_is_still_bounded_by_max_grace(children, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    child = spawn(SAVER, str(ckpt), "2", "3600")  # one write, then hangs holding the .tmp open
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 1.0), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.3, max_grace=2.0))
    assert out.stopped_by == 1 and out.rungs[0].held_open
    assert out.rungs[0].extended_by <= 2.0 - 1.0 + 1e-6


def test_files_open_for_writing_are_identities_of_write_fds(tmp_path):
    written, read = tmp_path / "w.tmp", tmp_path / "r"
    read.write_bytes(b"r")
    with open(written, "ab") as w_handle, open(read, "rb") as _r_handle:
        os.rename(written, tmp_path / "w")  # still the same file after the rename
        found = files_open_for_writing(os.getpid())
        st_w, st_r = os.stat(tmp_path / "w"), os.stat(read)
        assert (st_w.st_dev, st_w.st_ino) in found and (st_r.st_dev, st_r.st_ino) not in found
        assert w_handle.fileno() > 0
    assert parse_fdinfo_flags("pos:\t0\nflags:\t0100001\nmnt_id:\t29\n") == 0o100001
    assert parse_fdinfo_flags("pos: 0\n") is None


IDLE_OPEN = """
    import signal, sys, time
    log = open(sys.argv[1], "ab")  # held open for writing, never written after the signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(60)
"""


def test_a_file_held_open_without_progress_does_not_extend_the_rung(children, tmp_path):
    """Only a save that was seen progressing in this rung is waited for while its file is open."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    child = spawn(IDLE_OPEN, str(ckpt / "train.log"))
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 0.3), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.3, max_grace=30))
    assert out.stopped_by == 1 and out.rungs[0].extended_by == 0
    assert child.wait(timeout=5) == -KILL


def test_progress_scan_follows_symlinks_and_sees_the_newest_first(tmp_path):
    real = tmp_path / "data" / "run-17"
    (real / "old").mkdir(parents=True)
    for index in range(300):
        (real / "old" / ("shard-%03d.pt" % index)).write_bytes(b"o")
    old_ns = (real / "old").stat().st_mtime_ns - 10 ** 9
    os.utime(real / "old", ns=(old_ns, old_ns))
    (real / "new").mkdir()
    growing = real / "new" / "model.pt.tmp"
    growing.write_bytes(b"x")
    link = tmp_path / "ckpt"
    link.symlink_to(real)  # the checkpoint directory is a symlink (and so could a subdirectory be)
    (real / "loop").symlink_to(real)  # a cycle must not be walked forever
    before = progress_scan([str(link)], limit=50).signature
    assert any(entry[0].endswith("model.pt.tmp") for entry in before)
    with open(growing, "ab") as handle:
        handle.write(b"y")
    assert progress_scan([str(link)], limit=50).signature != before
    assert progress_scan([str(link)]).signature == progress_scan([str(link)]).signature


def test_launcher_targets_and_order(children):
    launcher_code = """
        import signal, subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
                for _ in range(2)]
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        print("ready", flush=True)
        while True:
            time.sleep(60)
    """
    launcher = spawn(launcher_code)
    children.append(launcher)
    kids = stat_children([launcher.pid])
    assert len(kids) == 2
    procs = ProcessSet()
    hold(procs, launcher)
    for pid, start, pgid in kids:
        assert procs.add(pid, start, 1, pgid)
    live = procs.live()
    assert live[0].pid == launcher.pid  # launchers first, then their workers
    assert [h.pid for h in launcher_targets(live, [launcher.pid])] == [launcher.pid]  # workers: own sessions
    out = run_ladder([Rung(INT, 0.2, to="launcher"), Rung(TERM, 10)], procs, root_pgids=[launcher.pid])
    assert out.rungs[0].targets == [launcher.pid]
    assert out.rungs[1].targets[0] == launcher.pid and sorted(out.rungs[1].targets[1:]) == sorted(k[0] for k in kids)
    assert out.stopped_by == 1


def test_late_children_join_before_the_next_rung(children):
    # a supervisor that starts a new child on SIGINT (like a respawning launcher)
    code = """
        import signal, subprocess, sys, time
        def respawn(signum, frame):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        signal.signal(signal.SIGINT, respawn)
        print("ready", flush=True)
        while True:
            time.sleep(60)
    """
    sup = spawn(code)
    children.append(sup)
    procs = ProcessSet()
    hold(procs, sup)
    out = run_ladder([Rung(INT, 0.5), Rung(KILL, 5)], procs, root_pgids=[sup.pid], find_children=stat_children)
    assert len(out.late_children) == 1 and out.stopped_by == 1
    assert out.late_children[0] in out.rungs[1].targets


def test_describe_process_reports_state_and_wchan(children):
    child = spawn(GRACEFUL)
    children.append(child)
    info = describe_process(child.pid)
    assert info["state"] in ("S", "R") and "python" in info["cmdline"] and "wchan" in info
    child.kill()
    child.wait()
    assert describe_process(child.pid)["state"] == "gone"


# ---------------------------------------------------------------- progress judged by the job's state after the signal

# A trainer that ignores the signal (or, with "graceful", finishes the step in flight, saves once and exits):
# a step line every `step_s` into a steps file (the unit stand-in for the tmux pane the module reads), an
# atomic checkpoint (tmp + rename, a new file opened each time) every `every` steps, and a log file it opened
# before the signal and keeps appending to, all in the checkpoint directory `root`.
TRAINER = """
    import os, signal, sys, time
    root, mode, step_s, every, shards, pause = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    stop = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN if mode == "ignore" else lambda *a: stop.append(1))
    log = open(os.path.join(root, "train.log"), "a")
    def save(step):
        tmp = os.path.join(root, "ckpt-%06d.pt.tmp" % step)
        with open(tmp, "wb") as handle:
            for _ in range(shards):
                handle.write(b"w" * 65536)
                handle.flush()
                time.sleep(pause)
        os.rename(tmp, tmp[:-4])
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        time.sleep(step_s)
        log.write("step %d\\n" % step)
        log.flush()
        with open(os.path.join(root, "..", "steps"), "a") as steps:
            steps.write("step %d\\n" % step)
        if stop:
            save(step)
            sys.exit(0)
        if step % every == 0:
            save(step)
"""


def steps_probe(path):
    def probe():
        try:
            lines = path.read_text().split()
        except OSError:
            return None
        return int(lines[-1]) if lines else None
    return probe


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "ckpt").mkdir()
    return tmp_path / "ckpt"


def test_a_signal_ignoring_periodic_checkpointer_gets_no_grace(children, tmp_path, ckpt):
    """Its step counter keeps advancing: training, not shutting down; its checkpoints are no shutdown save."""
    child = spawn(TRAINER, str(ckpt), "ignore", "0.05", "4", "2", "0.05")  # a save every 0.2 s
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(INT, 0.6), Rung(TERM, 0.6), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.5, max_grace=30, step_probe=steps_probe(tmp_path / "steps")))
    rungs = [r.as_dict() for r in out.rungs]
    assert out.stopped_by == 2 and child.wait(timeout=5) == -KILL, rungs
    for rung in out.rungs[:2]:
        assert rung.training and rung.extended_by == 0 and rung.steps[1] - rung.steps[0] > 1, rungs
    assert any(name.endswith(".pt") for name in os.listdir(ckpt))  # it did checkpoint meanwhile


def test_without_a_step_source_periodic_saves_extend_a_rung_only_while_one_is_written(children, tmp_path, ckpt):
    """No pane to read steps from: a save every 1.2 s lasting 0.3 s, progress_stall 0.2 (shorter than the
    period): a rung may wait for the save in flight at its timeout, never from one save to the next."""
    child = spawn(TRAINER, str(ckpt), "ignore", "0.1", "12", "3", "0.1")
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 1.5), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.2, max_grace=30))
    assert out.stopped_by == 1, [r.as_dict() for r in out.rungs]
    assert out.rungs[0].extended_by < 0.3 + 0.2 + 0.5  # one save and the stall at most, never max_grace


def test_a_log_written_through_a_file_opened_before_the_signal_is_no_save(children, tmp_path, ckpt):
    """The job keeps appending to its log (under progress_paths) and ignores the signal: files change, yet no
    file was opened after the signal, so the rung ends at its timeout."""
    child = spawn(TRAINER, str(ckpt), "ignore", "0.05", "1000000", "1", "0")
    children.append(child)
    procs = ProcessSet()
    hold(procs, child)
    out = run_ladder([Rung(TERM, 0.5), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt / "train.log")], stall=0.5, max_grace=30))
    assert out.stopped_by == 1 and out.rungs[0].extended_by == 0 and not out.rungs[0].save_seen


@pytest.mark.parametrize("use_pidfd", MODES)
def test_a_save_started_after_ctrl_c_is_never_cut_short(children, tmp_path, ckpt, use_pidfd):
    """The step in flight finishes (one more step line: not "training"), then a slow save (6 x 0.5 s shards,
    pauses longer than progress_stall) runs far past the rung's timeout, and the job exits on its own."""
    if use_pidfd and not pidfd_supported():
        pytest.skip("no pidfd here")
    child = spawn(TRAINER, str(ckpt), "graceful", "0.1", "1000000", "6", "0.5")
    children.append(child)
    procs = ProcessSet(use_pidfd=use_pidfd)
    hold(procs, child)
    wait_for((tmp_path / "steps").exists, 5, "the trainer's first step line", interval=0.02)
    out = run_ladder([Rung(INT, 1.0), Rung(KILL, 5)], procs, root_pgids=[child.pid],
                     grace=Grace(paths=[str(ckpt)], stall=0.3, max_grace=30, step_probe=steps_probe(tmp_path / "steps")))
    rung = out.rungs[0]
    assert out.stopped_by == 0 and child.wait(timeout=5) == 0, rung.as_dict()
    assert rung.save_seen and not rung.training and rung.extended_by > 1.0
    saved = [name for name in os.listdir(ckpt) if name.endswith(".pt")]
    assert len(saved) == 1 and os.path.getsize(ckpt / saved[0]) == 6 * 65536
