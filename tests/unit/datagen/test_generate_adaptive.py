"""generate with ``concurrency: auto`` against stand-in workers that have a capacity (and the real router).

The workers run at most 8 requests at once and queue the rest (the stand-in's SGLang capacity model); the
client reads their ``sglang:num_running_reqs``/``sglang:num_queue_reqs`` and must keep them full with a short
queue, never idle and never flooded, and still write every id exactly once. The workers' own gauges are
sampled from another thread while the run goes.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import pytest
from harness import RouterProcess, StandinProcess

from datagen.gen.concurrency import parse_loads
from datagen.generate import run_generate, settings_from_config
from tests.support.net import http

pytestmark = pytest.mark.processes

CAPACITY = 8
QUEUE_TARGET = 4
# 10 tokens + the stop token at 0.01 s a step: a request spends about 0.12 s in the batch
WORKER = ["--max-running-requests", str(CAPACITY), "--token-latency", "0.01", "--min-tokens", "10",
          "--max-natural-tokens", "10", "--return-input-ids", "--return-output-ids"]


def prompts(work, n):
    path = os.path.join(str(work), "prompts.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"row-{i:05d}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n")
    return path


class Sampler(threading.Thread):
    """Every worker's (running, queued), every 20 ms, with the time."""

    def __init__(self, workers):
        super().__init__(daemon=True)
        self.workers = workers
        self.samples = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            row = []
            for w in self.workers:
                (load,) = parse_loads(http(w.url + "/metrics", timeout=5).expect(200).text)
                row.append((load.running, load.queued))
            self.samples.append((time.monotonic(), row))
            time.sleep(0.02)

    def middle(self):
        """The samples of the middle half of the run (at least 10): past the ramp, before the input runs out."""
        t0, t1 = self.samples[0][0], self.samples[-1][0]
        middle = [row for t, row in self.samples if t0 + (t1 - t0) / 4 <= t <= t1 - (t1 - t0) / 4]
        assert len(middle) >= 10, self.samples
        return middle


def generate_sampled(work, server, workers, rows):
    """Generate ROWS prompts through SERVER with ``concurrency: auto`` while a Sampler reads WORKERS; once it
    finished with every id exactly once: (its result, the sampler)."""
    path = prompts(work, rows)
    settings = settings_from_config({
        "work_dir": str(work), "model": "lab-model", "servers": [server], "sampling": {"max_tokens": 32},
        "generate": {"queue_target": QUEUE_TARGET, "load_interval": 0.1, "ready_interval": 0.05,
                     "backoff_base": 0.01, "backoff_max": 0.05, "fsync_interval": 0.1, "progress_interval": 0.1}})
    assert settings.adaptive  # auto is the default
    sampler = Sampler(workers)
    sampler.start()
    try:
        result = run_generate(settings, path, str(work))
    finally:
        sampler.done.set()
        sampler.join(timeout=10)
    assert (result["state"], result["written"], result["errors"]) == ("finished", rows, 0), result
    with open(os.path.join(str(work), "generated.jsonl"), encoding="utf-8") as fh:
        ids = [json.loads(line)["id"] for line in fh]
    assert sorted(ids) == [f"row-{i:05d}" for i in range(rows)]  # every id, exactly once
    return result, sampler


def test_auto_keeps_a_worker_at_capacity_with_a_short_queue(tmp_path):
    rows = 360
    with StandinProcess(WORKER) as worker:
        result, sampler = generate_sampled(tmp_path, worker.url, [worker], rows)
    middle = [row[0] for row in sampler.middle()]
    running = [r for r, _q in middle]
    queued = [q for _r, q in middle]
    # never idle: the batch is full nearly always (a step boundary may catch it between two requests)
    assert statistics.mean(running) >= 0.9 * CAPACITY, middle
    # never flooded: the queue stays around the target, far from the 128 a fixed start would hold
    assert max(queued) <= 3 * QUEUE_TARGET, middle
    stats = result["servers"][worker.url]
    assert stats["workers"] == 1 and CAPACITY <= stats["limit"] <= CAPACITY + 3 * QUEUE_TARGET, stats


def test_auto_through_the_router_keeps_every_worker_busy(tmp_path):
    rows = 480
    workers = [StandinProcess(WORKER).start() for _index in range(2)]
    try:
        # the role's policy: cache_aware keeps a worker's load up to --balance-abs-threshold (64) above another's
        with RouterProcess([w.url for w in workers], policy="cache_aware") as router:
            result, sampler = generate_sampled(tmp_path, router.url, workers, rows)
    finally:
        for w in workers:
            w.stop()
    middle = sampler.middle()
    for i in range(2):  # both workers full, whatever the router's affinity does
        assert statistics.mean(row[i][0] for row in middle) >= 0.85 * CAPACITY, (i, middle)
    # bounded: the shortest queue near the target, the longest within the router's imbalance allowance
    assert max(min(q for _r, q in row) for row in middle) <= 3 * QUEUE_TARGET, middle
    # The allowance is on the router's own in-flight counts (a worker's running + queued): cache_aware turns
    # to the least loaded worker only once they differ by more than --balance-abs-threshold (64, the default;
    # sgl-router's cache_aware policy). The workers' gauges trail those counts by the requests in transit,
    # and the sampler reads the two one after the other: a batch (CAPACITY) of slack. (The sum of the two
    # queues is no bound: it also holds twice the shortest queue, which may be 3 x QUEUE_TARGET.)
    loads = [[r + q for r, q in row] for row in middle]
    assert max(max(row) - min(row) for row in loads) <= 64 + 1 + CAPACITY, middle
    stats = result["servers"][router.url]
    assert stats["workers"] == 2, stats  # read through the router's /engine_metrics: both workers
