"""The servers a generate run sends to: which are ready, and where a retry goes (private to ``gen.client``).

Each server in ``servers`` passes a readiness gate before it gets a request: ``/health_generate`` answers 200
and ``/v1/models`` lists the model (the first one listed when ``model`` is unset). The gate retries with a
growing delay, bounded by ``generate.ready_timeout``; a server that never passes is failed, and the run goes on
with the others. A retry moves on to the next ready server, so one sick worker does not hold rows hostage.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

import aiohttp

from .settings import GenerateSettings


class ServerUnready(Exception):
    """One probe of the readiness gate failed; the message says what the server answered."""


class Server:
    """One entry of ``servers``: a router or a worker, its readiness and its share of the requests."""

    __slots__ = ("base", "chat_url", "ready", "failed", "event", "stats", "limit", "tasks", "in_flight", "load_url",
                 "logged_limit")

    def __init__(self, base: str, stats: Dict[str, Any]) -> None:
        self.base = base
        self.chat_url = base + "/v1/chat/completions"
        self.ready = False
        self.failed = False
        self.event = asyncio.Event()  # set once the gate is through: ready, or failed
        self.stats = stats  # this server's entry in the progress file
        self.limit = 0  # worker tasks this server may have
        self.tasks = 0  # worker tasks alive for it
        self.in_flight = 0  # requests sent to it, not yet answered
        self.load_url: Optional[str] = None  # where its load was last read (/engine_metrics or /metrics)
        self.logged_limit = 0


async def http_get(session: aiohttp.ClientSession, url: str, timeout: float) -> Tuple[int, bytes]:
    """(status, body) of one bounded GET."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
        return resp.status, await resp.read()


class ServerPool:
    """The run's servers: the readiness gate of each, the order they became ready in, the model they serve."""

    def __init__(self, settings: GenerateSettings, stats: Dict[str, Dict[str, Any]],
                 log: Callable[[str], None]) -> None:
        self.s = settings
        self.log = log
        self.servers = [Server(base, stats[base]) for base in settings.servers]
        self.ready_order: List[int] = []
        self.model: Optional[str] = settings.model
        self.mismatch: Optional[str] = None  # a server serves another model than the configured one
        self.first_ready = asyncio.Event()  # one server is ready, or every one failed, or a mismatch

    def server_for(self, home: int, attempt: int) -> Server:
        """Where attempt ATTEMPT of a row of server HOME goes: home first, then the next ready server each time."""
        if attempt == 0 or len(self.ready_order) < 2:
            return self.servers[home]
        order = self.ready_order
        pos = order.index(home) if home in order else 0
        return self.servers[order[(pos + attempt) % len(order)]]

    def unready_detail(self) -> str:
        return "; ".join(f"{srv.base}: {srv.stats['last_error']}" for srv in self.servers)

    async def gate(self, session: aiohttp.ClientSession, index: int, deadline: float,
                   stopping: Callable[[], bool]) -> None:
        """Wait until server INDEX answers /health_generate and lists the model; bounded by ``deadline``."""
        srv = self.servers[index]
        delay = self.s.ready_interval
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._probe(session, srv, max(1.0, min(60.0, deadline - loop.time())))
                if self.mismatch:
                    self.first_ready.set()
                    return
                srv.ready = True
                srv.stats["ready"] = True
                srv.stats["last_error"] = None
                self.ready_order.append(index)
                self.log(f"generate: {srv.base} is ready (model {self.model})")
                self.first_ready.set()
                srv.event.set()
                return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ServerUnready) as exc:
                srv.stats["last_error"] = str(exc) or type(exc).__name__
            remaining = deadline - loop.time()
            if remaining <= 0 or stopping():
                srv.failed = True
                self.log(f"generate: {srv.base} not ready after {self.s.ready_timeout:g}s: {srv.stats['last_error']}")
                srv.event.set()
                if all(x.failed for x in self.servers):
                    self.first_ready.set()
                return
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 10.0)

    async def _probe(self, session: aiohttp.ClientSession, srv: Server, timeout: float) -> None:
        """One look at SRV: ServerUnready unless it is healthy and lists a model (setting ``mismatch`` when the
        model it lists is not the configured one)."""
        status, body = await http_get(session, srv.base + "/health_generate", timeout)
        if status != 200:
            raise ServerUnready(f"/health_generate answered HTTP {status}")
        status, body = await http_get(session, srv.base + "/v1/models", timeout)
        if status != 200:
            raise ServerUnready(f"/v1/models answered HTTP {status}")
        try:
            ids = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise ServerUnready(f"/v1/models answered {body[:120]!r}") from None
        if self.model is None:
            if not ids:
                raise ServerUnready("/v1/models lists no model")
            self.model = ids[0]
        elif self.model not in ids:
            self.mismatch = (f"{srv.base} serves {ids}, not the configured model {self.model!r}: "
                             "set `model` to the served model name (sglang --served-model-name)")
