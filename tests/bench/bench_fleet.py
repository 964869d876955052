"""Benchmark: generation throughput of a fleet, and adaptive vs fixed concurrency, side by side in one run.

Everything is real but the GPUs: SGLang stand-in workers (tests/lab/sglang_standin) with SGLang's capacity
model (``--max-running-requests``: at most that many requests in the batch, the rest queued; a decode step
takes ``--token-latency + --batch-token-latency x running`` seconds, so a worker's token throughput grows with
its batch up to its capacity), the real sglang-router 0.3.2 from the venv, and the real datagen generate
client (``python -m datagen.generate``), each its own process on loopback.

Throughput is the rows the client writes in ``--window`` seconds, every setting the same wall time whatever
its speed: counted from its start in the concurrency part (start-up, readiness gate and the adaptive ramp
included), after ``--warmup`` seconds in the nodes part (the steady rate of a job that runs for hours).

- ``nodes``: two "nodes" (two groups of ``--workers`` workers each) vs one node, every worker behind one
  router (the role's ``cache_aware`` policy), concurrency ``auto``. Goal (issue 15): >= 1.9x.
- ``concurrency``: one worker of small, medium and large capacity (48, 256, 768 running requests), each
  driven with fixed 64, 128 and 512 requests in flight and with ``auto``. Goals: ``auto`` reaches >= 95% of
  the best fixed setting's throughput on each; every fixed setting falls below 95% of the best on at least
  one. The mean queue (sampled from the worker's own ``sglang:num_queue_reqs``) shows the flooding.

The time scale is compressed: a request spends about 1-2 s in a worker here (tens of seconds for a real 2K-token
answer), so the client reads the load every 0.1 s (``generate.load_interval``; 1 s by default) to keep the
same ratio of reading interval to request time. Two shared cores: read ratios, not absolute numbers.

    .venv/bin/python -m tests.bench.bench_fleet                # about 2 minutes
    .venv/bin/python -m tests.bench.bench_fleet --only nodes --json fleet.json --check
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

import yaml
from harness import RouterProcess, StandinProcess

from datagen.gen.concurrency import parse_loads
from tests.bench.goals import finish, goal_flags
from tests.support.net import http
from tests.support.paths import DATAGEN_FILES

FILES = str(DATAGEN_FILES)

MODEL = "bench-model"
# answers of 32..96 tokens (+ the stop token): batches do not finish in lockstep, as with real answer lengths
TOKENS = ["--min-tokens", "32", "--max-natural-tokens", "96"]
IDS = ["--return-input-ids", "--return-output-ids"]  # generate keeps the token ids; the router drops the flags
CAPACITIES = {"small": 48, "medium": 256, "large": 768}
FIXED = (64, 128, 512)


def worker_args(capacity: int, token_latency: float, batch_token_latency: float) -> List[str]:
    return ["--max-running-requests", str(capacity), "--token-latency", str(token_latency),
            "--batch-token-latency", str(batch_token_latency), *TOKENS, *IDS]


def make_prompts(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"{i:012x}", "source": "bench", "category": "chat",
                                 "messages": [{"role": "user", "content": f"Explain item {i} in two sentences."}]})
                     + "\n")


class LoadSampler(threading.Thread):
    """The workers' own (running, queued) every 0.1 s, summed over the workers."""

    def __init__(self, urls: List[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.samples: List[Tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            running = queued = 0
            for url in self.urls:
                reply = http(url + "/metrics", timeout=2)
                if reply.status != 200:
                    continue
                for load in parse_loads(reply.text):
                    running += load.running
                    queued += load.queued
            self.samples.append((time.monotonic(), running, queued))
            self.stop.wait(0.1)

    def second_half(self) -> Dict[str, float]:
        if not self.samples:
            return {"running": 0.0, "queued": 0.0}
        t0, t1 = self.samples[0][0], self.samples[-1][0]
        late = [s for s in self.samples if s[0] >= (t0 + t1) / 2] or self.samples
        return {"running": round(statistics.mean(s[1] for s in late), 1),
                "queued": round(statistics.mean(s[2] for s in late), 1)}


def count_lines(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def run_generate(server: str, workers: List[str], concurrency, rows: int, window: float, work: str,
                 skip: float = 0.0) -> dict:
    """Start ``python -m datagen.generate``; the rows it writes from ``skip`` to ``window`` seconds after its
    start, then stop it."""
    os.makedirs(work)
    prompts = os.path.join(work, "prompts.jsonl")
    make_prompts(prompts, rows)
    cfg = {"work_dir": work, "model": MODEL, "servers": [server], "sampling": {"max_tokens": 128},
           "generate": {"concurrency": concurrency, "load_interval": 0.1, "ready_interval": 0.05,
                        "fsync_interval": 0.1, "progress_interval": 0.2, "shutdown_grace": 0,
                        "backoff_base": 0.05, "backoff_max": 0.5}}
    cfg_path = os.path.join(work, "datagen.yml")
    with open(cfg_path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(cfg, fh)
    sampler = LoadSampler(workers)
    log = open(os.path.join(work, "generate.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "datagen.generate", "--config", cfg_path, "--prompts", prompts],
                            env=dict(os.environ, PYTHONPATH=FILES), stdout=log, stderr=subprocess.STDOUT, cwd=work)
    t0 = time.monotonic()
    sampler.start()
    output = os.path.join(work, "generated.jsonl")
    before = 0
    try:
        while time.monotonic() - t0 < skip and proc.poll() is None:
            time.sleep(0.01)
        if skip:
            before = count_lines(output)
        t1 = time.monotonic()
        while time.monotonic() - t0 < window and proc.poll() is None:
            time.sleep(0.05)
        elapsed = time.monotonic() - t1
        written = count_lines(output) - before
        total = before + written
    finally:
        sampler.stop.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        sampler.join(timeout=5)
    if total >= rows:
        raise SystemExit(f"bench: {work}: all {rows} rows done before the window closed: raise the rows")
    try:
        with open(os.path.join(work, "generate.progress.json"), encoding="utf-8") as fh:
            limit = next(iter(json.load(fh)["servers"].values())).get("limit")
    except (OSError, ValueError, StopIteration):
        limit = None
    return {"rows": written, "seconds": round(elapsed, 2), "rows_s": round(written / elapsed, 1),
            "final_limit": limit, **sampler.second_half()}


def bench_nodes(a: argparse.Namespace, tmp: str) -> dict:
    args = worker_args(a.node_capacity, 0.01, 0.0002)
    out = {}
    workers = [StandinProcess(args, model=MODEL).start() for _index in range(2 * a.workers)]
    try:
        for nodes in (1, 2):
            group = workers[: nodes * a.workers]
            with RouterProcess([w.url for w in group], policy="cache_aware") as router:
                res = run_generate(router.url, [w.url for w in group], "auto", a.rows, a.window + a.warmup,
                                   os.path.join(tmp, f"nodes-{nodes}"), skip=a.warmup)
            out[f"{nodes}_node"] = res
            print(f"nodes {nodes}: {len(group)} workers x {a.node_capacity}  {res['rows_s']:7.1f} rows/s  "
                  f"running {res['running']:6.1f}  queued {res['queued']:6.1f}  limit {res['final_limit']}",
                  flush=True)
    finally:
        for w in workers:
            w.stop()
    out["speedup"] = round(out["2_node"]["rows_s"] / out["1_node"]["rows_s"], 2)
    return out


def bench_concurrency(a: argparse.Namespace, tmp: str) -> dict:
    out: Dict[str, dict] = {}
    for name, capacity in CAPACITIES.items():
        runs = {}
        with StandinProcess(worker_args(capacity, 0.01, 0.00002), model=MODEL) as worker:
            for setting in ("auto", *FIXED):
                res = run_generate(worker.url, [worker.url], setting, a.rows, a.window,
                                   os.path.join(tmp, f"{name}-{setting}"))
                runs[str(setting)] = res
                print(f"{name:6s} (capacity {capacity:3d})  {str(setting):>4s}  {res['rows_s']:7.1f} rows/s  "
                      f"running {res['running']:6.1f}  queued {res['queued']:6.1f}  limit {res['final_limit']}",
                      flush=True)
        best_fixed = max(runs[str(x)]["rows_s"] for x in FIXED)
        best = max(r["rows_s"] for r in runs.values())
        out[name] = {"capacity": capacity, "runs": runs, "auto_vs_best_fixed": round(runs["auto"]["rows_s"] / best_fixed, 3),
                     "losers": [x for x in FIXED if runs[str(x)]["rows_s"] < 0.95 * best]}
    return out


def main() -> int:
    ap = goal_flags(argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0]))
    ap.add_argument("--only", choices=("nodes", "concurrency"), help="run one part")
    ap.add_argument("--window", type=float, default=8.0, help="seconds each run generates")
    ap.add_argument("--rows", type=int, default=20000, help="prompts per run (more than any run gets through)")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="nodes: seconds before the window (start-up, ramp, first answers): the steady rate counts")
    ap.add_argument("--workers", type=int, default=2, help="workers per node")
    ap.add_argument("--node-capacity", type=int, default=32, help="running requests per worker in the nodes part")
    a = ap.parse_args()

    summary: Dict[str, object] = {"cores": os.cpu_count(), "window_s": a.window}
    goals: Dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        if a.only in (None, "nodes"):
            nodes = bench_nodes(a, tmp)
            summary["nodes"] = nodes
            print(f"\ntwo nodes vs one: {nodes['speedup']:.2f}x rows/s\n", flush=True)
            goals["two nodes >= 1.9x one node"] = nodes["speedup"] >= 1.9
        if a.only in (None, "concurrency"):
            conc = bench_concurrency(a, tmp)
            summary["concurrency"] = conc
            print()
            for name, r in conc.items():
                print(f"{name:6s}: auto {100 * r['auto_vs_best_fixed']:.0f}% of the best fixed; "
                      f"fixed below 95% of the best: {r['losers'] or 'none'}")
                goals[f"auto >= 95% of the best fixed ({name})"] = r["auto_vs_best_fixed"] >= 0.95
            for x in FIXED:
                goals[f"fixed {x} loses on at least one capacity"] = any(x in r["losers"] for r in conc.values())
    return finish(summary, goals, a.json, a.check)


if __name__ == "__main__":
    sys.exit(main())
