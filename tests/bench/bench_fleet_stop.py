# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Benchmark: the stop half on two containers vs one, side by side on the two-node lab.

    .venv/bin/python -m tests.bench.bench_fleet_stop [--rounds 3] [--forks 2] [--json FILE] [--check]

Needs the two-node lab (``tests/lab/lab up --nodes 2``: CT200 behind lab-pve on 127.0.0.1:2222, CT210
behind lab-pve2 on 127.0.0.1:2223, in lane 0; ``GPUOPS_LAB_LANE`` picks another lab lane); it never brings it
up or down. Every run is the real ``playbooks/repurpose_ct200.yml`` with ``inventories/lab-fleet`` (the lane's
rendering of it), stop half only (``repurpose_datagen=false``, the lab suites' short ladder,
tests/support/stop_training.py ``FAST``), ``--forks`` (2) for every variant but ``serial``:

  ct200   ``--limit ct200``: one container
  ct210   ``--limit ct210``: the other one alone (the two nodes are not identical: both singles are measured)
  both    both containers in one run, in parallel (forks)
  serial  both containers in one run with ``--forks 1`` (each task on one host, then the other): the
          baseline, what the parallel run saves

Variants run interleaved round by round, their order rotated each round, so machine load hits all alike.
Before each run the trainers the previous run stopped are restarted (tests/support/lab.py ``trainer``, the
graceful one, as tests/integration/test_fleet_stop.py does): every run starts with both trainers running,
so the machine carries the same load whichever variant runs. After each run the bench checks that exactly
the variant's trainers were stopped, each host's run ended without a failure, and GPUs free was proved.

Measured per run: ``wall``, the whole ``ansible-playbook`` process (what a user waits for: start-up, the
validation pass, the stop, the fleet summary), and ``play``, the repurpose play's own span from the JSON
callback. The report gives medians per variant and the ratio both / one, against the slower single
(parallel stops end with the slower one) and against the two singles pooled. Goal (issue 15): the wall
time on two containers stays close to one container's, <= 1.3x.

Measured here (2 shared cores, other work running; medians of 5 rounds, forks 2, about 5 minutes):

  variant   wall s   play s
  ct200       9.33     7.36
  ct210      10.09     7.69
  both       12.26     9.35     1.22x the slower single (wall and play); 1.28x in an earlier 3-round run
  serial     16.33    12.68     1.33x the parallel run

Two containers cost about a fifth more than one, not double: the stops run at once, each under its own
lock. The fifth is most likely the CPU (two forks' ansible workers, ssh and pct hops on two shared
cores); this bench does not break it down by task.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

from tests.bench.goals import finish, goal_flags
from tests.support.lab import MAIN_CT, NODE2_CT, fleet_skip_reason, lab_status, trainer
from tests.support.paths import FLEET_INVENTORY
from tests.support.playbook import callback_seconds, run_playbook
from tests.support.stop_training import FAST, REPURPOSE_PLAYBOOK

HOSTS = {"ct200": MAIN_CT, "ct210": NODE2_CT}
BOTH = ("ct200", "ct210")
# name: (hosts, forks; None: --forks)
VARIANTS: Dict[str, Tuple[Tuple[str, ...], Optional[int]]] = {
    "ct200": (("ct200",), None), "ct210": (("ct210",), None), "both": (BOTH, None), "serial": (BOTH, 1)}
GOAL = 1.3


def fleet_or_exit() -> dict:
    """The two-node lab's status; exit naming the reason when a fleet lab test would be skipped."""
    status = lab_status()
    reason = fleet_skip_reason(status)
    if reason:
        sys.exit("bench_fleet_stop: " + reason)
    assert status is not None
    return status


def running(status: dict) -> Dict[str, bool]:
    """Whether each inventory host's trainer runs, from ``tests/lab/lab status``."""
    return {"ct200": bool(status["trainer"]["running"]), "ct210": bool(status["node2"]["trainer"]["running"])}


