"""Serving-unit changes a killed run wrote but never applied (``python -m datagen unapplied-units``).

The role writes the worker and router units and the workers' environment files, then reloads
systemd and restarts what changed. A run killed in between leaves files nothing applied: the
re-run's templates are "ok", so without this the workers would keep their old command line for
good. Two facts tell: systemd says it holds a stale definition (``NeedDaemonReload=yes``: reload),
and a running unit with a file newer than its main process was never restarted on it (restart).

The same answer names the units already started and enabled (``settled``): the role starts,
restarts or enables only the others, so a run that changes nothing makes no call to systemd per
worker (with 8 workers that was the slowest task of a re-run).

The role runs it on the node with the venv's interpreter and reads one JSON object,
``{"reload": bool, "restart": [unit, ...], "settled": [unit, ...]}``. Pure parsers and rules
first, thin readers after.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from datagen import units as systemd

UNIT_DIR = "/etc/systemd/system"
WORKER_TEMPLATE = "sglang-datagen-worker@.service"
ROUTER_UNIT = "sglang-datagen-router.service"
SHOW_PROPERTIES = ("NeedDaemonReload", "ActiveState", "MainPID", "UnitFileState")


def worker_unit(index: int) -> str:
    return f"sglang-datagen-worker@{index}.service"


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

def watched_files(home: str, worker_indexes: Iterable[int], router: bool,
                  api_key_file: Optional[str] = None, unit_dir: str = UNIT_DIR) -> Dict[str, List[str]]:
    """Each serving unit and the files it starts from (the role's serve.yml and api_key.yml write them).

    A worker instance reads the shared template unit and its own ``workers/worker-N.env``; the router
    its unit; both the API key's environment file when the workers take a key. Workers first, in the
    order given, then the router.
    """
    extra = [api_key_file] if api_key_file else []
    units = {worker_unit(i): [f"{unit_dir}/{WORKER_TEMPLATE}", f"{home}/workers/worker-{i}.env", *extra]
             for i in worker_indexes}
    if router:
        units[ROUTER_UNIT] = [f"{unit_dir}/{ROUTER_UNIT}", *extra]
    return units


def parse_show(text: str) -> UnitState:
    """``systemctl show -p NeedDaemonReload,ActiveState,MainPID,UnitFileState UNIT`` (``KEY=VALUE`` lines).

    A unit systemd does not know still shows ``ActiveState=inactive`` and ``MainPID=0``; a missing
    or unreadable value counts as "nothing to apply", never as an error.
    """
    props = systemd.parse_properties(text)
    try:
        pid = int(props.get("MainPID") or 0)
    except ValueError:
        pid = 0
    return UnitState(need_daemon_reload=props.get("NeedDaemonReload") == "yes",
                     active=props.get("ActiveState") == "active", main_pid=pid,
                     activating=props.get("ActiveState") == "activating",
                     enabled=props.get("UnitFileState") == "enabled")


# Twin of plugins/module_utils/_proc.py (parse_stat's starttime, boot_time): this package runs in
# the node's venv without the collection, so it keeps its own copy of these two readings;
# tests/unit/datagen/test_unapplied.py checks both give the same answer on the same text.
def parse_stat_starttime(text: str) -> int:
    """Field 22 of ``/proc/PID/stat``: the start in clock ticks after boot.

    ``comm`` may hold spaces and parentheses, so the fields are counted after its *last* ``)``.
    Raises ValueError when the line is not a stat line.
    """
    close_at = text.rfind(")")
    rest = text[close_at + 2:].split() if close_at >= 0 else []
    if len(rest) < 20:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    return int(rest[19])


def parse_boot_time(text: str) -> int:
    """``btime`` of ``/proc/stat``: the boot in seconds since the epoch. Raises ValueError without one."""
    for line in text.splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def started_at(boot_time: int, starttime_ticks: int, ticks_per_s: int) -> float:
    """A process's start in seconds since the epoch.

    btime is whole seconds, so this reads up to a second early: a file written just before the
    start may look newer (one needless restart), a file written after it always does.
    """
    return boot_time + starttime_ticks / ticks_per_s


def needs_restart(state: UnitState, process_start: Optional[float], mtimes: Iterable[Optional[float]]) -> bool:
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


def decide(states: Mapping[str, UnitState], restart: Iterable[str]) -> Dict[str, object]:
    """The JSON the role reads: reload when systemd holds any stale definition, the units to restart,
    and the units already started and enabled (a unit to restart is never among them)."""
    restart = list(restart)
    return {"reload": any(state.need_daemon_reload for state in states.values()), "restart": restart,
            "settled": [unit for unit, state in states.items() if is_settled(state) and unit not in restart]}


# ---------------------------------------------------------------- readers

def systemctl_show(unit: str) -> str:
    return systemd.systemctl_show(unit, SHOW_PROPERTIES)


def process_start(pid: int, proc_root: str = "/proc") -> Optional[float]:
    """When ``pid`` started (seconds since the epoch), or None when its ``/proc`` entry cannot be read."""
    try:
        with open(f"{proc_root}/stat", encoding="ascii", errors="replace") as fh:
            booted = parse_boot_time(fh.read())
        with open(f"{proc_root}/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            ticks = parse_stat_starttime(fh.read())
    except (OSError, ValueError):
        return None
    return started_at(booted, ticks, os.sysconf("SC_CLK_TCK"))


def mtime(path: str) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def find_unapplied(units: Mapping[str, Sequence[str]], show: Callable[[str], str] = systemctl_show,
                   proc_root: str = "/proc") -> Dict[str, object]:
    """Ask systemd about each unit and compare its files with its main process: :func:`decide`'s answer."""
    states = {unit: parse_show(show(unit)) for unit in units}
    restart = [unit for unit, state in states.items()
               if needs_restart(state, process_start(state.running_pid, proc_root) if state.running_pid else None,
                                [mtime(path) for path in units[unit]])]
    return decide(states, restart)
