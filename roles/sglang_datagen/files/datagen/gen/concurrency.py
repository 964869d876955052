"""Adaptive concurrency: how many requests to keep in flight, from what the SGLang workers report (private).

A worker runs at most its ``--max-running-requests`` at once and queues the rest
(sglang/srt/managers/scheduler.py); how many that is depends on the model, the GPU
and the KV cache, so no fixed number fits every deployment. A queued request is
the worker's own signal that it is full: while every queue is empty there is room
for more, while the queues hold more than a few requests the client is only adding
latency (and requests to lose when a worker dies). The controller keeps every
worker's queue near a small goal (``queue_target``, or an eighth of its running
batch when that is more: see :func:`queue_goal`):

- every queue far above its goal (flooded): take the shared excess back at once;
- a queue below half its goal while the limit is what holds the client back:
  grow, doubling while every queue stays empty (the room is unknown; one empty
  reading may be a batch that just finished, so the first only adds the goals),
  else by the missing queue (the shortest queue decides: behind a router one
  worker may keep a long queue for cache affinity while another has room);
- otherwise hold. Always within ``minimum..maximum`` per worker.

A worker whose ``sglang:token_usage`` is at ``full_usage`` (its KV cache, not the
running cap, bounds the batch) counts as having no room.

The readings are SGLang's Prometheus gauges ``sglang:num_running_reqs``,
``sglang:num_queue_reqs`` and ``sglang:token_usage`` (sglang/srt/observability/metrics_collector.py,
``SchedulerMetricsCollector``), from a worker's ``/metrics`` (SGLang serves it
with ``--enable-metrics``) or, behind sglang-router, from the router's
``/engine_metrics``, which fetches every worker's ``/metrics`` and labels each
sample with ``worker_addr`` (sglang-router 0.3.2 also renames ``sglang:`` to
``sglang_`` there). The router's ``/get_loads`` is no use: it asks the workers
for ``/get_load``, which sglang 0.5.23 no longer serves (every load reads -1).

The policy is pure (:func:`next_limit` and its helpers); :class:`Limiter` runs it for each server, reading the
loads and starting worker tasks through the engine (``gen.client``).
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

import aiohttp

from .fleet import parse_router_workers
from .pool import Server, http_get
from .settings import GenerateSettings

# the two gauges, under SGLang's names and under the router's rewrite of them
_RUNNING = ("sglang:num_running_reqs", "sglang_num_running_reqs")
_QUEUED = ("sglang:num_queue_reqs", "sglang_num_queue_reqs")
_USAGE = ("sglang:token_usage", "sglang_token_usage")
# labels that split one worker's count into parts to add up (priority scheduling), not into workers
_PART_LABELS = frozenset({"priority"})

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's scheduler (one data-parallel rank): requests in its batch and in its waiting queue."""

    running: int
    queued: int
    token_usage: float = 0.0  # share of the KV cache in use (sglang:token_usage)


@dataclass(frozen=True)
class LimitPolicy:
    """The controller's settings, per worker. The first three come from the run's settings
    (generate.queue_target, concurrency_min, concurrency_max), whose defaults are the only ones."""

    queue_target: int  # requests waiting per worker: enough to refill a batch at once, no more
    minimum: int
    maximum: int
    queue_share: float = 0.125  # ... or this share of its running batch, when more
    growth: float = 2.0  # factor while every queue is empty
    full_usage: float = 0.95  # token usage at which a worker's KV cache, not the client, bounds its batch

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {self.minimum}..{self.maximum}")
        if self.queue_target < 1 or self.growth <= 1.0 or not 0.0 <= self.queue_share <= 1.0:
            raise ValueError("queue_target must be >= 1, growth > 1 and queue_share within 0..1")


