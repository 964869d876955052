"""The fault suite's plumbing (tests/faults): the injection points (:class:`Fault`: a fault, a point, an
assertion; :func:`run`, :func:`each`) and the figures ledger (:class:`Figures`: what was injected, what survived,
what was lost)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

import pytest

from tests.support import playbook

FIGURES = os.environ.get("GPUOPS_FAULTS_FIGURES", "/tmp/gpuops-faults-figures.json")
# an xdist worker (one per lab lane) keeps its own file beside it; the controller merges them (merge)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    FIGURES = "%s.%s.json" % (FIGURES[:-5] if FIGURES.endswith(".json") else FIGURES, _WORKER)
# the repetition over points (every k, every rung); without it CI runs each fault kind at its chosen points
FULL = os.environ.get("GPUOPS_FAULTS_FULL") == "1"


class Figures:
    """One ledger per session: each injected fault, whether the run came through, rows lost,
    processes wrongly signalled, and each bounded wait against its bound."""

    def __init__(self, path: str = FIGURES) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.faults: Dict[str, Dict[str, Any]] = {}
        self.waits: List[Dict[str, Any]] = []
        self.notes: Dict[str, Any] = {}

    def injected(self, name: str) -> None:
        with self.lock:
            self.faults.setdefault(name, {"injected": 0, "survived": 0, "rows_lost": 0, "wrongly_signalled": 0})
            self.faults[name]["injected"] += 1
        self.save()  # a run cut short (a CI timeout) still leaves its figures

    def survived(self, name: str, rows_lost: int = 0, wrongly_signalled: int = 0) -> None:
        with self.lock:
            f = self.faults[name]
            f["survived"] += 1
            f["rows_lost"] += rows_lost
            f["wrongly_signalled"] += wrongly_signalled
        self.save()

    def failed(self, name: str, reason: str) -> None:
        """A point that did not come through, with why (kept in the figures file at once)."""
        with self.lock:
            self.faults.setdefault(name, {"injected": 0, "survived": 0, "rows_lost": 0, "wrongly_signalled": 0})
            self.faults[name]["failure"] = reason[:3000]
        self.save()

    def note(self, key: str, value: Any) -> None:
        with self.lock:
            self.notes[key] = value
        self.save()

    def wait(self, name: str, seconds: float, bound: float) -> None:
        """Record one bounded wait, then hold it to its bound: a wait past its documented bound fails the
        test that measured it (the figure is kept either way)."""
        with self.lock:
            self.waits.append({"wait": name, "seconds": round(seconds, 2), "bound": bound})
        self.save()
        assert seconds <= bound, "%s took %.2f s, past its bound of %.2f s" % (name, seconds, bound)

    def as_dict(self) -> Dict[str, Any]:
        with self.lock:
            return {"faults": json.loads(json.dumps(self.faults)), "waits": list(self.waits), "notes": dict(self.notes)}

    def merge(self, other: Dict[str, Any]) -> None:
        """Add another ledger's figures (:meth:`as_dict`: an xdist worker's) to this one."""
        with self.lock:
            for name, fig in other.get("faults", {}).items():
                mine = self.faults.setdefault(name, {"injected": 0, "survived": 0, "rows_lost": 0,
                                                     "wrongly_signalled": 0})
                for key in ("injected", "survived", "rows_lost", "wrongly_signalled"):
                    mine[key] += fig.get(key, 0)
                if "failure" in fig:
                    mine["failure"] = fig["failure"]
            self.waits.extend(other.get("waits", []))
            self.notes.update(other.get("notes", {}))
        self.save()

    def totals(self) -> Dict[str, Any]:
        longest = max(self.waits, key=lambda w: w["seconds"] / w["bound"], default=None)
        return {
            "faults_injected": sum(f["injected"] for f in self.faults.values()),
            "survived": sum(f["survived"] for f in self.faults.values()),
            "rows_lost": sum(f["rows_lost"] for f in self.faults.values()),
            "processes_wrongly_signalled": sum(f["wrongly_signalled"] for f in self.faults.values()),
            "longest_wait_vs_bound": longest,
        }

    def save(self) -> None:
        with self.lock:
            self._save(self.path)

    def _save(self, path: str) -> None:
        data = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "totals": self.totals(),
                "faults": self.faults, "waits": self.waits,
                "notes": self.notes}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)


# ---------------------------------------------------------------- the injection points

@dataclass(frozen=True)
class Fault:
    """One row of a fault table: a fault, the point where it lands, and what must hold after it.

    ``inject(ctx)`` brings the run to the point, lands the fault there and returns what the check needs;
    ``check(ctx, landed)`` asserts what must hold after it and returns the ledger's counts (``rows_lost``,
    ``wrongly_signalled``) or None. ``at`` holds the point's parameters a test reads to set it up (a stage, a
    rung, a trainer). CI runs the rows with ``ci``; ``GPUOPS_FAULTS_FULL=1`` runs them all. A fault file is a
    table of these and one test that runs each row through :func:`run`: adding a fault is one row and its injector.
    """

    fault: str
    point: str
    inject: Callable[[Any], Any]
    check: Callable[[Any, Any], Optional[Mapping[str, int]]]
    at: Mapping[str, Any] = field(default_factory=dict)
    ci: bool = True

    @property
    def name(self) -> str:
        """The row's key in the figures ledger."""
        return "%s: %s" % (self.fault, self.point)

    @property
    def id(self) -> str:
        """The row's pytest id."""
        return re.sub(r"[^A-Za-z0-9]+", "_", "%s-%s" % (self.fault, self.point)).strip("_")


