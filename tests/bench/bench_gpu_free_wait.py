"""Benchmark: how soon after the GPUs are really free does the waiter say so?

Detection latency = (watcher returns) - (the fake driver releases the memory,
i.e. the last holder's exit + the release delay, as recorded by the fakegpu
driver daemon). Side by side, same fake GPUs, same holders (8 processes, one
per GPU, like the trainer's workers):

- ``gpu_free_wait`` run as Ansible runs it on a target (``python -m ... ARGS``),
  ``stable_for: 1``, at ``interval`` 0.5 s and 0.1 s;
- the incident's approach: a shell loop of ``nvidia-smi`` + ``sleep 5`` until
  no GPU shows more than the threshold.

The kill happens at a different phase of the watchers' loops in each trial.
Numbers are from a shared 2-core machine: read the ratios.

    .venv/bin/python -m tests.bench.bench_gpu_free_wait            # about a minute
    .venv/bin/python -m tests.bench.bench_gpu_free_wait --trials 5 --release-delay 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from fakegpu_harness import NVIDIA_SMI, FakeGpus, module_args_file

from tests.support.paths import ROOT

MODULE = "ansible_collections.gpuops.repurpose.plugins.modules.gpu_free_wait"
THRESHOLD = 512
SHELL_LOOP = (
    "while %s --query-gpu=memory.used --format=csv,noheader,nounits"
    " | awk '$1 > %d {busy=1} END {exit !busy}'; do sleep 5; done" % (NVIDIA_SMI, THRESHOLD)
)


def python() -> str:
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def watcher_cmd(kind: str, fake: FakeGpus, tmp: str) -> list[str]:
    if kind == "shell":
        return ["sh", "-c", SHELL_LOOP]
    interval = float(kind.split("=")[1])
    args = module_args_file(os.path.join(tmp, "args-%s.json" % interval), interval=interval, stable_for=1,
                            timeout=120, max_used_mib=THRESHOLD, nvidia_smi_path=NVIDIA_SMI,
                            device_paths=[fake.device_glob])
    return [python(), "-m", MODULE, args]


def trial(kind: str, fake: FakeGpus, tmp: str, phase: float, warmup: float) -> float:
    holders = [fake.hold([i], mib=90000) for i in range(8)]
    env = dict(fake.env, PYTHONPATH=os.path.join(ROOT, ".collections"))
    watcher = subprocess.Popen(watcher_cmd(kind, fake, tmp), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    time.sleep(warmup + phase)  # the watcher is started and looping; vary where in its loop the release falls
    deaths_before = len(fake.events("death"))
    for proc in holders:
        fake.kill(proc)
    out, err = watcher.communicate(timeout=180)
    returned = time.time()
    if watcher.returncode != 0:
        raise RuntimeError("%s failed: %s %s" % (kind, out[-500:], err[-500:]))
    deaths = fake.events("death")[deaths_before:]
    for _attempt in range(100):  # the driver daemon records deaths a moment after the exits
        if len(deaths) >= 8:
            break
        time.sleep(0.01)
        deaths = fake.events("death")[deaths_before:]
    released = max(e["release_at"] for e in deaths)
    fake.procs = [p for p in fake.procs if p not in holders]
    return returned - released


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--release-delay", type=float, default=1.0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    kinds = ["module interval=0.5", "module interval=0.1", "shell"]
    results: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        fake = FakeGpus(tmp, release_delay=args.release_delay)
        try:
            for n in range(args.trials):
                for kind in kinds:
                    # phases spread over the shell loop's 5 s period and the module's intervals
                    phase = (n + 0.5) / args.trials * (5.0 if kind == "shell" else 1.0)
                    lat = trial(kind.replace("module ", ""), fake, tmp, phase, warmup=1.0)
                    results[kind].append(lat)
                    print("trial %d  %-22s latency %6.3f s" % (n + 1, kind, lat), flush=True)
        finally:
            fake.close()
    shell_mean = statistics.mean(results["shell"])
    print()
    print("detection latency after the release (release delay %.1f s, %d trials, 8 GPUs / 8 holders)"
          % (args.release_delay, args.trials))
    print("%-22s %8s %8s %8s %14s" % ("watcher", "mean s", "min s", "max s", "shell / this"))
    summary = {}
    for kind in kinds:
        vals = results[kind]
        mean = statistics.mean(vals)
        summary[kind] = {"mean": mean, "min": min(vals), "max": max(vals), "trials": vals,
                         "shell_over_this": shell_mean / mean if mean > 0 else None}
        print("%-22s %8.3f %8.3f %8.3f %13.1fx" % (kind, mean, min(vals), max(vals), shell_mean / mean))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"release_delay": args.release_delay, "results": summary}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
