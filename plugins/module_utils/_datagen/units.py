# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The systemd units of the role sglang_datagen, as ``systemctl show`` tells: ``sglang_units_info`` and
``datagen_pipeline_info``'s readings.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

Serving units. The role writes the worker and router units and the workers' environment files, then reloads
systemd and restarts what changed. A run killed in between leaves files nothing applied: the re-run's
templates are "ok", so without this the workers would keep their old command line for good. Two facts tell:
systemd says it holds a stale definition (``NeedDaemonReload=yes``: reload), and a running unit with a file
newer than its main process was never restarted on it (restart). The same answer names the units already
started and enabled (``settled``): the role starts, restarts or enables only the others, so a run that
changes nothing makes no call to systemd per worker.

The pipeline unit. What the role polls after it starts ``datagen-pipeline.service``: the unit's state and
how far the pipeline got past its start-up (``pipeline.ready.json``, which the pipeline writes).
"""

from __future__ import annotations

import json
import os
import subprocess
import typing as t
from dataclasses import dataclass

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import ProcError, boot_time, read_starttime

UNIT_DIR = "/etc/systemd/system"
WORKER_TEMPLATE = "sglang-datagen-worker@.service"
ROUTER_UNIT = "sglang-datagen-router.service"
SERVING_PROPERTIES = ("NeedDaemonReload", "ActiveState", "MainPID", "UnitFileState")
PIPELINE_UNIT = "datagen-pipeline.service"
PIPELINE_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts")
# the pipeline's own name for it (roles/sglang_datagen/files/datagen/paths.py READY)
READY_FILE = "pipeline.ready.json"
SHOW_TIMEOUT_S = 30.0

# unit, properties -> ``systemctl show`` output; raises UnitsError when systemctl cannot answer
Show = t.Callable[[str, t.Sequence[str]], str]


class UnitsError(Exception):
    """systemctl could not be asked."""


@dataclass(frozen=True)
class UnitState:
    """What ``systemctl show`` says about one unit, as far as applying changes goes."""

    need_daemon_reload: bool
    active: bool
    main_pid: int
    activating: bool = False
    enabled: bool = False

    @property
    def running_pid(self) -> int:
        """The main process of an active unit; 0 when there is none to compare files with."""
        return self.main_pid if self.active and self.main_pid > 0 else 0


# ---------------------------------------------------------------- pure: layout, parsers, rules

def worker_unit(index: int) -> str:
    return "sglang-datagen-worker@%d.service" % index


def watched_files(home: str, worker_indexes: t.Iterable[int], router: bool, api_key_file: t.Optional[str] = None,
                  unit_dir: str = UNIT_DIR) -> t.Dict[str, t.List[str]]:
    """Each serving unit and the files it starts from (the role's serve.yml and api_key.yml write them).

    A worker instance reads the shared template unit and its own ``workers/worker-N.env``; the router
    its unit; both the API key's environment file when the workers take a key. Workers first, in the
    order given, then the router.
    """
    extra = [api_key_file] if api_key_file else []
    units = {worker_unit(i): ["%s/%s" % (unit_dir, WORKER_TEMPLATE), "%s/workers/worker-%d.env" % (home, i)] + extra
             for i in worker_indexes}
    if router:
        units[ROUTER_UNIT] = ["%s/%s" % (unit_dir, ROUTER_UNIT)] + extra
    return units


def parse_properties(text: str) -> t.Dict[str, str]:
    """``systemctl show`` output (``KEY=VALUE`` lines; a value may itself hold ``=``) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_show(text: str) -> UnitState:
    """``systemctl show -p NeedDaemonReload,ActiveState,MainPID,UnitFileState UNIT``.

    A unit systemd does not know still shows ``ActiveState=inactive`` and ``MainPID=0``; a missing
    or unreadable value counts as "nothing to apply", never as an error.
    """
    props = parse_properties(text)
    try:
        pid = int(props.get("MainPID") or 0)
    except ValueError:
        pid = 0
    return UnitState(need_daemon_reload=props.get("NeedDaemonReload") == "yes",
                     active=props.get("ActiveState") == "active", main_pid=pid,
                     activating=props.get("ActiveState") == "activating",
                     enabled=props.get("UnitFileState") == "enabled")


def parse_ready(text: t.Optional[str]) -> t.Dict[str, t.Any]:
    """``pipeline.ready.json``; {} when it is not there (yet) or not a JSON object."""
    if text is None:
        return {}
    try:
        ready = json.loads(text)
    except ValueError:
        return {}
    return ready if isinstance(ready, dict) else {}


def started_at(boot: float, starttime_ticks: int, ticks_per_s: int) -> float:
    """A process's start in seconds since the epoch.

    btime is whole seconds, so this reads up to a second early: a file written just before the
    start may look newer (one needless restart), a file written after it always does.
    """
    return boot + starttime_ticks / ticks_per_s


def needs_restart(state: UnitState, process_start: t.Optional[float], mtimes: t.Iterable[t.Optional[float]]) -> bool:
    """A running unit whose unit or environment file changed after its main process started.

    ``process_start`` is None when the process could not be read (gone, not ours): no restart on a
    guess. A missing file (``None`` mtime) changes nothing.
    """
    if not state.running_pid or process_start is None:
        return False
    return any(mtime is not None and mtime > process_start for mtime in mtimes)


def is_settled(state: UnitState) -> bool:
    """A unit that ``systemd_service: state=started enabled=true`` would leave as it is.

    Follows ansible.builtin.systemd_service: ``started`` starts a unit unless its ActiveState is
    ``active`` or ``activating`` (is_running_service), and ``enabled`` enables one unless
    ``systemctl is-enabled`` says so. Only plain ``enabled`` counts here; any other file state
    (``enabled-runtime``, ``indirect``, ``static``, ...) leaves the call to the module, which
    decides as it always did: this list may only ever skip calls that would change nothing.
    """
    return (state.active or state.activating) and state.enabled


def decide(states: t.Mapping[str, UnitState], restart: t.Iterable[str]) -> t.Dict[str, t.Any]:
    """Reload when systemd holds any stale definition, the units to restart, and the units already started and
    enabled (a unit to restart is never among them)."""
    restart = list(restart)
    return {"reload": any(state.need_daemon_reload for state in states.values()), "restart": restart,
            "settled": [unit for unit, state in states.items() if is_settled(state) and unit not in restart]}


# ---------------------------------------------------------------- readers

def systemctl_show(unit: str, properties: t.Sequence[str]) -> str:
    """``systemctl show -p PROPS UNIT`` (bounded: systemd may hang on a bus timeout)."""
    argv = ["systemctl", "show", "-p", ",".join(properties), unit]
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=SHOW_TIMEOUT_S).stdout
    except FileNotFoundError:
        raise UnitsError("systemctl not found: this module needs a systemd node") from None
    except subprocess.TimeoutExpired:
        raise UnitsError("`%s` did not answer within %.0f s; check that systemd is responsive (systemctl status) "
                         "and run again" % (" ".join(argv), SHOW_TIMEOUT_S)) from None


