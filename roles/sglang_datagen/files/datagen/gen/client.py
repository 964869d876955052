"""The asyncio + aiohttp generation engine (private to ``datagen.generate``).

Long-lived worker tasks pull rows straight from the prompts file, so nothing
grows with the input size: no task per row, no queue, no list of rows. How many
tasks each server gets is its in-flight limit (``gen.concurrency.Limiter``): a
task above the limit retires after its row, a raised limit starts new ones. A
row is finished when its line is in the output (``gen.sink``); a row that was in
flight or still buffered when the process died is simply generated again on
resume. The servers and their readiness are ``gen.pool``; a row's request body
and output line are ``gen.rows``.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from typing import Any, Callable, Iterator, Optional, Set

import aiohttp

from ..util import DatagenError
from .concurrency import Limiter
from .fleet import FleetWatch, fleet_watch
from .journal import AppendLog, DoneIndex
from .pool import ServerPool
from .progress import Progress
from .rows import Job, RowCodec, RowError, check_row, parse_response
from .settings import GenerateSettings
from .sink import OutputSink

# Worth another attempt: timeouts, conflicts, rate limits and every 5xx (an SGLang worker's full queue is a
# 503). Other 4xx (a prompt plus max_tokens longer than the context, a bad parameter) fail the row at once.
RETRY_STATUS = frozenset({408, 409, 425, 429})

# rows buffered for the writer thread before the workers wait for it
_MAX_PENDING = 64 << 20

_loads = json.loads


class GenerateError(DatagenError):
    """The run cannot go on (no server became ready, wrong model, a second run); the message says why."""


# a response without token ids: every row would lack them, so the run stops at the first one
NO_TOKEN_IDS = ("{server} answered without token ids (choices[0].prompt_token_ids/response_token_ids or "
                "sglext.input_ids/output_ids): sglang-router drops return_token_ids, so either list the workers "
                "themselves in `servers` or start the workers with --return-input-ids --return-output-ids "
                "(sglang >= 0.5.23)")


def backoff_delay(attempt: int, base: float, cap: float, retry_after: Optional[float] = None,
                  rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter; a server's Retry-After is a floor (never above ``cap``).

    SGLang 0.5.23 workers send no Retry-After (serving_base.py, http_server.py), so the backoff alone paces the
    retries against them; the floor is for proxies in front that do send one."""
    ceiling = min(cap, base * (2 ** attempt))
    delay = ceiling * rand()
    if retry_after is not None:
        delay = max(delay, min(cap, retry_after))
    return delay


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # the HTTP-date form: the jittered backoff is good enough
    return seconds if seconds >= 0 else None


