"""The pipeline's one atomic writer: a writer killed between write and rename loses nothing and leaves nothing for long."""

from __future__ import annotations

import errno
import glob
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from datagen import util
from tests.support.paths import DATAGEN_FILES

pytestmark = pytest.mark.processes

# The child writes half a file through the writer and is SIGKILLed before the rename,
# as a stage is when a fault lands (or the container reboots) mid-write.
_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from datagen.util import AtomicWriter
    with AtomicWriter({path!r}, durable={durable!r}) as fh:
        fh.write('{{"half": ')
        fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
""")


def killed_writer(path: str, durable: bool) -> int:
    """Run a writer of ``path`` that dies between write and rename; its PID (now dead)."""
    child = subprocess.run([sys.executable, "-c", _KILLED_WRITER.format(root=str(DATAGEN_FILES), path=path, durable=durable)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == -9, child.stderr
    # the PID is in the temp file's name; the child printed nothing, so read it from there
    (leftover,) = glob.glob(glob.escape(path) + ".tmp-*")
    return int(leftover[len(path) + len(".tmp-"):].split("-", 1)[0])


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "progress"])
def test_a_writer_killed_before_its_rename_keeps_the_old_file_and_the_next_write_removes_its_temp(tmp_path, durable):
    path = str(tmp_path / "generate.progress.json")
    util.write_json(path, {"written": 1})
    pid = killed_writer(path, durable)
    assert util.read_json(path) == {"written": 1}, "a reader saw the killed writer's half file"
    assert not os.path.exists(f"/proc/{pid}")
    util.write_json(path, {"written": 2}, durable=durable)
    assert util.read_json(path) == {"written": 2}
    assert sorted(os.listdir(tmp_path)) == ["generate.progress.json"], "the killed writer's temp file stayed"


def test_what_a_live_process_or_this_one_is_writing_is_left_alone_and_dead_build_dirs_go(tmp_path):
    path = str(tmp_path / "pipeline.ready.json")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = f"{path}.tmp-{sleeper.pid}-abc123"
        own = f"{path}.tmp-{os.getpid()}-def456"
        dead_dir = f"{path}.old-{dead_pid()}"
        for leftover in (live, own):
            with open(leftover, "w", encoding="utf-8") as fh:
                fh.write("in progress")
        os.makedirs(os.path.join(dead_dir, "shards"))
        util.write_json(path, {"stage": "prepare"})
        assert os.path.exists(live) and os.path.exists(own), "a temp file of a running writer was removed"
        assert not os.path.exists(dead_dir), "a dead run's directory stayed"
    finally:
        sleeper.kill()
        sleeper.wait()
    util.write_json(path, {"stage": "generate"})
    assert not os.path.exists(live), "the writer's temp file stayed after it died"
    assert os.path.exists(own)
    assert json.load(open(path, encoding="utf-8")) == {"stage": "generate"}


def test_a_name_that_only_looks_like_a_leftover_is_never_removed(tmp_path):
    path = str(tmp_path / "merged")
    keep = [f"{path}.tmp-notapid", f"{path}.tmp-", f"{path}.older-1", str(tmp_path / "other.tmp-1")]
    for name in keep:
        open(name, "w", encoding="utf-8").close()
    assert util.remove_dead_leftovers(path) == []
    assert all(os.path.exists(name) for name in keep)


# A write past RLIMIT_FSIZE fails with EFBIG as a full disk fails with ENOSPC: in the kernel's
# write path, with bytes still buffered, so closing the file fails again. No root needed.
_CAPPED_WRITER = textwrap.dedent("""
    import json, os, resource, signal, sys
    sys.path.insert(0, {root!r})
    from datagen.util import write_json
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        write_json({path!r}, {{"text": "x" * {size}}})
    except OSError as exc:
        print(json.dumps({{"errno": exc.errno, "left": sorted(os.listdir(os.path.dirname({path!r})))}}))
""")


# 2,000 bytes fit the writer's buffer and fail at its flush; 100,000 fail inside json.dump
@pytest.mark.parametrize("size", [2000, 100_000], ids=["at-flush", "mid-write"])
def test_a_write_the_disk_refuses_leaves_no_temp_file_and_the_old_file_whole(tmp_path, size):
    path = str(tmp_path / "report.json")
    util.write_json(path, {"rows": 10})
    child = subprocess.run([sys.executable, "-c", _CAPPED_WRITER.format(root=str(DATAGEN_FILES), path=path, size=size)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == {"errno": errno.EFBIG, "left": ["report.json"]}
    assert util.read_json(path) == {"rows": 10}


def test_a_body_that_raises_leaves_no_temp_file(tmp_path):
    path = str(tmp_path / "report.json")
    with pytest.raises(ValueError):
        with util.AtomicWriter(path) as fh:
            fh.write("{")
            raise ValueError("the body failed")
    assert os.listdir(tmp_path) == []


def test_the_written_file_gets_the_usual_mode_and_writers_in_threads_leave_the_umask_alone(tmp_path):
    """generate writes its progress every second while a watcher thread writes the ready file: reading
    the umask by setting it, from two threads at once, could leave it 0 for the rest of the run."""
    old = os.umask(0o022)
    try:
        def write_many(name: str) -> None:
            for i in range(300):
                util.write_json(str(tmp_path / name), {"i": i}, durable=False)

        threads = [threading.Thread(target=write_many, args=(f"f{n}.json",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert os.umask(0o022) == 0o022, "a writer changed the process's umask"
    finally:
        os.umask(old)
    assert sorted(os.listdir(tmp_path)) == [f"f{n}.json" for n in range(4)]
    assert {os.stat(tmp_path / name).st_mode & 0o777 for name in os.listdir(tmp_path)} == {0o644}