def stop_once(hosts: Tuple[str, ...], forks: int) -> Dict[str, float]:
    """One stop-half run on HOSTS; its wall and play seconds. Exits when it did not stop exactly HOSTS."""
    t0 = time.monotonic()
    done = run_playbook(REPURPOSE_PLAYBOOK, FLEET_INVENTORY, [FAST],
                        ["--limit", ",".join(hosts), "--forks", str(forks)], json_results=True, timeout=600)
    wall = time.monotonic() - t0
    data = done.json
    stats = data["stats"]
    bad = {h: s for h, s in stats.items() if s.get("failures") or s.get("unreachable")}
    if done.rc != 0 or bad or sorted(stats) != sorted(hosts):
        raise SystemExit("bench_fleet_stop: the run on %s failed (rc %s): %s\n%s"
                         % (",".join(hosts), done.rc, bad or sorted(stats), done.stderr[-2000:]))
    # the stop half's own verdict, per host: training stopped and GPUs free (roles/stop_training report.yml)
    for play in data["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith("Report | Judge the outcome"):
                for host, res in task["hosts"].items():
                    # a bool, or its text where the template rendered one
                    if str(res.get("ansible_facts", {}).get("stop_training__ok")).strip().lower() != "true":
                        raise SystemExit("bench_fleet_stop: %s: the stop half judged its outcome not ok" % host)
    left = running(lab_status() or {})
    if any(left[h] for h in hosts) or not all(left[h] for h in HOSTS if h not in hosts):
        raise SystemExit("bench_fleet_stop: after stopping %s the trainers running are %s" % (",".join(hosts), left))
    repurpose = next(p for p in data["plays"] if p["play"]["name"].startswith("Repurpose"))
    span = repurpose["play"]["duration"]
    return {"wall": wall, "play": callback_seconds(span["end"]) - callback_seconds(span["start"])}


def ratios(med: Dict[str, Dict[str, float]], pooled: Dict[str, float]) -> Dict[str, float]:
    return {"both/slower_single_wall": med["both"]["wall"] / max(med["ct200"]["wall"], med["ct210"]["wall"]),
            "both/singles_wall": med["both"]["wall"] / pooled["wall"],
            "both/slower_single_play": med["both"]["play"] / max(med["ct200"]["play"], med["ct210"]["play"]),
            "both/singles_play": med["both"]["play"] / pooled["play"],
            "serial/both_wall": med["serial"]["wall"] / med["both"]["wall"]}


def main() -> int:
    ap = goal_flags(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--rounds", type=int, default=3, help="runs of each variant")
    ap.add_argument("--forks", type=int, default=2, help="ansible-playbook --forks, every variant (>= 2)")
    args = ap.parse_args()
    if args.forks < 2:
        ap.error("--forks must be >= 2 (the two containers are stopped in parallel); got %d" % args.forks)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1; got %d" % args.rounds)
    fleet_or_exit()
    samples: Dict[str, List[Dict[str, float]]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    stopped = list(HOSTS)  # restart both before the first run: a known start, trainers fresh
    try:
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                hosts, forks = VARIANTS[name]
                for host in stopped:
                    trainer("graceful", HOSTS[host])
                res = stop_once(hosts, forks or args.forks)
                stopped = list(hosts)
                samples[name].append(res)
                print("round %d  %-6s wall %6.2f s  play %6.2f s" % (rnd + 1, name, res["wall"], res["play"]),
                      flush=True)
    finally:
        # leave the lab as the suites expect it, whatever happened: both graceful trainers running
        left = running(lab_status() or {"trainer": {}, "node2": {"trainer": {}}})
        for host in HOSTS:
            if not left[host]:
                trainer("graceful", HOSTS[host])
    med = {n: {k: statistics.median(s[k] for s in samples[n]) for k in ("wall", "play")} for n in names}
    singles = samples["ct200"] + samples["ct210"]
    pooled = {k: statistics.median(s[k] for s in singles) for k in ("wall", "play")}
    print("\n%-8s %10s %10s %6s" % ("variant", "wall s", "play s", "runs"))
    for n in names:
        print("%-8s %10.2f %10.2f %6d" % (n, med[n]["wall"], med[n]["play"], len(samples[n])))
    r = ratios(med, pooled)
    print()
    for k, v in r.items():
        print("%-26s %6.2fx" % (k, v))
    summary = {"forks": args.forks, "rounds": args.rounds, "median_s": med, "singles_pooled_s": pooled, "ratios": r,
               "samples": samples}
    goal = "two containers' wall time <= %.1fx one container's (the slower single)" % GOAL
    return finish(summary, {goal: r["both/slower_single_wall"] <= GOAL}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
