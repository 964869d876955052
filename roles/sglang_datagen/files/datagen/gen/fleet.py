"""Every worker behind the router, the whole run (private to ``gen.client``).

sglang-router 0.3.2 drops a worker that is not healthy within ``--worker-startup-timeout-secs`` and never
lists it again (``POST /workers {"url": ...}`` registers it again); after a restart it knows only the
``--worker-urls`` that passed that check; and its own ``/health_generate`` is 200 with one worker of eight.
The role's readiness gate (the ``sglang_ready_wait`` module) repairs this before the pipeline starts; a reboot or a
router restart later would leave the run on fewer GPUs, without a word. So while generate runs, every
``generate.workers_interval`` seconds one round reads the router's ``GET /workers`` and each configured
worker's own ``/health_generate``, registers again a ready worker the router does not list (as the gate
does; the same URL twice is one worker), puts how many workers serve in the progress file and logs a line
whenever the set of missing workers changes. ``generate.fewer_workers: wait`` holds new requests back while
any worker is missing, at most ``generate.fewer_workers_max_wait`` seconds in a row, then fails the run.

Every request is bounded; the rounds run in their own task and the generation loop only ever awaits
:meth:`FleetWatch.admit`, which returns at once unless the run waits for its workers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import aiohttp

from .progress import Progress
from .settings import GenerateSettings

# SGLang's /health_generate waits up to 20 s for its one-token generation (HEALTH_CHECK_TIMEOUT); a busy
# worker answers sooner (any output since the check began counts)
_PROBE_TIMEOUT_S = 25.0
_ROUTER_TIMEOUT_S = 10.0
# the router answers the GET with Rust's serde JSON; the session does not decompress (client.py)
_PLAIN = {"Accept-Encoding": "identity", "Accept": "application/json"}

NOT_LISTED = "not in the router's worker list"
UNHEALTHY = "listed unhealthy by the router"

Missing = Dict[str, str]  # worker URL -> why it does not serve


def parse_router_workers(body: bytes) -> Optional[Dict[str, bool]]:
    """``{worker url: is_healthy}`` from a ``GET /workers`` body of sglang-router; None when it is not that list.

    The same reading as ``parse_router_workers`` of the collection's ``module_utils/_datagen/ready.py`` (the
    readiness gate, run before the package is on the node's path); ``test_fleet_router`` checks that both read one
    real router alike.
    """
    try:
        listed = json.loads(body)["workers"]
        return {str(w["url"]).rstrip("/"): bool(w.get("is_healthy", False)) for w in listed}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def missing_workers(workers: Sequence[str], listed: Optional[Mapping[str, bool]],
                    health: Mapping[str, Optional[str]], router_problem: str = "") -> Missing:
    """Why each worker that does not serve does not; a worker serves when the router lists it healthy AND its own
    ``/health_generate`` is 200 (``health[w]`` None): the router keeps a restarted worker listed healthy for up to
    three health-check intervals (60 s each by default), and lists nothing at all while it is down itself.
    """
    out: Missing = {}
    for w in workers:
        why: List[str] = []
        if listed is None:
            why.append(router_problem or "the router does not list its workers")
        elif w not in listed:
            why.append(NOT_LISTED)
        elif not listed[w]:
            why.append(UNHEALTHY)
        if health.get(w) is not None:
            why.append(str(health[w]))
        if why:
            out[w] = "; ".join(why)
    return out


def to_register(workers: Sequence[str], listed: Optional[Mapping[str, bool]],
                health: Mapping[str, Optional[str]]) -> List[str]:
    """The ready workers the router answered without: ``POST /workers`` brings each back (a worker not yet
    ready would only be dropped again after the router's startup timeout)."""
    if listed is None:
        return []
    return [w for w in workers if w not in listed and health.get(w) is None]


def describe_missing(missing: Mapping[str, str]) -> str:
    """``URL, URL (why); URL (why)``: workers missing for the same reason (a router that does not answer) once."""
    by_reason: Dict[str, List[str]] = {}
    for w in sorted(missing):
        by_reason.setdefault(missing[w], []).append(w)
    return "; ".join(f"{', '.join(ws)} ({why})" for why, ws in by_reason.items())


def width_line(configured: int, before: Mapping[str, str], after: Mapping[str, str],
               wait_max: Optional[float]) -> Optional[str]:
    """The journal line when the set of missing workers changed (None when it did not), naming them."""
    if set(before) == set(after):
        return None
    back = sorted(set(before) - set(after))
    if not after:
        return f"generate: all {configured} workers serving again (back: {', '.join(back)})"
    gone = describe_missing(after)
    then = (f"new requests wait for them (generate.fewer_workers: wait, at most {wait_max:g}s)"
            if wait_max is not None else "going on with the rest (generate.fewer_workers: continue)")
    line = f"generate: {configured - len(after)} of {configured} workers serving; not serving: {gone}; {then}"
    return line + (f"; back: {', '.join(back)}" if back else "")


def wait_expired(configured: int, missing: Mapping[str, str], waited: float, wait_max: float) -> str:
    """Why a run that waited for its workers gives up, and what to do."""
    gone = describe_missing(missing)
    return (f"only {configured - len(missing)} of {configured} workers served for {waited:.0f}s "
            f"(generate.fewer_workers: wait, generate.fewer_workers_max_wait: {wait_max:g}); not serving: {gone}. "
            "Bring them back (systemctl status sglang-datagen-worker@N, its journal) and run again (generate "
            "resumes), or set generate.fewer_workers: continue to go on with the workers that serve")


class FleetWatch:
    """The rounds over one router's workers, and the gate that holds new requests back under ``wait``."""

    def __init__(self, router: str, workers: Tuple[str, ...], interval: float, wait_max: Optional[float],
                 progress: Progress, log: Callable[[str], None], fail: Callable[[str], None]) -> None:
        self.router = router
        self.workers = workers
        self.interval = interval
        self.wait_max = wait_max  # None: fewer_workers is continue
        self.progress = progress
        self.log = log
        self.fail = fail
        self.missing: Missing = {}
        self._short_since: Optional[float] = None
        self._registered: Set[str] = set()  # registered again, not serving yet
        self._open = asyncio.Event()  # under wait: closed until a round finds every worker serving
        if wait_max is None:
            self._open.set()
        progress.workers_configured = len(workers)

    async def admit(self, stop: asyncio.Event) -> None:
        """Return when a new request may be sent: at once, unless the run waits for its workers (or stops)."""
        if self._open.is_set() or stop.is_set():
            return
        waits = [asyncio.ensure_future(self._open.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run(self, session: aiohttp.ClientSession) -> None:
        """A round every ``interval`` seconds, until cancelled; whatever ends it lets the held requests go."""
        try:
            while True:
                await self.round(session)
                await asyncio.sleep(self.interval)
        finally:
            self._open.set()

    async def round(self, session: aiohttp.ClientSession) -> None:
        listed, router_problem = await self._router_list(session)
        answers = await asyncio.gather(*(self._probe(session, w) for w in self.workers))
        health = dict(zip(self.workers, answers))
        missing = missing_workers(self.workers, listed, health, router_problem)
        again = to_register(self.workers, listed, health)
        registered = await asyncio.gather(*(self._register(session, w) for w in again))
        for w, ok in zip(again, registered):
            missing[w] += "; registered again" if ok else "; the router refused to register it"
            if ok and w not in self._registered:  # one line per worker brought back, not one per round
                self.log(f"generate: {w} is ready and the router {self.router} did not list it: registered again")
                self._registered.add(w)
        self.note(missing, asyncio.get_running_loop().time())

    def note(self, missing: Missing, now: float) -> None:
        """Take one round's outcome: progress, the journal line, and under ``wait`` the gate and its bound."""
        line = width_line(len(self.workers), self.missing, missing, self.wait_max)
        if line:
            self.log(line)
        self.missing = missing
        self._registered &= set(missing)
        self.progress.workers_serving = len(self.workers) - len(missing)
        self.progress.workers_missing = dict(missing)
        if not missing:
            self._short_since = None
            self._open.set()
            return
        if self._short_since is None:
            self._short_since = now
        if self.wait_max is None:
            return
        waited = now - self._short_since
        if waited >= self.wait_max:
            self.fail(wait_expired(len(self.workers), missing, waited, self.wait_max))
            self._open.set()  # the run is stopping: the held workers see it and end
        else:
            self._open.clear()

    async def _router_list(self, session: aiohttp.ClientSession) -> Tuple[Optional[Dict[str, bool]], str]:
        try:
            async with session.get(self.router + "/workers", headers=_PLAIN,
                                   timeout=aiohttp.ClientTimeout(total=_ROUTER_TIMEOUT_S)) as resp:
                status, body = resp.status, await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return None, f"the router {self.router} does not answer ({type(exc).__name__})"
        listed = parse_router_workers(body) if status == 200 else None
        if listed is None:
            return None, f"the router {self.router} answered GET /workers with HTTP {status}: {body[:120]!r}"
        return listed, ""

    async def _probe(self, session: aiohttp.ClientSession, worker: str) -> Optional[str]:
        """None when the worker's own /health_generate is 200, else what it answered."""
        try:
            async with session.get(worker + "/health_generate", headers=_PLAIN,
                                   timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)) as resp:
                await resp.read()
                return None if resp.status == 200 else f"/health_generate HTTP {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return f"no answer to /health_generate ({type(exc).__name__})"

    async def _register(self, session: aiohttp.ClientSession, worker: str) -> bool:
        """``POST /workers {"url": worker}`` (with the run's API key, a header of the session): 202, queued."""
        try:
            async with session.post(self.router + "/workers", json={"url": worker}, headers=_PLAIN,
                                    timeout=aiohttp.ClientTimeout(total=_ROUTER_TIMEOUT_S)) as resp:
                await resp.read()
                return resp.status in (200, 201, 202)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False


def fleet_watch(s: GenerateSettings, progress: Progress, log: Callable[[str], None],
                fail: Callable[[str], None]) -> Optional[FleetWatch]:
    """The watch for a run behind one router with ``generate.workers``; None otherwise (nothing to watch)."""
    if not s.workers or len(s.servers) != 1:
        return None
    return FleetWatch(s.servers[0], s.workers, s.workers_interval,
                      s.fewer_workers_max_wait if s.fewer_workers == "wait" else None, progress, log, fail)
