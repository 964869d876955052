# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Ladder overhead of ``training_stop`` against a 1 s poll loop doing the same job, side by side.

Run standalone: ``.venv/bin/python -m tests.bench.bench_training_stop [--repeat N] [--workers N]``.

Each trial builds a fresh torchrun-shaped tree (a launcher plus workers, each
worker in its own session) whose exit time is known:

* ``graceful``: on SIGINT the launcher waits ``--exit-delay`` seconds, then
  SIGTERMs its workers (they exit at once) and exits. Known time: the delay.
  One rung does the work.
* ``stubborn``: every process ignores SIGINT and SIGTERM; the ladder is
  SIGINT (``--rung``), SIGTERM (``--rung``), SIGKILL. Known time: the two
  rung timeouts. Three rungs.

Overhead = measured time - known time, for:

* ``module``: the real module in its own process, timed from its own start
  (``elapsed`` in its result; the same clock the rungs use), and
* ``module+python``: the wall time of the whole module process, interpreter
  and ansible imports included (what a task adds apart from the connection),
* ``poll 1s``: the incident's way, automated: send the signal, sleep 1 s, look
  with ``kill -0`` + start time, escalate after the same timeouts.

Runs alternate module / poll loop, so both see the same machine load; the
report gives medians and the poll/module ratio. The goal is < 50 ms of
overhead per rung for the module.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time

from tests.support.module import run_module

TREE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    mode, workers, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stamps = sys.argv[4] if len(sys.argv) > 4 else None
    if mode == "worker-graceful":
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    if mode == "worker-stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    kids = [subprocess.Popen([sys.executable, sys.argv[0], "worker-" + mode, "0", "0"],
                             start_new_session=True) for _ in range(workers)]
    def stop(signum, frame):
        got = time.monotonic()
        time.sleep(delay)
        for kid in kids:
            kid.terminate()
        for kid in kids:
            kid.wait()
        with open(stamps, "w") as handle:  # CLOCK_MONOTONIC is system-wide: the bench compares it
            handle.write("%r %r" % (got, time.monotonic()))
        os._exit(0)
    if mode == "graceful":
        signal.signal(signal.SIGINT, stop)
    else:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(" ".join(str(k.pid) for k in kids), flush=True)
    while True:
        time.sleep(3600)
""")


def starttime(pid: int) -> int | None:
    try:
        with open("/proc/%d/stat" % pid) as handle:
            rest = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if rest[0] in ("Z", "X") else int(rest[19])


class Tree:
    def __init__(self, workdir: str, mode: str, workers: int, delay: float) -> None:
        self.script = os.path.join(workdir, "bench_tree_%d.py" % os.getpid())
        self.stamps = os.path.join(workdir, "bench_tree_%d.stamps" % os.getpid())
        if os.path.exists(self.stamps):
            os.unlink(self.stamps)
        with open(self.script, "w") as handle:
            handle.write(TREE)
        self.proc = subprocess.Popen([sys.executable, self.script, mode, str(workers), str(delay), self.stamps],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
        kids = [int(x) for x in self.proc.stdout.readline().split()]
        self.pids = [self.proc.pid] + kids
        self.ids = {pid: starttime(pid) for pid in self.pids}

    def actual(self) -> float:
        """Seconds the tree really took from receiving SIGINT to its exit (its own teardown included)."""
        with open(self.stamps) as handle:
            got, gone = (float(x) for x in handle.read().split())
        return gone - got

    def alive(self) -> list[int]:
        return [pid for pid, start in self.ids.items() if start is not None and starttime(pid) == start]

    def cleanup(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


def run_stop_module(args: dict) -> tuple[dict, float]:
    """training_stop's result for ARGS and the wall time of its whole process."""
    t0 = time.monotonic()
    result = run_module("training_stop", args)
    wall = time.monotonic() - t0
    if result.get("failed"):
        raise SystemExit("module failed: %s" % result.get("msg"))
    return result, wall