def process_start(pid: int, proc_root: str = "/proc") -> t.Optional[float]:
    """When PID started (seconds since the epoch), or None when its ``/proc`` entry cannot be read."""
    try:
        ticks = read_starttime(pid, proc_root)
        booted = boot_time(proc_root)
    except (OSError, ProcError, ValueError):
        return None
    return None if ticks is None else started_at(booted, ticks, os.sysconf("SC_CLK_TCK"))


def mtime(path: str) -> t.Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def find_unapplied(units: t.Mapping[str, t.Sequence[str]], show: Show = systemctl_show,
                   proc_root: str = "/proc") -> t.Dict[str, t.Any]:
    """Ask systemd about each unit and compare its files with its main process: :func:`decide`'s answer."""
    states = {unit: parse_show(show(unit, SERVING_PROPERTIES)) for unit in units}
    restart = [unit for unit, state in states.items()
               if needs_restart(state, process_start(state.running_pid, proc_root) if state.running_pid else None,
                                [mtime(path) for path in units[unit]])]
    return decide(states, restart)


def read_ready(work_dir: str) -> t.Optional[str]:
    try:
        with open(os.path.join(work_dir, READY_FILE), encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def pipeline_state(work_dir: str, show: Show = systemctl_show) -> t.Dict[str, t.Any]:
    """``{"unit": {ActiveState, SubState, Result, NRestarts}, "ready": pipeline.ready.json or {}}``."""
    return {"unit": parse_properties(show(PIPELINE_UNIT, PIPELINE_PROPERTIES)), "ready": parse_ready(read_ready(work_dir))}


# ---------------------------------------------------------------- runners

def serving_units(p: t.Mapping[str, t.Any], show: Show = systemctl_show, proc_root: str = "/proc") -> t.Dict[str, t.Any]:
    """``sglang_units_info``'s runner: ``{reload, restart, settled}``; ``failed`` when systemctl cannot answer."""
    watched = watched_files(p["home"], p["workers"], p["router"], p.get("api_key_file"), p["unit_dir"])
    try:
        return dict(find_unapplied(watched, show, proc_root), changed=False)
    except UnitsError as exc:
        return {"failed": True, "msg": str(exc)}


def pipeline_info(p: t.Mapping[str, t.Any], show: Show = systemctl_show) -> t.Dict[str, t.Any]:
    """``datagen_pipeline_info``'s runner: ``{unit, ready}``; ``failed`` when systemctl cannot answer."""
    try:
        return dict(pipeline_state(p["work_dir"], show), changed=False)
    except UnitsError as exc:
        return {"failed": True, "msg": str(exc)}
