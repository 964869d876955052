# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Benchmark: the same 30 trivial tasks against CT200 in the lab, side by side.

    .venv/bin/python -m tests.bench.bench_pct_ssh [--tasks 30] [--rounds 3] [--json FILE]

Contenders, run interleaved round by round so machine load hits all alike:
  pct_ssh_pipelined   gpuops.repurpose.pct_ssh, pipelining on (its default)
  pct_ssh_plain       gpuops.repurpose.pct_ssh, pipelining off
  pct_remote          community.proxmox.proxmox_pct_remote (the peer to beat)
  raw_pct_exec        ansible.builtin.raw "pct exec 200 -- true" over OpenSSH (no module at all)
  raw_host            ansible.builtin.raw "true" over OpenSSH (raw_pct_exec minus it: the pct hop)
  openssh_host        ansible.builtin.ssh running the same module on the PVE host itself, pipelined
                      (no container hop: the floor for "a module over SSH")

Every contender runs ``ansible.builtin.command: /bin/true`` (raw: the pct exec
line). Per-task wall time comes from the JSON callback's task start/end stamps;
the report gives the median per contender and the ratios. Goal (issue 3):
pct_ssh pipelined >= 3x faster than proxmox_pct_remote and within 1.2x of
openssh_host. Needs the lab (tests/lab/lab up); it never brings it down.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tests.support.inventory import openssh_hostvars, pct_ssh_hostvars, write_inventory
from tests.support.lab import MAIN_CT, lab_status, skip_reason
from tests.support.playbook import callback_seconds, run_playbook


def lab_or_exit() -> dict:
    """The lab's status; exit naming the reason when a lab test would be skipped (tests/support/lab.py)."""
    status = lab_status()
    reason = skip_reason(status)
    if reason:
        sys.exit(reason)
    return status


def contenders(status: dict, cp_dir: str) -> dict:
    pct_ssh = pct_ssh_hostvars(status, ansible_pct_ssh_control_path_dir=cp_dir)
    openssh = openssh_hostvars(status)
    base = {k: v for k, v in openssh.items() if k not in ("ansible_connection", "ansible_ssh_common_args")}
    return {
        "pct_ssh_pipelined": (dict(pct_ssh, ansible_pipelining=True), "command"),
        "pct_ssh_plain": (dict(pct_ssh, ansible_pipelining=False), "command"),
        # proxmox_pct_remote reads only ~/.ssh/known_hosts; on the loopback lab we let it skip the check
        "pct_remote": (dict(base, ansible_connection="community.proxmox.proxmox_pct_remote", proxmox_vmid=int(MAIN_CT),
                            ansible_host_key_checking=False, ansible_pipelining=False), "command"),
        "raw_pct_exec": (dict(openssh, ansible_pipelining=True), "raw"),
        "raw_host": (dict(openssh, ansible_pipelining=True), "raw_host"),
        "openssh_host": (dict(openssh, ansible_pipelining=True), "command"),
    }


def playbook(kind: str, n: int) -> str:
    task = {
        "raw": "    - name: t{i}\n      ansible.builtin.raw: /usr/sbin/pct exec {vmid} -- /bin/true\n",
        "raw_host": "    - name: t{i}\n      ansible.builtin.raw: /bin/true\n",
        "command": "    - name: t{i}\n      ansible.builtin.command: /bin/true\n",
    }[kind]
    return "- hosts: all\n  gather_facts: false\n  tasks:\n" + "".join(task.format(i=i, vmid=MAIN_CT) for i in range(n))


def run_once(tmp: Path, name: str, hostvars: dict, kind: str, n: int) -> list:
    inv = write_inventory(tmp / ("%s.json" % name), {"ct200": hostvars})
    # N copies of one task, generated: a loop would time all items as one task
    pb = tmp / ("%s_%s.yml" % (kind, n))
    pb.write_text(playbook(kind, n))
    data = run_playbook(pb, inv, json_results=True, timeout=1800).json
    times = []
    for task in data["plays"][0]["tasks"]:
        res = task["hosts"]["ct200"]
        if res.get("failed") or res.get("unreachable"):
            raise SystemExit("%s failed: %s" % (name, res.get("msg")))
        d = task["task"]["duration"]
        times.append(callback_seconds(d["end"]) - callback_seconds(d["start"]))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slice", type=int, default=10, help="tasks per playbook run before rotating to the next contender")
    ap.add_argument("--only", nargs="*", help="a subset of contenders")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    status = lab_or_exit()
    with tempfile.TemporaryDirectory(prefix="bench_pct_ssh_") as tmpdir:
        tmp = Path(tmpdir)
        table = contenders(status, str(tmp / "cp"))
        names = [n for n in table if not args.only or n in args.only]
        per: dict = {n: [] for n in names}
        # slices of a few tasks, rotating through the contenders, so a change in machine load
        # during the run hits every contender alike
        slices = [min(args.slice, args.tasks - i) for i in range(0, args.tasks, args.slice)]
        for rnd in range(args.rounds):
            for n in slices:
                for name in names:
                    hostvars, kind = table[name]
                    per[name] += run_once(tmp, name, hostvars, kind, n)
            print("round %d: %s" % (rnd + 1, ", ".join("%s %.3f" % (n, statistics.median(per[n])) for n in names)), flush=True)
    med = {n: statistics.median(v) for n, v in per.items()}
    print("\n%-18s %10s %10s" % ("contender", "median s", "tasks"))
    for n in names:
        print("%-18s %10.3f %10d" % (n, med[n], len(per[n])))
    ratios = {}
    if "pct_remote" in med:
        for n in names:
            if n.startswith("pct_ssh"):
                ratios["pct_remote/%s" % n] = med["pct_remote"] / med[n]
    if "openssh_host" in med:
        for n in names:
            if n.startswith("pct_ssh"):
                ratios["%s/openssh_host" % n] = med[n] / med["openssh_host"]
    if "raw_pct_exec" in med and "pct_ssh_pipelined" in med:
        ratios["pct_ssh_pipelined/raw_pct_exec"] = med["pct_ssh_pipelined"] / med["raw_pct_exec"]
    if "raw_pct_exec" in med and "raw_host" in med:
        print("pct hop (raw_pct_exec - raw_host): %.3f s" % (med["raw_pct_exec"] - med["raw_host"]))
    if "pct_ssh_pipelined" in med and "openssh_host" in med:
        print("pct_ssh_pipelined - openssh_host:   %.3f s" % (med["pct_ssh_pipelined"] - med["openssh_host"]))
    print()
    for k, v in ratios.items():
        print("%-36s %6.2fx" % (k, v))
    if "pct_remote/pct_ssh_pipelined" in ratios:
        print("\ngoal >= 3x faster than proxmox_pct_remote: %s" % ("met" if ratios["pct_remote/pct_ssh_pipelined"] >= 3 else "NOT met"))
    if "pct_ssh_pipelined/openssh_host" in ratios:
        print("goal within 1.2x of pipelined OpenSSH on the host: %s" % ("met" if ratios["pct_ssh_pipelined/openssh_host"] <= 1.2 else "NOT met"))
    if args.json:
        Path(args.json).write_text(json.dumps({"median_s": med, "ratios": ratios, "samples": per, "tasks": args.tasks,
                                               "rounds": args.rounds}, indent=1))


if __name__ == "__main__":
    main()