class Engine:
    """One generate run: the servers' readiness gates, the worker tasks, durable output, progress."""

    def __init__(self, settings: GenerateSettings, rows: Iterator[bytes], done: DoneIndex,
                 output: AppendLog, errors: AppendLog, progress: Progress, progress_path: str,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.s = settings
        self._lines = rows
        self.done = done
        self.sink = OutputSink(output, errors, progress, progress_path, log)
        self.progress = progress
        self.log = log
        self.stopping = False
        self.fatal: Optional[str] = None
        self.started_rows = 0
        self._failing = 0  # rows failed one after the other (a success resets it)
        self.skipped_invalid = 0
        self._exhausted = False
        self._stop: Optional[asyncio.Event] = None
        self._pool: Optional[ServerPool] = None  # made in run(): its events belong to the run's loop
        self._codec: Optional[RowCodec] = None  # once the model is known
        self._rand = random.Random().random
        self._workers: Set[asyncio.Task] = set()
        self._crash: Optional[BaseException] = None
        self._fleet: Optional[FleetWatch] = None  # behind a router with generate.workers: gen/fleet.py
        self._limiter = Limiter(settings, log, self._spawn, lambda: not self._exhausted and not self.stopping)

    @property
    def model(self) -> Optional[str]:
        """The served model: the configured one, or the first one the servers list."""
        return self._pool.model if self._pool is not None else self.s.model

    # ------------------------------------------------------------ input

    def _next_job(self) -> Optional[Job]:
        """The next row to generate, or None at the end (or at ``limit``, or when stopping)."""
        limit = self.s.limit
        while not self._exhausted and not self.stopping:
            if limit is not None and self.started_rows >= limit:
                break
            line = next(self._lines, None)
            if line is None:
                break
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except ValueError:
                self._bad_input(None, "input line is not JSON", line[:200])
                continue
            problem = check_row(row)
            if problem is not None:
                self._bad_input(row.get("id") if isinstance(row, dict) else None, problem, line[:200])
                continue
            if row["id"] in self.done:
                continue
            self.started_rows += 1
            return self._codec.job(row)
        self._exhausted = True
        return None

    def _bad_input(self, row_id: Any, problem: str, excerpt: bytes) -> None:
        self.skipped_invalid += 1
        self.sink.error_row(row_id if isinstance(row_id, str) else None, None, f"bad input: {problem}", 0, None,
                            excerpt=excerpt.decode("utf-8", "replace"))

    # ------------------------------------------------------------ workers

    async def _worker(self, session: aiohttp.ClientSession, home: int) -> None:
        srv = self._pool.servers[home]
        try:
            while not self.stopping and srv.tasks <= srv.limit:  # above the limit: retire after the row
                while self.sink.pending > _MAX_PENDING:  # the disk is slower than the servers: wait for the writer
                    await asyncio.sleep(0.05)
                if self._fleet is not None:  # generate.fewer_workers: wait holds new rows back here
                    await self._fleet.admit(self._stop)
                job = self._next_job()
                if job is None:
                    return
                await self._generate(session, job, home)
        finally:
            srv.tasks -= 1

    def _spawn(self, session: aiohttp.ClientSession, home: int) -> None:
        """Start worker tasks for ``home`` up to its limit."""
        srv = self._pool.servers[home]
        while srv.tasks < srv.limit and not self._exhausted and not self.stopping:
            srv.tasks += 1
            task = asyncio.create_task(self._worker(session, home))
            self._workers.add(task)
            task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task) -> None:
        self._workers.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()

    async def _generate(self, session: aiohttp.ClientSession, job: Job, home: int) -> None:
        s = self.s
        prog = self.progress
        last: Optional[RowError] = None
        srv = self._pool.servers[home]
        for attempt in range(s.retries + 1):
            srv = self._pool.server_for(home, attempt)
            prog.in_flight += 1
            srv.in_flight += 1
            try:
                async with session.post(srv.chat_url, data=job.body) as resp:
                    status = resp.status
                    raw = await resp.read()
                    if status == 200:
                        assistant, finish, usage, ids = parse_response(raw)
                    elif status in RETRY_STATUS or status >= 500:
                        raise RowError(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}", retry=True,
                                       status=status, retry_after=parse_retry_after(resp.headers.get("Retry-After")))
                    else:
                        raise RowError(f"HTTP {status}: {raw[:500].decode('utf-8', 'replace')}", retry=False,
                                       status=status)
            except RowError as exc:
                last = exc
            except asyncio.TimeoutError:
                last = RowError(f"no answer within {s.request_timeout:g}s", retry=True)
            except (aiohttp.ClientError, OSError) as exc:  # refused, reset, dropped mid-body
                last = RowError(f"{type(exc).__name__}: {exc}", retry=True)
            else:
                if ids is None:
                    if not self.fatal:
                        self.fatal = NO_TOKEN_IDS.format(server=srv.base)
                        self.request_stop()
                    return  # not an error row: the row is generated again once the route keeps the ids
                self.sink.add_row(self._codec.output_line(job, assistant, finish, usage, srv.base, ids))
                prog.written += 1
                self._failing = 0
                srv.stats["ok"] += 1
                if usage:
                    prog.prompt_tokens += usage.get("prompt_tokens") or 0
                    prog.completion_tokens += usage.get("completion_tokens") or 0
                key = finish or "none"
                prog.finish_reasons[key] = prog.finish_reasons.get(key, 0) + 1
                return
            finally:
                prog.in_flight -= 1
                srv.in_flight -= 1
            srv.stats["last_error"] = str(last)
            if not last.retry or attempt == s.retries:
                break
            if self.stopping:
                return  # not an error: the row is generated again on the next run
            prog.retries += 1
            srv.stats["retries"] += 1
            await asyncio.sleep(backoff_delay(attempt, s.backoff_base, s.backoff_max, last.retry_after, self._rand))
        srv.stats["errors"] += 1
        assert last is not None
        self.sink.error_row(job.row_id, job.row, str(last), attempt + 1, srv.base, last.status)
        self._failing += 1
        if self._failing >= s.max_consecutive_failures and not self.fatal:
            self.fatal = (f"{self._failing} rows failed one after the other (last: {last}); the servers look down: "
                          f"see {self.sink.err.path}, fix them and run again (generate resumes)")
            self.request_stop()

    # ------------------------------------------------------------ the run

    def _fail(self, message: str) -> None:
        """Stop the run; it ends failed with ``message`` (the first reason wins)."""
        if not self.fatal:
            self.fatal = message
            self.log(f"generate: {message}")
        self.request_stop()

    def request_stop(self) -> None:
        if not self.stopping:
            self.log("generate: stopping: finishing the requests in flight")
        self.stopping = True
        if self._stop is not None:
            self._stop.set()

    def _raise_if_fatal(self) -> None:
        """GenerateError when the run must end failed: the first reason recorded, else a server that serves
        another model than the configured one."""
        reason = self.fatal or self._pool.mismatch
        if reason:
            raise GenerateError(reason)

    async def _serve(self, session: aiohttp.ClientSession, stop_wait: asyncio.Task) -> None:
        """Wait for the first ready server, run the workers to the end of the input or to a stop."""
        s = self.s
        pool = self._pool
        first = asyncio.create_task(pool.first_ready.wait())
        try:
            await asyncio.wait([first, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        self._raise_if_fatal()
        if self.stopping:
            self.progress.state = "stopped"
            return
        if not pool.ready_order:
            raise GenerateError(f"no server became ready within generate.ready_timeout="
                                f"{s.ready_timeout:g}s ({pool.unready_detail()})")
        self._codec = RowCodec(s, pool.model)
        self.progress.state = "running"
        self.sink.write_progress()
        self._fleet = fleet_watch(s, self.progress, self.log, self._fail)
        pilots = [asyncio.create_task(self._limiter.pilot(session, i, srv)) for i, srv in enumerate(pool.servers)]
        if self._fleet is not None:  # with the pilots: a crash in it ends the run like theirs, cancelled with them
            pilots.append(asyncio.create_task(self._fleet.run(session)))
        try:
            while True:
                if self._crash is not None:
                    raise self._crash
                live = set(self._workers)
                waiting_pilots = {p for p in pilots if not p.done()}
                for pilot in pilots:
                    if pilot.done() and not pilot.cancelled() and pilot.exception() is not None:
                        raise pilot.exception()
                # the end: no worker left and none to come (the input is out, or every pilot is through)
                if not live and (self._exhausted or self.stopping or not waiting_pilots):
                    break
                finished, _pending = await asyncio.wait(live | waiting_pilots | {stop_wait},
                                                        return_when=asyncio.FIRST_COMPLETED)
                if stop_wait in finished:
                    break
            if self._workers:  # stopping: let the requests in flight land, within the grace
                await asyncio.wait(set(self._workers), timeout=s.shutdown_grace)
        finally:
            leftover = [*pilots, *self._workers]
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)
        if self._crash is not None:
            raise self._crash
        self._raise_if_fatal()  # again: a server that became ready later may serve another model
        self.progress.state = "stopped" if self.stopping else "finished"

    async def run(self) -> None:
        s = self.s
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._pool = ServerPool(s, self.progress.servers, self.log)
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):
                pass  # not the main thread (tests, embedding): the caller stops us
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = s.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=75)
        timeout = aiohttp.ClientTimeout(total=s.request_timeout, sock_connect=s.connect_timeout)
        keeper = None
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                             auto_decompress=False, raise_for_status=False) as session:
                self.progress.state = "waiting_for_servers"
                self.sink.write_progress()
                keeper = asyncio.create_task(self.sink.keep(s, self._fail))
                deadline = loop.time() + s.ready_timeout
                gates = [asyncio.create_task(self._pool.gate(session, i, deadline, lambda: self.stopping))
                         for i in range(len(self._pool.servers))]
                stop_wait = asyncio.create_task(self._stop.wait())
                try:
                    await self._serve(session, stop_wait)
                finally:  # the gates and the stop waiter end with the run, whatever ended it
                    for task in [*gates, stop_wait]:
                        task.cancel()
                    await asyncio.gather(*gates, stop_wait, return_exceptions=True)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if keeper is not None:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)
            await self.sink.drain()