def table(rows: Sequence[Fault]) -> List[Any]:
    """The ROWS this run takes (all in full mode, else those with ``ci``) as pytest params named by their ids."""
    return [pytest.param(row, id=row.id) for row in rows if FULL or row.ci]


def run(figures: Figures, row: Fault, ctx: Any) -> Any:
    """Land ROW's fault at its point (its injector), then check what must hold after it; the ledger records it
    injected, then survived with the check's counts, or failed with why (the AssertionError is raised on).
    What the injector returned."""
    try:
        landed = row.inject(ctx)
        figures.injected(row.name)
        counts = row.check(ctx, landed) or {}
    except AssertionError as exc:
        figures.failed(row.name, str(exc))
        raise
    figures.survived(row.name, **counts)
    return landed


def each(figures: Figures, rows: Iterable[Fault], ctx: Any,
         on_failure: Optional[Callable[[Fault], None]] = None) -> None:
    """:func:`run` every one of ROWS in turn (a loop of points, read lazily: a generator may pick the next point
    from what the last one showed). A point that fails does not stop the loop (ON_FAILURE(row) puts things back
    for the next); at the end every failure is asserted at once."""
    failures: List[str] = []
    for row in rows:
        try:
            run(figures, row, ctx)
        except AssertionError as exc:
            failures.append(("%s: %s" % (row.name, exc))[:2000])
            if on_failure is not None:
                on_failure(row)
    assert not failures, "\n\n".join(failures)


# ---------------------------------------------------------------- the injectors several fault files share

def controller_killed(proc: subprocess.Popen, done: Callable[[List[str]], bool], *, delay: float = 0.0,
                      timeout: float = 300, with_workers: bool = True, before_kill: Optional[Callable[[], None]] = None,
                      quiet_after: bool = True) -> List[str]:
    """The controller lost: ``ansible-playbook`` PROC (:func:`playbook.start_playbook`) SIGKILLed whole (its process
    group and, WITH_WORKERS, every descendant: ansible-core 2.19's workers ``setsid`` out of the group) DELAY s
    after DONE(banners so far) holds, BEFORE_KILL() having run; the banners. AssertionError when the play ended
    before the point or, with QUIET_AFTER, printed a task or its recap after it (the kill landed late)."""
    try:
        seen = playbook.banners_until(proc, done, timeout=timeout)
        if done(seen):
            time.sleep(delay)
            if before_kill is not None:
                before_kill()
    finally:
        playbook.kill_playbook(proc, with_workers)
    if not done(seen) or quiet_after:  # not otherwise: a worker left out of the kill may hold the pipe a while
        tail = proc.stdout.read() if proc.stdout else ""
        assert done(seen), "the play ended after %d tasks, before the kill point: %s\n%s" % (
            len(seen), seen[-5:], tail[-3000:])
        assert "TASK [" not in tail and "PLAY RECAP" not in tail, "the play went on past the kill:\n%s" % tail[-2000:]
    return seen
