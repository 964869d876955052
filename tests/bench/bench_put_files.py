# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Benchmark: a re-run's check of the same files in CT200, one copy task per file vs the role's file group.

    .venv/bin/python -m tests.bench.bench_put_files [--files 12] [--rounds 5] [--json FILE] [--check]

Both contenders put the same FILES small text files (half rendered content, half controller files) in a
scratch directory of CT200, through the lab inventory's ct200 (pct_ssh), and each round first writes them
once so that what is measured is the no-op a re-run pays:

  per_file   one ansible.builtin.copy task per file, as the role did before (the baseline)
  group      gpuops.repurpose.put_files: sha1 sums read on the controller, one find on the node

The contenders run interleaved round by round, their order swapped each round, so machine load hits both
alike. Measured per run: the play's span from the JSON callback (the check alone, no ansible-playbook
start-up). After each run the bench checks that nothing was changed. Goal: the group's no-op is at least
3x faster than per_file at 12 files (the role's single files on the lab's eight workers).

Measured here (2 shared cores; medians of 5 rounds, 12 files, about 3 minutes):

  per_file   17.03 s   (1.42 s a file: a remote stat, a remote file module, the task's own overhead)
  group       1.39 s   12.3x faster

Needs the lab (tests/lab/lab up); it never brings it up or down.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from tests.bench.goals import finish, goal_flags
from tests.support.lab import lab_status, skip_reason
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import callback_seconds, run_playbook

GOAL = 3.0
SCRATCH = "/tmp/bench-put-files"


def files(tmp: Path, count: int) -> List[dict]:
    """COUNT files for the node: even ones rendered content, odd ones controller files."""
    out = []
    for i in range(count):
        dest = "%s/f%02d.txt" % (SCRATCH, i)
        text = "file %d\n%s\n" % (i, "x" * 200)
        if i % 2:
            src = tmp / ("f%02d.txt" % i)
            src.write_text(text)
            out.append({"src": str(src), "dest": dest, "mode": "0644"})
        else:
            out.append({"content": text, "dest": dest, "mode": "0644"})
    return out


def playbook(tmp: Path, name: str, group: List[dict]) -> Path:
    if name == "per_file":
        tasks = [{"name": "copy %s" % f["dest"], "ansible.builtin.copy": f} for f in group]
    else:
        tasks = [{"name": "put the group", "gpuops.repurpose.put_files": {"files": group}}]
    pre = [{"ansible.builtin.file": {"path": SCRATCH, "state": "directory", "mode": "0755"}}]
    play = [{"name": "bench %s" % name, "hosts": "ct200", "gather_facts": False, "pre_tasks": pre, "tasks": tasks}]
    path = tmp / ("%s.yml" % name)
    path.write_text(json.dumps(play))
    return path


def run_once(path: Path, expect_changed: bool) -> float:
    """The play's task span (pre_tasks excluded), after checking the run changed only when EXPECT_CHANGED."""
    done = run_playbook(path, LAB_INVENTORY, json_results=True, timeout=600)
    data = done.json
    stats = data["stats"].get("ct200", {})
    if done.rc != 0 or stats.get("failures"):
        raise SystemExit("bench_put_files: %s failed (rc %s): %s" % (path.name, done.rc, done.stdout[-2000:]))
    tasks = data["plays"][0]["tasks"][1:]  # after the pre_task
    changed = any(h.get("changed") for t in tasks for h in t["hosts"].values())
    if changed != expect_changed:
        raise SystemExit("bench_put_files: %s changed=%s, expected %s" % (path.name, changed, expect_changed))
    return callback_seconds(tasks[-1]["task"]["duration"]["end"]) - callback_seconds(tasks[0]["task"]["duration"]["start"])


def main() -> int:
    ap = goal_flags(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    reason = skip_reason(lab_status())
    if reason:
        sys.exit(reason)
    per: Dict[str, List[float]] = {"per_file": [], "group": []}
    with tempfile.TemporaryDirectory(prefix="bench_put_files_") as tmpdir:
        tmp = Path(tmpdir)
        group = files(tmp, args.files)
        books = {name: playbook(tmp, name, group) for name in per}
        run_once(books["per_file"], expect_changed=True)  # the first write: what follows is the re-run's check
        for rnd in range(args.rounds):
            for name in (list(per) if rnd % 2 == 0 else list(per)[::-1]):
                per[name].append(run_once(books[name], expect_changed=False))
            print("round %d: %s" % (rnd + 1, ", ".join("%s %.2f s" % (n, v[-1]) for n, v in per.items())), flush=True)
    med = {n: statistics.median(v) for n, v in per.items()}
    ratio = med["per_file"] / med["group"]
    print("\n%-10s %10s" % ("contender", "median s"))
    for name, value in med.items():
        print("%-10s %10.2f" % (name, value))
    print("per_file / group: %.2fx (%d files)" % (ratio, args.files))
    summary = {"files": args.files, "rounds": args.rounds, "median_s": med, "per_file/group": ratio}
    return finish(summary, {"group no-op >= %.0fx faster than a copy per file" % GOAL: ratio >= GOAL},
                  args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
