# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runner of ``training_start``: a launch record (or a command given by hand) in, a job that is proven to
train (or the reason it is not) out.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

Here: the job's command (:func:`apply_overrides`, :func:`env_values`), the one tmux command line that starts it
(:func:`launch_plan`), and :func:`start_training`, the module's one call, which puts the parts together. Elsewhere:
tmux itself (``_tmux``), the GPUs the job must hold (``_launch.gpus``), the wait until it proves it trains
(``_launch.watch``) and the launch record (``_launch.record``). The command is always an argv handed to tmux,
never a shell string: tmux (>= 2.0) runs a command given as several arguments without ``sh -c``.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import time
import typing as t
from dataclasses import dataclass

from ansible_collections.gpuops.repurpose.plugins.module_utils._checkpoint.newest import step_from_name
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import GpuError
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.gpus import GpuWatch, busy_holders
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import RecordError, record_path
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import read_record as read_record_file
from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.watch import (
    TAIL_LINES,
    Watched,
    last_output,
    read_death,
    running_in_panes,
    tail_lines,
    watch,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ProcessInfo, read_table
from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import (
    Pane,
    Tmux,
    TmuxError,
    format_escape,
    tmux_arg,
    tmux_prefix,
)

DEFAULT_STEP_REGEX = r"\bstep\s+(\d+)"
DEFAULT_GPU_DEVICES = ("/dev/nvidia[0-9]*",)
# tmux 3.0: new-window -e; the command-line parser whose rules tmux_arg escapes for. tmux 3.2: new-session -e.
MIN_TMUX = (3, 0)
NEW_SESSION_ENV_TMUX = (3, 2)
# printed by new-session/new-window -P: what the wait follows
NEW_PANE_FORMAT = "#{pane_id}\t#{pane_pid}\t#{window_id}"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER = re.compile(r"^-\d+(\.\d*)?$")
# tmux rewrites ':' and '.' in a session name to '_' and expands '#' as a format in -s and -n: a name holding one
# of them would not be the session (or window) asked for
_SESSION_BAD = ":.#"
_WINDOW_BAD = "#"


class LaunchError(Exception):
    """Nothing was started (or the wait could not even begin); the message names the option and the fix."""


# ---------------------------------------------------------------- the record and the command

def read_record(path: str, session: str | None = None) -> dict[str, t.Any]:
    """The launch record at ``path``, checked (``_launch_record.read_record``); LaunchError naming the fix."""
    try:
        return read_record_file(path, session)
    except RecordError as exc:
        raise LaunchError(str(exc)) from None


def record_min_step(record: t.Mapping[str, t.Any]) -> int | None:
    """The step the job must get past: its checkpoint's, else the last one it showed (None when neither is known)."""
    checkpoint = record.get("checkpoint")
    for value in (checkpoint.get("step") if isinstance(checkpoint, dict) else None, record.get("step")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def argument_names(argv: t.Sequence[str]) -> list[str]:
    """The option names in ``argv`` (``--data`` of ``--data X`` and ``--data=X``), in order, each once."""
    names: list[str] = []
    for arg in argv[1:]:
        if not arg.startswith("-") or arg in ("-", "--") or _NUMBER.match(arg):
            continue
        name = arg.split("=", 1)[0]
        if name not in names:
            names.append(name)
    return names


def override_value(name: str, value: t.Any) -> str:
    # YAML turns 8 into an int: numbers are taken as their text; anything else is a mistake, not a removal
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise LaunchError("overrides: the value of %s is %r; give a string (an override replaces the value of an "
                      "argument, it never removes one)" % (name, value))


def apply_overrides(argv: t.Sequence[str], overrides: t.Mapping[str, t.Any]) -> list[str]:
    """``argv`` with the value of each argument named in ``overrides`` replaced, in both spellings (``--data X``,
    ``--data=X``), every occurrence. A name argv does not have is an error naming the arguments it has, so a typo
    is caught before anything is started."""
    out = list(argv)
    for name, raw in overrides.items():
        if not isinstance(name, str) or not name.startswith("-") or name in ("-", "--") or "=" in name:
            raise LaunchError("overrides: %r is not an argument name; give it as argv spells it (for example "
                              "--data)" % (name,))
        value = override_value(name, raw)
        found = False
        for index in range(1, len(out)):
            arg = out[index]
            if arg == name:
                following = out[index + 1] if index + 1 < len(out) else None
                # a flag (--no-gpu --data X) would otherwise have the next option's name replaced
                if following is None or following.startswith("--"):
                    raise LaunchError("overrides: %s takes no value in argv (%s), so there is none to replace" % (
                        name, "it is the last argument" if following is None else "%s follows it" % following))
                out[index + 1] = value
                found = True
            elif arg.startswith(name + "="):
                out[index] = name + "=" + value
                found = True
        if not found:
            raise LaunchError("overrides: argv has no argument %s; it has: %s" % (
                name, ", ".join(argument_names(argv)) or "none"))
    return out


def set_argument(argv: t.Sequence[str], name: str, value: str) -> list[str]:
    """``argv`` with argument ``name`` set to ``value``: replaced where it is (``--x V`` or ``--x=V``), else appended
    (a resume flag, which a first run does not have)."""
    if name in argument_names(argv):
        return apply_overrides(argv, {name: value})
    return list(argv) + [name, value]


def env_values(env: t.Mapping[str, t.Any], option: str = "env") -> dict[str, str]:
    """``env`` as names to strings; a name tmux -e or the job could not take is an error naming it."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise LaunchError("%s: %r is not an environment variable name" % (option, name))
        if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
            raise LaunchError("%s: the value of %s is %r; give a string" % (option, name, value))
        out[name] = str(value)
    return out


def name_problem(option: str, name: str, bad: str) -> str:
    if not name:
        return "%s must not be empty" % option
    found = sorted(set(name) & set(bad))
    if found:
        return "%s %r holds %s, which tmux rewrites or expands; choose a name without %s" % (
            option, name, " ".join(repr(c) for c in found), " ".join(repr(c) for c in bad))
    return ""


# ---------------------------------------------------------------- the tmux command

def version_problem(version: tuple[int, int] | None, new_session: bool, with_env: bool, session: str = "") -> str:
    """Why this tmux cannot run the launch ('' when it can; an unnumbered build is taken as recent)."""
    if version is None:
        return ""
    shown = "%d.%d" % version
    if version < MIN_TMUX:
        return ("tmux %s is too old: training_start needs tmux 3.0 or later (new-window -e, and the argument parsing "
                "it escapes for); upgrade tmux on the target" % shown)
    if new_session and with_env and version < NEW_SESSION_ENV_TMUX:
        return ("tmux %s cannot set the environment of a new session (new-session -e needs tmux 3.2): create the "
                "session first (tmux new-session -d -s %s) so that the job starts in a new window of it (new-window "
                "-e works from tmux 3.0), or upgrade tmux" % (shown, session or "SESSION"))
    return ""


def launch_plan(argv: t.Sequence[str], cwd: str, session: str, window: str, env: t.Mapping[str, str],
                session_exists: bool, window_index: int | None = None, run_as: str | None = None,
                socket: str | None = None) -> list[str]:
    """The one tmux command line that starts the job: a new session when there is none, else a new window of it at
    ``window_index`` (a free index: the operator's shell pane stays). No shell is involved anywhere.

    ``remain-on-exit`` is set in the same command list, so tmux sets it before it handles the job's exit, however
    fast that comes: the pane, its last lines and its exit status stay readable. A separate tmux call would race
    a job that dies at once (tmux does not handle a child's exit between the commands of one list).
    """
    options = ["-n", tmux_arg(window), "-c", tmux_arg(format_escape(cwd))]
    for name in sorted(env):
        options += ["-e", tmux_arg("%s=%s" % (name, env[name]))]
    command = ["--"] + [tmux_arg(arg) for arg in argv]
    if session_exists:
        if window_index is None:
            raise ValueError("a new window needs its index")
        target = "=%s:%d" % (session, window_index)
        create = ["new-window", "-d", "-P", "-F", NEW_PANE_FORMAT, "-t", tmux_arg(target)]
    else:
        target = "=%s:" % session
        create = ["new-session", "-d", "-P", "-F", NEW_PANE_FORMAT, "-s", tmux_arg(session)]
    keep_pane = [";", "set-option", "-w", "-t", tmux_arg(target), "remain-on-exit", "on"]
    return tmux_prefix(run_as, socket) + create + options + command + keep_pane


def plan_lines(command: t.Sequence[str], run_as: str | None, what: str) -> list[str]:
    lines = ["start as user %s through runuser (its own tmux server)" % run_as] if run_as else []
    return lines + [shlex.join(command), what]


# ---------------------------------------------------------------- the run

@dataclass
class Job:
    argv: list[str]
    cwd: str
    user: str
    env: dict[str, str]
    session: str
    window: str
    min_step: int | None
    run_as: str | None
    record: dict[str, t.Any] | None = None
    checkpoint: dict[str, t.Any] | None = None


def module_user() -> tuple[int, str]:
    uid = os.geteuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, str(uid)


def resolve_user(user: str, record_uid: t.Any, euid: int) -> str | None:
    """Whom to run tmux as through runuser (None: as this module); errors name the fix."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise LaunchError("user: no user %r on the target" % user) from None
    if isinstance(record_uid, int) and not isinstance(record_uid, bool) and record_uid != entry.pw_uid:
        raise LaunchError("user: %s is uid %d here, but the launch record says uid %d; give the command by hand "
                          "(argv, cwd, user) if that is right" % (user, entry.pw_uid, record_uid))
    if entry.pw_uid == euid:
        return None
    if euid != 0:
        raise LaunchError("user: starting the job as %s needs root (this module runs as uid %d); use become: true" % (
            user, euid))
    if shutil.which("runuser") is None:
        raise LaunchError("user: starting the job as %s needs runuser (util-linux), which is not installed" % user)
    return user


def resume_checkpoint(p: t.Mapping[str, t.Any], record: t.Mapping[str, t.Any] | None) -> dict[str, t.Any] | None:
    """The checkpoint to resume from: O(checkpoint), else the record's newest whole one (None: start without)."""
    if not p["resume_arg"]:
        return None
    if p["checkpoint"]:
        return {"path": p["checkpoint"], "step": step_from_name(os.path.basename(p["checkpoint"].rstrip("/")))}
    found = (record or {}).get("checkpoint")
    if isinstance(found, dict) and isinstance(found.get("path"), str) and found["path"]:
        return dict(found)
    return None


def resolve_job(p: t.Mapping[str, t.Any]) -> Job:
    """The command to run, from the launch record or the options, with overrides and env applied and checked."""
    path = p["record"]
    if not path and p["record_dir"] and not p["argv"]:
        if not p["tmux_session"]:
            raise LaunchError("tmux_session is required with record_dir: the record is <record_dir>/<tmux_session>.json")
        path = record_path(p["record_dir"], p["tmux_session"])
    record = None
    if path and p["user"]:
        raise LaunchError("user: the launch record names the user the job ran as; give the command by hand (argv, cwd, "
                          "user) to run it as another")
    if path:
        record = read_record(path, p["tmux_session"])
        argv, cwd, user, env = record["argv"], record["cwd"], record["user"], env_values(record.get("env") or {})
        session = p["tmux_session"] or record["tmux_session"]
        min_step = record_min_step(record)
        record_uid = record.get("uid")
    else:
        if not p["tmux_session"]:
            raise LaunchError("tmux_session is required when the command is given by hand (argv, cwd)")
        argv, cwd, user, env = list(p["argv"]), p["cwd"], p["user"] or module_user()[1], {}
        session, min_step, record_uid = p["tmux_session"], None, None
    if not argv or not all(isinstance(arg, str) and "\0" not in arg for arg in argv) or not argv[0]:
        raise LaunchError("argv must be a non-empty list of strings without NUL characters, got %r" % (argv,))
    env.update(env_values(p["env"] or {}))
    argv = apply_overrides(argv, p["overrides"] or {})
    checkpoint = resume_checkpoint(p, record)
    if checkpoint is not None:
        argv = set_argument(argv, p["resume_arg"], checkpoint["path"])
        if p["checkpoint"]:
            min_step = checkpoint["step"]
    if p["min_step"] is not None:
        min_step = p["min_step"]
    for option, name, bad in (("tmux_session", session, _SESSION_BAD), ("tmux_window", p["tmux_window"], _WINDOW_BAD)):
        problem = name_problem(option, name, bad)
        if problem:
            raise LaunchError(problem)
    if not os.path.isabs(cwd) or not os.path.isdir(cwd):
        # tmux would silently start the job somewhere else (the client's directory)
        raise LaunchError("cwd: %s is not an existing directory (given as an absolute path)" % cwd)
    run_as = resolve_user(user, record_uid, module_user()[0])
    return Job(argv, cwd, user, env, session, p["tmux_window"], min_step, run_as, record, checkpoint)


def new_result() -> dict[str, t.Any]:
    return dict(changed=False, argv=[], launched=False, already_running=False, tree=[], gpus_held=[], first_step=None,
                step_line="", pane_tail=[], exit_status=None, plan=[], elapsed=0.0, tmux_session=None, pane=None,
                min_step=None, notes=[], record=None, checkpoint=None)


def proof_text(job: Job, gpus: GpuWatch, step_regex: t.Pattern[str] | None, timeout: float) -> str:
    wants = []
    if gpus.targets:
        wants.append("GPU %s held by the job's processes" % ", ".join(target.wanted for target in gpus.targets))
    if step_regex is not None:
        wants.append("a step line above step %d" % job.min_step if job.min_step is not None else "a step line")
    return "wait up to %g s for %s" % (timeout, " and ".join(wants) if wants else "nothing but the job staying up")


def missing_text(job: Job, gpus: GpuWatch, seen: Watched, step_regex: t.Pattern[str] | None) -> str:
    held = {entry["gpu"] for entry in seen.held}
    missing = ["GPU %s not held by its processes" % ", ".join(g.wanted for g in gpus.targets if g.wanted not in held)
               ] if len(held) < len(gpus.targets) else []
    if step_regex is not None and seen.step is None:
        missing.append("no step line%s, %s" % (
            " above step %d" % job.min_step if job.min_step is not None else "",
            "none shown" if seen.last_step is None else "the last shown is step %d" % seen.last_step))
    return "; ".join(missing)


class _Start:
    """One run of the module: its options, the job and the result it fills in."""

    def __init__(self, p: t.Mapping[str, t.Any], check_mode: bool, diff: bool) -> None:
        self.p, self.check_mode, self.diff = p, check_mode, diff
        self.result = new_result()

    def fail(self, msg: str) -> dict[str, t.Any]:
        return dict(self.result, failed=True, msg=msg)

    def run(self) -> dict[str, t.Any]:
        p, result = self.p, self.result
        if p["timeout"] < 0 or p["interval"] <= 0:
            raise LaunchError("timeout must be >= 0 and interval > 0, got %s and %s" % (p["timeout"], p["interval"]))
        try:
            step_regex = re.compile(p["step_regex"]) if p["step_regex"] else None
        except re.error as exc:
            raise LaunchError("step_regex: %s" % exc) from None
        job = resolve_job(p)
        result.update(argv=job.argv, tmux_session=job.session, min_step=job.min_step, record=job.record,
                      checkpoint=job.checkpoint)
        tmux = Tmux(job.run_as, p["tmux_socket"])
        panes = tmux.panes(job.session)
        running = running_in_panes(panes, read_table(light=True), job.argv) if panes else []
        gpus = GpuWatch(p["gpus"], p["gpu_devices"])
        try:
            result["notes"] += gpus.notes
            if running:
                return self.follow(tmux, job, running, gpus, step_regex)
            return self.launch(tmux, job, panes, gpus, step_regex)
        finally:
            gpus.close()

    def follow(self, tmux: Tmux, job: Job, running: list[tuple[Pane, ProcessInfo]], gpus: GpuWatch,
               step_regex: t.Pattern[str] | None) -> dict[str, t.Any]:
        """The job already runs: nothing is launched; the same proof is waited for (check mode: one look)."""
        p, result = self.p, self.result
        pane, info = running[0]
        found = "already running: pid %d in pane %s (window %s); nothing to launch" % (
            info.pid, pane.pane_id, pane.window_name)
        result.update(already_running=True, pane=pane.pane_id,
                      plan=[found, proof_text(job, gpus, step_regex, p["timeout"])])
        if len(running) > 1:
            result["notes"].append("%d copies run in session %s: pids %s" % (
                len(running), job.session, ", ".join(str(i.pid) for _pane, i in running)))
        if self.diff:
            result["diff"] = dict(before=shlex.join(job.argv) + "\n", after=shlex.join(job.argv) + "\n")
        seen = watch(tmux, job.session, pane.pane_id, (info.pid, info.starttime), gpus, step_regex, job.min_step,
                     p["timeout"], p["interval"], one_look=self.check_mode)
        return self.outcome(tmux, job, gpus, seen, step_regex, launched=None)

    def launch(self, tmux: Tmux, job: Job, panes: list[Pane], gpus: GpuWatch,
               step_regex: t.Pattern[str] | None) -> dict[str, t.Any]:
        p, result = self.p, self.result
        problem = version_problem(tmux.version(), not panes, bool(job.env), job.session)
        if problem:
            raise LaunchError(problem)
        index = max(pane.window_index for pane in panes) + 1 if panes else None
        command = launch_plan(job.argv, job.cwd, job.session, job.window, job.env, bool(panes), index, job.run_as,
                              p["tmux_socket"])
        result["plan"] = plan_lines(command, job.run_as, proof_text(job, gpus, step_regex, p["timeout"]))
        busy = busy_holders(gpus.targets, gpus.holders()) if gpus.targets else []
        if busy:
            msg = "gpus: already held before the launch: %s; stop that job first (training_stop) or wait for it " \
                  "(gpu_free_wait)" % "; ".join(h.describe() for h in busy)
            if not self.check_mode:
                raise LaunchError(msg)
            # a dry run of stop-then-start stopped nothing: the old job still holds them
            result["notes"].append("check mode: " + msg)
        result["changed"] = True
        if self.diff:
            result["diff"] = dict(before="", after=shlex.join(job.argv) + "\n")
        if self.check_mode:
            return result
        done = tmux.run_argv(command)
        words = done.stdout.strip().split("\t")
        if len(words) != 3 or not words[0].startswith("%") or not words[1].isdigit():
            result["changed"] = False
            raise LaunchError("tmux did not start the job (rc %d): %s" % (
                done.returncode, (done.stderr or done.stdout).strip() or "no output"))
        result.update(launched=True, pane=words[0])
        if done.returncode != 0:
            result["notes"].append("tmux: %s" % done.stderr.strip())
        root = int(words[1])
        info = read_table(light=True).get(root)
        # the pane's process is the job itself (tmux execs the argv): no starttime means it is gone already
        seen = Watched(state="died") if info is None else watch(
            tmux, job.session, words[0], (root, info.starttime), gpus, step_regex, job.min_step, p["timeout"],
            p["interval"])
        return self.outcome(tmux, job, gpus, seen, step_regex, launched=words[2])

    def outcome(self, tmux: Tmux, job: Job, gpus: GpuWatch, seen: Watched, step_regex: t.Pattern[str] | None,
                launched: str | None) -> dict[str, t.Any]:
        """The result: success, or the failure with what was missing, the exit status and the last lines."""
        result = self.result
        result.update(tree=seen.tree, gpus_held=seen.held)
        if seen.step is not None:
            result.update(step_line=seen.step[0], first_step=seen.step[1])
        pane_id = result["pane"]
        if seen.state == "died":
            read_death(tmux, job.session, pane_id, seen)
            result.update(exit_status=seen.exit_status, pane_tail=seen.tail)
            if launched:
                # read: close it, so no dead pane keeps a PID that may be reused (a later stop selects by pane PID)
                tmux.run("kill-window", "-t", launched)
        elif launched:
            # proven or still running: from now on the window closes with the job, as one started by hand would
            tmux.run("set-option", "-w", "-t", launched, "remain-on-exit", "off")
        result["notes"] += [n for n in gpus.notes if n not in result["notes"]]
        if seen.state in ("proven", "sampled"):
            return result
        if seen.state == "timed_out":
            result["pane_tail"] = tail_lines(tmux.capture(pane_id, TAIL_LINES + 200) or "")
            return self.fail("the job runs (pid %d, pane %s of tmux session %s) but did not show within %g s that it "
                             "trains: %s. It was left running: look at its pane, or stop it with training_stop" % (
                                 seen.tree[0]["pid"] if seen.tree else 0, pane_id, job.session, self.p["timeout"],
                                 missing_text(job, gpus, seen, step_regex)))
        status = ("with status %d" % seen.exit_status if seen.exit_status is not None and seen.exit_status >= 0 else
                  "killed by signal %d" % -seen.exit_status if seen.exit_status is not None else
                  "(its exit status is unknown%s)" % (": its pane is gone" if seen.pane_gone else ""))
        last = last_output(seen.tail)
        return self.fail("the job exited %s before it showed that it trains: %s. Last lines: %s. Nothing was "
                         "retried%s; check that its GPUs are free again (gpu_free_wait) before the next start" % (
                             status, missing_text(job, gpus, seen, step_regex) or "nothing missing", last,
                             "; its window was closed, pane_tail has its last lines" if launched else ""))


def start_training(p: t.Mapping[str, t.Any], check_mode: bool = False, diff: bool = False,
                   started: float | None = None) -> dict[str, t.Any]:
    """Run ``training_start`` with its (already type-checked) options: the module's result, with ``failed`` and
    ``msg`` on failure."""
    started = time.monotonic() if started is None else started
    run = _Start(p, check_mode, diff)
    try:
        result = run.run()
    except (LaunchError, GpuError, TmuxError) as exc:
        result = run.fail(str(exc))
    result["elapsed"] = round(time.monotonic() - started, 3)
    return result
