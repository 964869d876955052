"""The runner of training_stop at its boundary: the pure helpers it is made of (_stop_job_scan,
_stop_job_report), and what it returns for bad options before it takes the lock. The climb itself is
covered end to end by tests/unit/plugins/modules/test_training_stop.py (real processes, real tmux)."""

from __future__ import annotations

import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ProcessInfo
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop import job as _stop_job
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop import report as _stop_job_report
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop import scan as _stop_job_scan
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import Member, Selection

pytestmark = pytest.mark.processes


def member(pid, pgid, depth, how="child"):
    info = ProcessInfo(pid=pid, ppid=1, pgid=pgid, sid=pgid, state="S", starttime=1000 + pid, comm="python3",
                       cmdline=("python3", "train.py"), uid=0)
    return Member(info, how, depth)


def params(**over):
    base = dict(pids=None, pid_file=None, match=None, tmux_session=None, tmux_socket=None, container=None,
                exclude=[], allow_broad_match=False, ladder=None, progress_paths=[], progress_stall=10.0,
                step_regex=r"\bstep\s+(\d+)", gpu_devices=[], gpu_holders="fail", max_grace=600.0, kill_timeout=10.0,
                lock_dir="/nonexistent", lock_timeout=300.0)
    base.update(over)
    return base


def test_launchers_first_orders_by_depth_then_pid():
    members = (member(30, 30, 1), member(20, 10, 0, "match"), member(10, 10, 0, "match"), member(25, 10, 1))
    sel = Selection({m.pid: m for m in members}, [], [])
    assert [(m.pid, m.depth) for m in _stop_job_scan.launchers_first(sel)] == [(10, 0), (20, 0), (25, 1), (30, 1)]


def test_root_groups_add_the_terminal_foreground_group_only_when_it_is_the_job_s():
    members = [member(100, 100, 0, "match"), member(200, 150, 1), member(300, 300, 1)]
    # the launcher's terminal has the job's group 150 in the foreground: Ctrl-C would reach it
    assert _stop_job_scan.root_groups(members, tpgid=lambda pid: 150) == {100, 150}
    # a foreground group outside the job (the operator's shell) is never added; no terminal (-1) adds nothing
    assert _stop_job_scan.root_groups(members, tpgid=lambda pid: 999) == {100}
    assert _stop_job_scan.root_groups(members, tpgid=lambda pid: -1) == {100}


@pytest.mark.parametrize("over, fragment", [
    ({"max_grace": float("nan")}, "max_grace: must be a finite number of seconds >= 0"),
    ({"progress_stall": -1.0}, "progress_stall: must be a finite number of seconds >= 0"),
    ({"pids": [5, -2]}, "pids: -2 is not a PID"),
    ({"container": 99}, "container: 99 is not a Proxmox VMID"),
    ({"tmux_session": "  "}, "tmux_session: must be a session name"),
])
def test_bad_numbers_fail_before_the_lock_is_touched(tmp_path, over, fragment):
    lock_dir = tmp_path / "lock"
    result = _stop_job.stop_job(params(lock_dir=str(lock_dir), match="x", **over))
    assert result["failed"] is True and fragment in result["msg"]
    assert result["rungs"] == [] and result["changed"] is False
    assert not lock_dir.exists()


def test_a_bad_ladder_fails_with_the_lock_released(tmp_path):
    lock_dir = tmp_path / "lock"
    result = _stop_job.stop_job(params(lock_dir=str(lock_dir), match="x", ladder=[{"signal": "INT", "timeout": -1}]))
    assert result["failed"] is True and result["msg"].startswith("ladder[0].timeout:")
    # a second run is not kept waiting by the first: the lock is free again
    again = _stop_job.stop_job(params(lock_dir=str(lock_dir), match=r"^no-such-program-r13m\s", lock_timeout=0.0))
    assert "failed" not in again and again["selected"] == [] and again["lock_waited"] == 0.0


def test_nothing_selected_reports_the_last_ladder_for_this_selection(tmp_path):
    p = params(lock_dir=str(tmp_path), match=r"^no-such-program-r13m\s")
    first = _stop_job.stop_job(p)
    assert "failed" not in first and first["previous"] is None and first["plan"]
    # the outcome a finished ladder left behind is what the next run reports
    lock = _stop_job.RunLock(str(tmp_path), _stop_job.lock_key({o: p[o] for o in _stop_job.LOCK_KEY_OPTIONS}))
    lock.record({"pid": 4242, "started": time.time() - 5, "finished": time.time(), "state": "done",
                 "stopped_by": "SIGTERM"})
    second = _stop_job.stop_job(p)
    assert second["previous"]["pid"] == 4242
    assert any("the last ladder for this selection (training_stop pid 4242" in n and "stopped the job with SIGTERM" in n
               for n in second["notes"]), second["notes"]


@pytest.mark.parametrize("previous, expected", [
    (None, None),
    ({"state": "running", "pid": 1}, None),
    ({"state": "interrupted", "pid": 7, "started": 0}, "was interrupted before it finished"),
    ({"state": "failed", "pid": 7, "finished": 0, "msg": "boom"}, "ended at 1970-01-01T00:00:00Z: boom"),
    ({"state": "done", "pid": 7, "finished": 0}, "ended at 1970-01-01T00:00:00Z: nothing was left to stop"),
])
def test_previous_note(previous, expected):
    note = _stop_job_report.previous_note(previous)
    assert (note is None) if expected is None else (expected in note and "pid 7" in note)


def test_holders_text_is_bounded():
    holders = [{"pid": pid, "name": "python3", "device": "/dev/nvidia0", "cmdline": "python3 train.py"}
               for pid in range(1, 26)]
    text = _stop_job_report.holders_text(holders)
    assert text.count("pid ") == 20 and text.endswith(" ... and 5 more")
