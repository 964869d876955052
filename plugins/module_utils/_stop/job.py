# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runner of ``training_stop``: options in, the module's result out.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

:func:`stop_job` takes the run lock, snapshots the selection (``_stop.select``),
checks the GPU holders (``_gpu.holders``), climbs the ladder (``_stop.ladder``,
Ctrl-C through ``_tmux``), records its outcome (``_stop.ladder_lock``), judges the
checkpoints (``_checkpoint.newest``) and writes what a relaunch needs (``_launch.record``). What it reads
about the job and the host is in ``_stop.scan``; the result's keys and every
message it returns are built in ``_stop.report``. The module only parses
options and hands the result to ``exit_json``/``fail_json``.
"""

from __future__ import annotations

import os
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._checkpoint.newest import SETTLE, scan_checkpoints
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import (
    build_record,
    record_path,
    write_record,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    describe_process,
    read_environ,
    stat_children,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder import (
    LadderError,
    Rung,
    fit_to_torchrun,
    parse_ladder,
    run_ladder,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder_lock import (
    RunLock,
    RunLockError,
    describe_holder,
    lock_key,
    outcome_fields,
    shield_from_hangup,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.process_set import ProcessSet
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.report import (
    LOCK_KEY_OPTIONS,
    SELECTORS,
    check_numbers,
    diff_lines,
    fill_outcome,
    holders_text,
    member_dict,
    new_result,
    orphans_message,
    previous_note,
    selection_text,
    survivors_failure,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.save_watch import Grace
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.scan import (
    gpu_holders,
    launch_facts,
    launchers_first,
    locked_elsewhere,
    root_groups,
    step_line_now,
    tmux_launcher,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import (
    Member,
    SelectError,
    Selection,
    compile_regex,
    late_children,
    snapshot,
    torchrun_shutdown_timeout,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import (
    last_step,
    send_ctrl_c,
    tmux_panes,
    tmux_step,
)

__all__ = ["LOCK_KEY_OPTIONS", "SELECTORS", "stop_job"]


class _Finish(Exception):
    """Ends the run here: ``failed`` is the failure message, None for success."""

    def __init__(self, failed: str | None = None) -> None:
        super().__init__(failed or "")
        self.failed = failed


class _StopJob:
    """One run of the module: its options, its lock and the result it fills in."""

    def __init__(self, params: t.Mapping[str, t.Any], check_mode: bool, diff: bool, started: float) -> None:
        self.params, self.check_mode, self.diff, self.started = params, check_mode, diff, started
        self.result = new_result()
        self.lock = RunLock(params["lock_dir"], lock_key({option: params[option] for option in LOCK_KEY_OPTIONS}))
        self.climbing: dict[str, t.Any] | None = None  # set once this run recorded its ladder as running
        self.hangups: list[str] = []  # SIGHUP/SIGPIPE caught while the ladder ran on after its connection died
        self.launch: dict[str, t.Any] | None = None  # what starts the job again, read before the first signal
        self.step_line = ""
        self.step_regex: t.Pattern[str] | None = None

    def judge_checkpoints(self) -> None:
        """The newest whole checkpoint under progress_paths, and the newer ones that are not whole."""
        if self.params["progress_paths"]:
            # a file still growing is partial only while a writer may be alive: once the ladder left no process
            # of the job, a save it just finished is whole however recent
            writer_gone = not self.check_mode and not self.result["survivors"]
            scan = scan_checkpoints(self.params["progress_paths"], self.params["checkpoint_patterns"] or ["*"],
                                    settle=0.0 if writer_gone else SETTLE)
            self.result["checkpoint"] = scan.newest_whole.as_dict() if scan.newest_whole else None
            self.result["checkpoint_skipped"] = [v.as_dict() for v in scan.skipped]

    def write_launch_record(self) -> None:
        """The launch record of the job this ladder stopped (a run that stopped nothing keeps the one it has)."""
        params, result, launch = self.params, self.result, self.launch
        if launch is None or self.climbing is None:
            return
        checkpoint = result["checkpoint"]
        # the pane's last step line now (a job that ignored the first rungs trained on); the one read before the
        # first signal when the pane closed with the job (a torchrun started by the session's own command)
        panes = tmux_panes(params["tmux_session"], params["tmux_socket"])[0]
        self.step_line = step_line_now(panes, self.step_regex, params["tmux_socket"]) or self.step_line
        path = record_path(params["record_dir"], params["tmux_session"])
        record = build_record(
            session=params["tmux_session"], window=launch["window"], argv=launch["argv"], cwd=launch["cwd"],
            user=launch["user"], uid=launch["uid"], env=launch["env"], step_line=self.step_line,
            step=last_step(self.step_line, self.step_regex) if self.step_regex is not None else None,
            checkpoint=checkpoint, checkpoint_skipped=result["checkpoint_skipped"], stopped_at=time.time(),
            stopped_by=result["stopped_by"])
        try:
            write_record(path, record)
        except OSError as exc:
            result["notes"].append("could not write the launch record %s: %s" % (path, exc))
            return
        result["launch_record"] = dict(record, path=path)

    def finish(self, failed: str | None) -> dict[str, t.Any]:
        result = self.result
        self.judge_checkpoints()
        self.write_launch_record()
        result["elapsed"] = round(time.monotonic() - self.started, 4)
        if self.climbing is not None:
            try:
                # what was stopped and by which rungs, for a re-run to report (its caller may never have seen it)
                self.lock.record(dict(self.climbing, state="failed" if failed else "done", msg=failed or "",
                                      finished=time.time(), survivors=result["survivors"],
                                      gpu_holders=[h["pid"] for h in result["gpu_holders"]], elapsed=result["elapsed"],
                                      **outcome_fields(result["selected"], result["rungs"], result["stopped_by"],
                                                       self.hangups)))
            except OSError as exc:
                result["notes"].append("could not record this ladder's outcome in %s: %s" % (self.lock.state_path, exc))
        self.lock.release()
        if failed:
            result.update(failed=True, msg=failed)
        return result

    def prepare(self) -> tuple[list[Rung], t.Pattern[str] | None, list[dict[str, t.Any]], Selection]:
        """The ladder, the step regex, the GPU holders and the snapshot, with the lock held (not in check mode)."""
        params, result, lock = self.params, self.result, self.lock
        rungs = parse_ladder(params["ladder"], tmux=bool(params["tmux_session"]), kill_timeout=params["kill_timeout"])
        step_regex = (compile_regex("step_regex", params["step_regex"])
                      if params["tmux_session"] and params["step_regex"] else None)
        self.step_regex = step_regex
        if self.check_mode:
            holder = lock.holder() if locked_elsewhere(lock) else None
            if holder is not None:
                result["notes"].append("a ladder is running now for this selection: %s" % describe_holder(holder, time.time()))
        else:
            # before the snapshot: a second run sees the job as the first ladder left it
            lock.acquire(params["lock_timeout"], {"pid": os.getpid(), "started": time.time(),
                                                  "selection": selection_text(params)})
            result["lock_waited"] = round(lock.waited, 3)
            if lock.waited_for:
                result["notes"].append("waited %.1fs for %s" % (lock.waited, lock.waited_for))
        result["previous"] = lock.previous()
        holders_before = gpu_holders(params)
        selection = snapshot(
            pids=params["pids"] or [], pid_file=params["pid_file"], match=params["match"],
            tmux_session=params["tmux_session"], tmux_socket=params["tmux_socket"], container=params["container"],
            exclude=params["exclude"], allow_broad_match=params["allow_broad_match"],
            gpu_holders=[h["pid"] for h in holders_before] if params["gpu_holders"] == "stop" else [],
        )
        return rungs, step_regex, holders_before, selection

    def plan(self, rungs: list[Rung], holders_before: list[dict[str, t.Any]], selection: Selection) -> tuple[list[Rung], list[Member]]:
        """Fill in the selection and the plan; end the run when there is nothing to climb (or check mode)."""
        params, result = self.params, self.result
        members = launchers_first(selection)
        shutdown_timeouts = [value for value in (
            torchrun_shutdown_timeout(m.info.cmdline, read_environ(m.pid)) for m in members if m.depth == 0) if value is not None]
        rungs, fit_notes = fit_to_torchrun(rungs, max(shutdown_timeouts) if shutdown_timeouts else None)
        result["plan"] = [rung.describe() for rung in rungs]
        result["notes"] = result["notes"] + selection.notes + fit_notes
        result["left_out"] = [{"pid": pid, "why": why, "cmdline": cmd} for pid, (why, cmd) in sorted(selection.left_out.items())]
        result["selected"] = [member_dict(m) for m in members]
        if selection.refused:
            raise _Finish(selection.refused)
        unselected = [h for h in holders_before if h["pid"] not in selection.members]
        if unselected and not members:
            # never "nothing to do" while something holds the GPUs: with the launcher gone (killed -9, OOM)
            # these are its orphaned ranks, training on with their tmux pane closed
            result["gpu_holders"] = unselected
            raise _Finish(orphans_message(unselected, params))
        if unselected:
            result["notes"].append("%d process(es) outside the selection hold GPU devices: %s" % (
                len(unselected), holders_text(unselected)))
        if not members:
            note = previous_note(result["previous"])
            if note:
                result["notes"].append(note)
            raise _Finish()
        if self.diff:
            result["diff"] = dict(before=diff_lines(result["selected"]), after="")
        launcher = tmux_launcher(members)
        if launcher is not None and params["record_dir"] and not self.check_mode:
            panes = tmux_panes(params["tmux_session"], params["tmux_socket"])[0]
            self.launch = launch_facts(launcher, panes, params["tmux_socket"], params["record_env"])
            self.step_line = step_line_now(panes, self.step_regex, params["tmux_socket"])
        if self.check_mode:
            result["changed"] = True
            raise _Finish()
        return rungs, members

    def climb(self, rungs: list[Rung], step_regex: t.Pattern[str] | None, selection: Selection,
              members: list[Member]) -> None:
        """Climb the ladder and judge its outcome; raises _Finish with the failure, returns on success."""
        params, result = self.params, self.result
        self.climbing = {"pid": os.getpid(), "started": time.time(), "selection": selection_text(params),
                         "selected": [m.pid for m in members]}
        # from here the ladder finishes on its own even if the connection that started it dies
        shield_from_hangup(self.hangups)
        try:
            self.lock.record(dict(self.climbing, state="running"))
        except OSError as exc:
            result["notes"].append("could not record this ladder in %s: %s" % (self.lock.state_path, exc))
        session, socket = params["tmux_session"], params["tmux_socket"]
        excludes = [compile_regex("exclude", pattern) for pattern in params["exclude"]]
        # the step line's number in the pane, when a step regex is given (a closure, not a None-or-def twin)
        step_probe = (lambda: tmux_step(tmux_panes(session, socket)[0], step_regex, socket)) \
            if step_regex is not None else None

        procs = ProcessSet()
        result["pidfd"] = procs.use_pidfd
        for m in members:
            procs.add(m.pid, m.info.starttime, m.depth, m.info.pgid)
        try:
            outcome = run_ladder(
                rungs, procs, root_pgids=root_groups(members),
                # Ctrl-C in a pane reaches only what runs in it: a job found otherwise (orphaned ranks
                # found as GPU holders, the pane left at its prompt) gets SIGINT to its launchers instead
                send_keys=(lambda: send_ctrl_c(session, socket)) if any(m.how == "tmux_session" for m in members) else None,
                grace=Grace(params["progress_paths"], params["progress_stall"], params["max_grace"], step_probe),
                started=self.started,
                find_children=lambda parents: late_children(stat_children(parents), selection.seen, excludes),
            )
        finally:
            procs.close()
        fill_outcome(result, outcome, self.diff)
        if outcome.survivors:
            raise _Finish(self.survivors_failure(outcome))
        holders_after = gpu_holders(params)
        if holders_after:
            result["gpu_holders"] = holders_after
            raise _Finish("the selected processes are gone, but %d process(es) outside the selection still hold GPU "
                          "devices: %s" % (len(holders_after), holders_text(holders_after)))

    def survivors_failure(self, outcome: t.Any) -> str:
        """The failure message for processes left after the ladder (and RV(unkillable) where that is what they are)."""
        details = [describe_process(pid) for pid in outcome.survivors]
        message, unkillable = survivors_failure(details, outcome.denied, any(r.signal == "SIGKILL" for r in outcome.rungs),
                                                self.params["kill_timeout"])
        if unkillable:
            self.result["unkillable"] = details
        return message


def stop_job(params: t.Mapping[str, t.Any], check_mode: bool = False, diff: bool = False,
             started: float | None = None) -> dict[str, t.Any]:
    """Run ``training_stop`` with its (already type-checked) options.

    Returns the module's result; on failure it has ``failed=True`` and ``msg``. ``started`` is when the module
    started (monotonic clock), so ``elapsed`` and the ladder's bounds count the module's start-up.
    """
    started = time.monotonic() if started is None else started
    bad = check_numbers(params)
    if bad:
        return dict(new_result(), failed=True, msg=bad)
    job = _StopJob(params, check_mode, diff, started)
    try:
        rungs, step_regex, holders_before, selection = job.prepare()
    except (LadderError, SelectError, RunLockError) as exc:
        job.lock.release()
        return dict(job.result, failed=True, msg=str(exc))
    try:
        rungs, members = job.plan(rungs, holders_before, selection)
        job.climb(rungs, step_regex, selection, members)
    except _Finish as end:
        return job.finish(end.failed)
    return job.finish(None)