def poll_loop(tree: Tree, rungs: list[tuple[int, float]], interval: float = 1.0) -> float:
    """The operator's loop, automated: signal, then look once a second until gone or the rung's time is up."""
    t0 = time.monotonic()
    for index, (signum, timeout) in enumerate(rungs):
        targets = [tree.proc.pid] if index == 0 else tree.alive()
        for pid in targets:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        rung_start = time.monotonic()
        while True:
            time.sleep(interval)
            if not tree.alive():
                return time.monotonic() - t0
            if time.monotonic() - rung_start >= timeout:
                break
    raise SystemExit("poll loop: processes survived")


def trial(workdir: str, scenario: str, args: argparse.Namespace) -> dict[str, float]:
    if scenario == "graceful":
        mode = "graceful"
        ladder = [{"signal": "SIGINT", "timeout": 30}, {"signal": "SIGTERM", "timeout": 10},
                  {"signal": "SIGKILL", "timeout": 10}]
        poll_rungs = [(signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)]
        climbed = 1
    else:
        mode = "stubborn"
        ladder = [{"signal": "SIGINT", "timeout": args.rung}, {"signal": "SIGTERM", "timeout": args.rung},
                  {"signal": "SIGKILL", "timeout": 10}]
        poll_rungs = [(signal.SIGINT, args.rung), (signal.SIGTERM, args.rung), (signal.SIGKILL, 10.0)]
        climbed = 3
    out: dict[str, float] = {"rungs": climbed}
    tree = Tree(workdir, mode, args.workers, args.exit_delay)
    try:
        result, wall = run_stop_module({"pids": [tree.proc.pid], "ladder": ladder})
        assert not tree.alive() and result["stopped_by_index"] == climbed - 1, result
        known = tree.actual() if mode == "graceful" else 2 * args.rung
        rungs = result["rungs"]
        out["select"] = rungs[0]["sent_at"]
        # from the first signal until the module saw the last exit, minus what the tree itself took
        out["ladder"] = rungs[-1]["ended_at"] - rungs[0]["sent_at"] - known
        out["module"] = result["elapsed"] - known
        out["module+python"] = wall - known
    finally:
        tree.cleanup()
    tree = Tree(workdir, mode, args.workers, args.exit_delay)
    try:
        measured = poll_loop(tree, poll_rungs)
        out["poll 1s"] = measured - (tree.actual() if mode == "graceful" else 2 * args.rung)
    finally:
        tree.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--exit-delay", type=float, default=0.3, help="graceful tree: seconds from SIGINT to exit")
    parser.add_argument("--rung", type=float, default=0.3, help="stubborn tree: timeout of the SIGINT and SIGTERM rungs")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON too")
    args = parser.parse_args(argv)
    workdir = os.environ.get("TMPDIR", "/tmp")
    report = {}
    print("training_stop ladder overhead, %d workers, %d trials each (medians; overhead = measured - known)" % (
        args.workers, args.repeat))
    print("%-10s %5s %10s %14s %11s %14s %11s %9s" % (
        "scenario", "rungs", "select ms", "ladder ms/rung", "module ms", "module+py ms", "poll 1s ms", "poll/mod"))
    ok = True
    for scenario in ("graceful", "stubborn"):
        trials = [trial(workdir, scenario, args) for _trial in range(args.repeat)]
        keys = ("select", "ladder", "module", "module+python", "poll 1s")
        med = {key: statistics.median(t[key] for t in trials) for key in keys}
        rungs = int(trials[0]["rungs"])
        per_rung = med["ladder"] / rungs
        ratio = med["poll 1s"] / med["module"] if med["module"] > 0 else float("inf")
        ok = ok and per_rung < 0.050
        report[scenario] = dict(med, rungs=rungs, per_rung=per_rung, ratio=ratio)
        print("%-10s %5d %10.1f %14.1f %11.1f %14.1f %11.1f %8.1fx" % (
            scenario, rungs, med["select"] * 1000, per_rung * 1000, med["module"] * 1000,
            med["module+python"] * 1000, med["poll 1s"] * 1000, ratio))
    print("select: before the first signal (snapshot of /proc); ladder: first signal to last exit seen, minus\n"
          "the tree's own time; module: all of it from the module's start; module+py: the whole process.")
    print("goal: < 50 ms overhead per rung for the module: %s" % ("met" if ok else "NOT met"))
    if args.json:
        print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