def parse_loads(text: str) -> List[WorkerLoad]:
    """Every worker's load in a Prometheus text page (a worker's ``/metrics`` or the router's ``/engine_metrics``).

    One entry per distinct label set of the running gauge, ``priority`` aside (its series add up), sorted by
    those labels; a worker that reports running but no queue counts an empty queue. Unreadable lines are
    skipped: an empty list means the page says nothing about load.
    """
    running: Dict[Tuple[Tuple[str, str], ...], float] = {}
    queued: Dict[Tuple[Tuple[str, str], ...], float] = {}
    usage: Dict[Tuple[Tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        name, labels, value = m.groups()
        target = running if name in _RUNNING else queued if name in _QUEUED else usage if name in _USAGE else None
        if target is None:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isnan(number) or number < 0:  # NaN, or nonsense
            continue
        key = tuple(sorted((k, v) for k, v in _LABEL.findall(labels or "") if k not in _PART_LABELS))
        target[key] = target.get(key, 0.0) + number
    return [WorkerLoad(int(running[k]), int(queued.get(k, 0.0)), usage.get(k, 0.0)) for k in sorted(running)]


def bounds(workers: int, policy: LimitPolicy) -> Tuple[int, int]:
    """(lowest, highest) limit for ``workers`` workers (at least one)."""
    n = max(1, workers)
    return n * policy.minimum, n * policy.maximum


def initial_limit(workers: int, start: int, policy: LimitPolicy) -> int:
    """The limit before the first reading: ``start`` per worker, within the bounds."""
    lo, hi = bounds(workers, policy)
    return max(lo, min(hi, max(1, workers) * start))


def queue_goal(load: WorkerLoad, policy: LimitPolicy) -> int:
    """The queue wanted at one worker: ``queue_target``, or ``queue_share`` of its batch when that is more.

    Requests that arrive while a step runs wait for the next one (scheduler.py admits between steps), so a
    worker with room shows a queue too, the longer the bigger its batch and the shorter its answers; only a
    queue beyond that says the batch is full.
    """
    return max(policy.queue_target, int(load.running * policy.queue_share))


def all_empty(loads: Sequence[WorkerLoad]) -> bool:
    """Every queue empty (and something read)."""
    return bool(loads) and all(w.queued == 0 for w in loads)


def next_limit(limit: int, in_flight: int, loads: Sequence[WorkerLoad], policy: LimitPolicy,
               empty_before: bool = False) -> int:
    """The next in-flight limit for one server (a worker, or a router and every worker behind it).

    ``limit``: the current limit; ``in_flight``: the client's requests to that server now; ``loads``: what its
    workers report now; ``empty_before``: every queue was empty at the previous reading too. No reading (an
    empty ``loads``) keeps the limit as it is.
    """
    if not loads:
        return limit
    n = len(loads)
    lo, hi = bounds(n, policy)
    goals = [queue_goal(w, policy) for w in loads]
    # the shortest queue decides: a router may keep one worker's queue long for cache affinity (sglang-router's
    # cache_aware policy balances only past its imbalance threshold) while another worker has room
    if all(w.queued > 2 * g for w, g in zip(loads, goals)):
        # flooded, every worker: the excess they share goes, counted from what is in flight now (tasks above a
        # lowered limit are still finishing their rows: the limit itself may be lower already)
        excess = min(w.queued - g for w, g in zip(loads, goals))
        new = min(limit, in_flight - n * excess)
    elif any(2 * w.queued < g and w.token_usage < policy.full_usage for w, g in zip(loads, goals)):
        # (a worker whose KV cache is full has no room whatever its queue: more would only wait, or be
        # retracted from the batch and computed again)
        if in_flight + sum(goals) < limit:
            new = limit  # the limit is not what holds the load back (the end of the input, rows in backoff)
        elif all_empty(loads) and empty_before:
            new = max(limit + sum(goals), int(limit * policy.growth))  # empty twice running: the room is unknown
        else:
            # the largest shortfall, for every worker: where the extra requests go is the router's choice
            new = limit + n * max(g - w.queued for w, g in zip(loads, goals))
    else:
        new = limit
    return max(lo, min(hi, new))


def describe(loads: Sequence[WorkerLoad]) -> Mapping[str, int]:
    """Totals for the progress file: workers, running, queued, the highest token usage."""
    return {"workers": len(loads), "running": sum(w.running for w in loads), "queued": sum(w.queued for w in loads),
            "token_usage": round(max((w.token_usage for w in loads), default=0.0), 3)}


# auto: the limit per worker before the first reading; low, so that a small worker is not flooded for long
# at the start (the limit doubles every other reading while the queues stay empty)
START_PER_WORKER = 32
# auto, but the server reports no load (no --enable-metrics, not SGLang): the fixed default of earlier releases,
# per worker the router lists
BLIND_PER_WORKER = 128
# the load pages are small; a worker too busy to answer one in this time is not read this round
LOAD_TIMEOUT_S = 5.0


class Limiter:
    """Each server's in-flight limit: ``generate.concurrency`` when fixed, else (``auto``) moved every
    ``load_interval`` by what its workers report, until the input runs out. ``spawn(session, home)`` starts
    worker tasks up to server HOME's limit; ``running()`` is false once the input is out or the run stops."""

    def __init__(self, settings: GenerateSettings, log: Callable[[str], None],
                 spawn: Callable[[aiohttp.ClientSession, int], None], running: Callable[[], bool]) -> None:
        self.s = settings
        self.log = log
        self.spawn = spawn
        self.running = running
        self.policy = LimitPolicy(queue_target=settings.queue_target, minimum=settings.concurrency_min,
                                  maximum=settings.concurrency_max)

    async def pilot(self, session: aiohttp.ClientSession, home: int, srv: Server) -> None:
        """Start SRV's worker tasks once it is ready; with ``concurrency: auto``, keep its limit on the workers'
        queues until the input runs out."""
        if not srv.ready:
            await srv.event.wait()
            if not srv.ready:
                return
        if not self.s.adaptive:
            srv.limit = int(self.s.concurrency or 1)
            srv.stats["limit"] = srv.limit
            self.spawn(session, home)
            return
        loads = await self.read_load(session, srv)
        if loads:
            srv.limit = initial_limit(len(loads), START_PER_WORKER, self.policy)
        else:
            workers = await self.listed_workers(session, srv)
            srv.limit = initial_limit(workers, BLIND_PER_WORKER, self.policy)
            self.log(f"generate: {srv.base} reports no load (sglang:num_running_reqs on /engine_metrics or "
                     f"/metrics): {srv.limit} requests in flight ({BLIND_PER_WORKER} for each of {workers} "
                     "worker(s)) until it does; start the workers with --enable-metrics, or set generate.concurrency")
        self.note(srv, loads)
        self.spawn(session, home)
        empty_before = True  # at the start the room is unknown: an empty first reading doubles at once
        while self.running():
            await asyncio.sleep(self.s.load_interval)
            loads = await self.read_load(session, srv)
            limit = next_limit(srv.limit, srv.in_flight, loads, self.policy, empty_before)
            empty_before = all_empty(loads)
            if limit != srv.limit:
                srv.limit = limit
                self.spawn(session, home)
            self.note(srv, loads)

    async def read_load(self, session: aiohttp.ClientSession, srv: Server) -> List[WorkerLoad]:
        """The load of the workers behind SRV now: the router's /engine_metrics (every worker), else the
        worker's own /metrics; [] when neither says anything (the limit then stays as it is)."""
        urls = [srv.load_url] if srv.load_url else [srv.base + "/engine_metrics", srv.base + "/metrics"]
        for url in urls:
            try:
                # identity: SGLang's /metrics (prometheus_client) gzips for a client that accepts it
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S),
                                       headers={"Accept-Encoding": "identity", "Accept": "text/plain"}) as resp:
                    status, body = resp.status, await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
            if status != 200:
                continue
            loads = parse_loads(body.decode("utf-8", "replace"))
            if loads:
                srv.load_url = url
                return loads
        srv.load_url = None  # look at both again next time (a router restarted, metrics switched on)
        return []

    async def listed_workers(self, session: aiohttp.ClientSession, srv: Server) -> int:
        """How many workers a router lists (its GET /workers); 1 for a worker, or when it cannot say."""
        try:
            status, body = await http_get(session, srv.base + "/workers", LOAD_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return 1
        listed = parse_router_workers(body) if status == 200 else None
        return max(1, len(listed)) if listed is not None else 1

    def note(self, srv: Server, loads: List[WorkerLoad]) -> None:
        srv.stats["limit"] = srv.limit
        if loads:
            srv.stats.update(describe(loads))
        # a line when the limit moved by a quarter since the last one: the ramp and the settling, not every tick
        if srv.logged_limit == 0 or abs(srv.limit - srv.logged_limit) * 4 >= srv.logged_limit:
            srv.logged_limit = srv.limit
            load = describe(loads)
            self.log(f"generate: {srv.base}: {srv.limit} requests in flight at most ({load['workers']} workers "
                     f"report {load['running']} running, {load['queued']} queued)")
