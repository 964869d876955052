# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What ``training_stop`` returns and says: its result's keys, option checks, and every message it builds.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). Pure functions (``user_name``
reads the password database): the run (``_stop.job``) gathers the facts, these
turn them into the module's result.
"""

from __future__ import annotations

import math
import pwd
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.ladder_lock import describe_previous
from ansible_collections.gpuops.repurpose.plugins.module_utils._stop.select import Member, command_of

SELECTORS = ("pids", "pid_file", "match", "tmux_session", "container")
# one ladder at a time per container and selection: these options make the lock's key
LOCK_KEY_OPTIONS = ("pids", "pid_file", "match", "tmux_session", "tmux_socket", "container", "gpu_devices")


def new_result() -> dict[str, t.Any]:
    """Every key the module returns, before anything was looked at."""
    return dict(changed=False, selected=[], plan=[], rungs=[], stopped_by=None, stopped_by_index=None,
                survivors=[], unkillable=[], late_children=[], notes=[], left_out=[], gpu_holders=[], previous=None,
                lock_waited=0.0, pidfd=False, elapsed=0.0, checkpoint=None, checkpoint_skipped=[], launch_record=None)


def check_numbers(params: t.Mapping[str, t.Any]) -> str | None:
    """The message for the first numeric option out of range, None when all are fine."""
    for option in ("max_grace", "kill_timeout", "progress_stall"):
        value = params[option]
        if value is None or not math.isfinite(value) or value < 0:
            return "%s: must be a finite number of seconds >= 0, got %r" % (option, value)
    for pid in params["pids"] or []:
        if pid <= 0:
            return "pids: %r is not a PID; give positive integers" % pid
    if params["container"] is not None and params["container"] < 100:
        return "container: %r is not a Proxmox VMID (100 or more)" % params["container"]
    if params["tmux_session"] is not None and not params["tmux_session"].strip():
        return "tmux_session: must be a session name, got an empty string"
    return None


def user_name(uid: int | None) -> str | None:
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def member_dict(member: Member) -> dict[str, t.Any]:
    info = member.info
    return {
        "pid": info.pid, "ppid": info.ppid, "pgid": info.pgid, "sid": info.sid, "uid": info.uid,
        "user": user_name(info.uid), "starttime": info.starttime, "state": info.state, "depth": member.depth,
        "how": member.how, "cmdline": command_of(info) or "[%s]" % info.comm,
    }


def diff_lines(entries: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    return "".join("%d %s\n" % (e["pid"], e["cmdline"]) for e in entries)


def holders_text(holders: t.Sequence[t.Mapping[str, t.Any]]) -> str:
    return "; ".join("pid %(pid)d %(name)s on %(device)s: %(cmdline)s" % h for h in holders[:20]) + (
        " ... and %d more" % (len(holders) - 20) if len(holders) > 20 else "")


def selection_text(params: t.Mapping[str, t.Any]) -> str:
    return ", ".join("%s=%s" % (option, params[option]) for option in LOCK_KEY_OPTIONS if params[option])


def previous_note(previous: t.Mapping[str, t.Any] | None) -> str | None:
    """What the last finished ladder for this selection did (even one nobody watched), when nothing is selected now."""
    if not previous or previous.get("state") not in ("done", "failed", "interrupted"):
        return None
    return "nothing selected now; " + describe_previous(previous)


def orphans_message(holders: t.Sequence[t.Mapping[str, t.Any]], params: t.Mapping[str, t.Any]) -> str:
    """The failure when nothing was selected but processes hold the GPUs (a launcher gone, its ranks on)."""
    return (
        "nothing was selected, but %d process(es) hold GPU devices (%s), likely the orphaned ranks of a "
        "launcher that is gone: %s. Nothing was signalled. Select them (pids, match), or set gpu_holders: "
        "stop to stop every GPU holder%s." % (
            len(holders), ", ".join(params["gpu_devices"]), holders_text(holders),
            " in CT %d" % params["container"] if params["container"] else ""))


def fill_outcome(result: dict[str, t.Any], outcome: t.Any, diff: bool) -> None:
    """The climbed ladder's outcome (``ladder.run_ladder``) into RESULT: rungs, stopper, survivors, diff."""
    result["changed"] = outcome.signalled
    result["rungs"] = [r.as_dict() for r in outcome.rungs]
    result["late_children"] = outcome.late_children
    if outcome.stopped_by is not None:
        rung = outcome.rungs[outcome.stopped_by]  # as climbed: a Ctrl-C rung with no pane left sent SIGINT itself
        result["stopped_by"] = rung.signal + (" via tmux" if rung.via == "tmux" else "")
        result["stopped_by_index"] = outcome.stopped_by
    elif not outcome.rungs:
        result["notes"].append("every selected process exited before the first signal")
    result["survivors"] = outcome.survivors
    if diff:
        left = [e for e in result["selected"] if e["pid"] in set(outcome.survivors)]
        result["diff"] = dict(before=diff_lines(result["selected"]), after=diff_lines(left))


def survivors_failure(details: list[dict[str, t.Any]], denied: t.Mapping[int, str], sigkill_climbed: bool,
                      kill_timeout: float) -> tuple[str, bool]:
    """The failure message for processes left after the ladder (DETAILS: ``_proc.describe_process`` of each),
    and whether they are RV(unkillable); a process this module may not signal gets its ``error`` in DETAILS."""
    for entry in details:
        if entry["pid"] in denied:
            entry["error"] = denied[entry["pid"]]
    if denied:
        # not the host's fault: this module lacks the right to signal them
        return ("%d process(es) could not be signalled (%s); run the module as root (become: true) or as the "
                "job's user" % (len(denied), "; ".join("pid %d: %s" % item for item in sorted(denied.items())))), True
    if sigkill_climbed:
        return ("%d process(es) survived SIGKILL for %ss (kill_timeout); the host needs attention "
                "(processes stuck in the kernel, e.g. in the GPU driver): %s" % (
                    len(details), kill_timeout,
                    "; ".join("pid %(pid)s state %(state)s wchan %(wchan)s: %(cmdline)s" % d for d in details))), True
    return ("the ladder ended with %d process(es) still running (%s); add a SIGKILL rung or longer timeouts" % (
        len(details), ", ".join(str(d["pid"]) for d in details))), False
