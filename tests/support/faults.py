"""The fault suite's figures ledger (tests/faults): what was injected, what survived, what was lost."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, List

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
