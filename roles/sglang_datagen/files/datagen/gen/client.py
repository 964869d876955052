"""The asyncio + aiohttp generation engine (private to ``datagen.generate``).

Long-lived worker tasks pull rows straight from the prompts file, so nothing
grows with the input size: no task per row, no queue, no list of rows. How many
tasks each server gets is its in-flight limit: ``concurrency`` when fixed, else
(``auto``) a pilot task per server reads the workers' running and queued
requests every ``load_interval`` and moves the limit (``gen.concurrency``); a
task above the limit retires after its row, a raised limit starts new ones.
A row is finished when its line is in the output; a row that
was in flight or still buffered when the process died is simply generated
again on resume.

Request bodies and output lines are assembled from pre-encoded JSON fragments:
the constant part (model, sampling, chat template kwargs) is encoded once, and
each row's ``messages`` is encoded once and reused for both the request and the
output line.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import aiohttp

from ..sglang_chat import TOKEN_ID_FLAGS, canonical_request, token_ids_from_response
from ..util import DatagenError, write_json
from .concurrency import LimitPolicy, WorkerLoad, all_empty, describe, initial_limit, next_limit, parse_loads
from .fleet import FleetWatch, fleet_watch, parse_router_workers
from .journal import AppendLog, DoneIndex
from .progress import Progress, summary_line
from .settings import GenerateSettings

# Worth another attempt: timeouts, conflicts, rate limits and every 5xx (an SGLang worker's full queue is a
# 503). Other 4xx (a prompt plus max_tokens longer than the context, a bad parameter) fail the row at once.
RETRY_STATUS = frozenset({408, 409, 425, 429})
# Keys the output row owns; an input row's own copy would make duplicate JSON keys.
OUTPUT_KEYS = frozenset({"id", "messages", "tools", "finish_reason", "usage", "sampling", "server", "model",
                         "prompt_token_ids", "response_token_ids"})

# rows buffered for the writer thread before the workers wait for it
_MAX_PENDING = 64 << 20
_LOG_EVERY_S = 60.0
# auto: the limit per worker before the first reading; low, so that a small worker is not flooded for long
# at the start (the limit doubles every other reading while the queues stay empty)
_START_PER_WORKER = 32
# auto, but the server reports no load (no --enable-metrics, not SGLang): the fixed default of earlier releases,
# per worker the router lists
_BLIND_PER_WORKER = 128
# the load pages are small; a worker too busy to answer one in this time is not read this round
_LOAD_TIMEOUT_S = 5.0

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


class GenerateError(DatagenError):
    """The run cannot go on (no server became ready, wrong model, a second run); the message says why."""


# a response without token ids: every row would lack them, so the run stops at the first one
NO_TOKEN_IDS = ("{server} answered without token ids (choices[0].prompt_token_ids/response_token_ids or "
                "sglext.input_ids/output_ids): sglang-router drops return_token_ids, so either list the workers "
                "themselves in `servers` or start the workers with --return-input-ids --return-output-ids "
                "(sglang >= 0.5.23)")


class RowError(Exception):
    """One row failed. ``retry`` tells whether another attempt could succeed."""

    def __init__(self, message: str, retry: bool, status: Optional[int] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.retry = retry
        self.status = status
        self.retry_after = retry_after


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


def prompt_messages(messages: List[Any]) -> List[Any]:
    """The conversation up to the turn to generate: a trailing assistant turn is regenerated, not kept.

    Earlier turns (system, user, assistant tool calls, tool results) are kept
    as they are: an agent row's tool results come from the source, since the
    tools are not executed here.
    """
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
        return messages[:-1]
    return messages


def check_row(row: Any) -> Optional[str]:
    """Why an input row cannot be sent, or None."""
    if not isinstance(row, dict):
        return "row is not a JSON object"
    row_id = row.get("id")
    if not isinstance(row_id, str) or not row_id:
        return "row has no string id"
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "row has no messages"
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return "a message is not an object with a role"
    if not prompt_messages(messages):
        return "row has only an assistant turn"
    tools = row.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "tools is not a list"
    return None


TokenIds = Optional[Tuple[List[int], List[int]]]


def parse_response(raw: bytes) -> Tuple[Dict[str, Any], Optional[str], Dict[str, Any], TokenIds]:
    """(assistant message, finish_reason, usage, (prompt ids, response ids) or None) from a chat-completion body."""
    try:
        data = _loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        ids = token_ids_from_response(data)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        # a body cut short by a dropped connection, or a proxy's error page
        raise RowError(f"unreadable response ({type(exc).__name__}): {raw[:120]!r}", retry=True) from None
    finish = choice.get("finish_reason")
    if finish == "abort":  # SGLang aborted it (overload, restart): not the model's answer
        raise RowError("server aborted the request (finish_reason: abort)", retry=True)
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    reasoning = message.get("reasoning_content")
    if not content and not tool_calls and not reasoning:
        raise RowError(f"empty completion (finish_reason: {finish})", retry=True)
    assistant: Dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        assistant["tool_calls"] = tool_calls
    if reasoning:
        assistant["reasoning_content"] = reasoning
    usage = data.get("usage") or {}
    return assistant, finish, usage, ids


class _Server:
    __slots__ = ("base", "chat_url", "ready", "failed", "event", "stats", "limit", "tasks", "in_flight", "load_url",
                 "logged_limit")

    def __init__(self, base: str, stats: Dict[str, Any]) -> None:
        self.base = base
        self.chat_url = base + "/v1/chat/completions"
        self.ready = False
        self.failed = False
        self.event = asyncio.Event()
        self.stats = stats
        self.limit = 0  # worker tasks this server may have
        self.tasks = 0  # worker tasks alive for it
        self.in_flight = 0  # requests sent to it, not yet answered
        self.load_url: Optional[str] = None  # where its load was last read (/engine_metrics or /metrics)
        self.logged_limit = 0


class _Job:
    __slots__ = ("row", "row_id", "body", "messages_json", "tools_json")

    def __init__(self, row: Dict[str, Any], body: bytes, messages_json: str, tools_json: Optional[str]) -> None:
        self.row = row
        self.row_id: str = row["id"]
        self.body = body
        self.messages_json = messages_json
        self.tools_json = tools_json


class Engine:
    """One generate run: readiness gate, workers, durable output, progress."""

    def __init__(self, settings: GenerateSettings, rows: Iterator[bytes], done: DoneIndex,
                 output: AppendLog, errors: AppendLog, progress: Progress, progress_path: str,
                 log: Callable[[str], None] = lambda msg: None) -> None:
        self.s = settings
        self._lines = rows
        self.done = done
        self.out = output
        self.err = errors
        self.progress = progress
        self.progress_path = progress_path
        self.log = log
        self.model: Optional[str] = settings.model
        self.stopping = False
        self.fatal: Optional[str] = None
        self.started_rows = 0
        self._failing = 0  # rows failed one after the other (a success resets it)
        self.skipped_invalid = 0
        self._exhausted = False
        self._stop: Optional[asyncio.Event] = None
        self._first_ready: Optional[asyncio.Event] = None
        self._servers: List[_Server] = []
        self._ready_order: List[int] = []
        self._prefix = ""
        self._tail = ""
        self._sampling_json = _dumps(settings.sampling)
        self._rand = random.Random().random
        self._sync_fut: Optional[asyncio.Future] = None
        self._workers: Set[asyncio.Task] = set()
        self._crash: Optional[BaseException] = None
        self._fleet: Optional[FleetWatch] = None  # behind a router with generate.workers: gen/fleet.py
        self._policy = LimitPolicy(queue_target=settings.queue_target, minimum=settings.concurrency_min,
                                   maximum=settings.concurrency_max)

    # ------------------------------------------------------------ request/row encoding

    def _encode_constants(self) -> None:
        s = self.s
        const: Dict[str, Any] = {"model": self.model, "stream": False}
        const.update(s.sampling)
        const.update(s.extra_body)
        const.update(TOKEN_ID_FLAGS)  # the training row is the ids the server consumed and produced
        const["chat_template_kwargs"] = s.template_kwargs()
        self._prefix = _dumps(const)[:-1]
        self._tool_choice = ',"tool_choice":' + _dumps(s.tool_choice)
        self._tail = ',"sampling":' + self._sampling_json + ',"model":' + _dumps(self.model)

    def _job(self, row: Dict[str, Any]) -> _Job:
        # what the worker will see, by either route: the output row keeps exactly that, for tokenize to render
        messages, tools = canonical_request(prompt_messages(row["messages"]), row.get("tools"))
        messages_json = _dumps(messages)
        tools_json = _dumps(tools) if tools else None
        parts = [self._prefix, ',"messages":', messages_json]
        if tools_json is not None:
            parts += [',"tools":', tools_json, self._tool_choice]
        parts.append("}")
        return _Job(row, "".join(parts).encode("utf-8", "surrogatepass"), messages_json, tools_json)

    def _output_line(self, job: _Job, assistant: Dict[str, Any], finish: Optional[str],
                     usage: Dict[str, Any], server: str, ids: Tuple[List[int], List[int]]) -> str:
        row = job.row
        head: Dict[str, Any] = {"id": job.row_id}  # id first: resume finds it without a full parse
        for key, value in row.items():
            if key not in OUTPUT_KEYS:
                head[key] = value
        mj = job.messages_json
        parts = [_dumps(head)[:-1], ',"messages":', mj[:-1], "," if len(mj) > 2 else "", _dumps(assistant), "]"]
        if job.tools_json is not None:
            parts += [',"tools":', job.tools_json]
        parts += [',"finish_reason":', _dumps(finish), ',"usage":', _dumps(usage),
                  ',"server":', _dumps(server), self._tail,
                  ',"prompt_token_ids":', _dumps(ids[0]), ',"response_token_ids":', _dumps(ids[1]), "}\n"]
        return "".join(parts)

    # ------------------------------------------------------------ input

    def _next_job(self) -> Optional[_Job]:
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
            return self._job(row)
        self._exhausted = True
        return None

    def _bad_input(self, row_id: Any, problem: str, excerpt: bytes) -> None:
        self.skipped_invalid += 1
        self._error_row(row_id if isinstance(row_id, str) else None, None, f"bad input: {problem}", 0, None,
                        excerpt=excerpt.decode("utf-8", "replace"))

    def _error_row(self, row_id: Optional[str], row: Optional[Dict[str, Any]], error: str, attempts: int,
                   server: Optional[str], status: Optional[int] = None, excerpt: Optional[str] = None) -> None:
        rec: Dict[str, Any] = {"id": row_id, "error": error, "attempts": attempts, "server": server,
                               "status": status, "time": round(time.time(), 3)}
        if row is not None:
            rec["source"] = row.get("source")
            rec["category"] = row.get("category")
        if excerpt is not None:
            rec["input"] = excerpt
        self.err.add(_dumps(rec) + "\n")
        self.err.flush()  # rare: straight to the OS, fsync with the next tick
        self.progress.errors += 1

    # ------------------------------------------------------------ readiness gate

    async def _get(self, session: aiohttp.ClientSession, url: str, timeout: float) -> Tuple[int, bytes]:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()

    async def _gate(self, session: aiohttp.ClientSession, index: int, deadline: float) -> None:
        """Wait until one server answers /health_generate and lists the model; bounded by ``ready_timeout``."""
        srv = self._servers[index]
        delay = self.s.ready_interval
        loop = asyncio.get_running_loop()
        while True:
            remaining = deadline - loop.time()
            try:
                probe_timeout = max(1.0, min(60.0, remaining))
                status, body = await self._get(session, srv.base + "/health_generate", probe_timeout)
                if status != 200:
                    raise RowError(f"/health_generate answered HTTP {status}", retry=True)
                status, body = await self._get(session, srv.base + "/v1/models", probe_timeout)
                if status != 200:
                    raise RowError(f"/v1/models answered HTTP {status}", retry=True)
                try:
                    ids = [m["id"] for m in _loads(body)["data"]]
                except (ValueError, KeyError, TypeError):
                    raise RowError(f"/v1/models answered {body[:120]!r}", retry=True) from None
                if self.model is None:
                    if not ids:
                        raise RowError("/v1/models lists no model", retry=True)
                    self.model = ids[0]
                elif self.model not in ids:
                    self.fatal = (f"{srv.base} serves {ids}, not the configured model {self.model!r}: "
                                  "set `model` to the served model name (sglang --served-model-name)")
                    self._first_ready.set()
                    return
                srv.ready = True
                srv.stats["ready"] = True
                srv.stats["last_error"] = None
                self._ready_order.append(index)
                self.log(f"generate: {srv.base} is ready (model {self.model})")
                self._first_ready.set()
                srv.event.set()
                return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, RowError) as exc:
                srv.stats["last_error"] = str(exc) or type(exc).__name__
            remaining = deadline - loop.time()
            if remaining <= 0 or self.stopping:
                srv.failed = True
                self.log(f"generate: {srv.base} not ready after {self.s.ready_timeout:g}s: {srv.stats['last_error']}")
                srv.event.set()
                if all(x.failed for x in self._servers):
                    self._first_ready.set()
                return
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 10.0)

    # ------------------------------------------------------------ workers

    def _server_for(self, home: int, attempt: int) -> _Server:
        if attempt == 0 or len(self._ready_order) < 2:
            return self._servers[home]
        # retries move on to the next ready server: one sick worker does not hold rows hostage
        order = self._ready_order
        pos = order.index(home) if home in order else 0
        return self._servers[order[(pos + attempt) % len(order)]]

    async def _worker(self, session: aiohttp.ClientSession, home: int) -> None:
        srv = self._servers[home]
        out = self.out
        try:
            while not self.stopping and srv.tasks <= srv.limit:  # above the limit: retire after the row
                while out.pending > _MAX_PENDING:  # the disk is slower than the servers: wait for the writer
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
        srv = self._servers[home]
        while srv.tasks < srv.limit and not self._exhausted and not self.stopping:
            srv.tasks += 1
            task = asyncio.create_task(self._worker(session, home))
            self._workers.add(task)
            task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task) -> None:
        self._workers.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()

    # ------------------------------------------------------------ in-flight limit

    async def _read_load(self, session: aiohttp.ClientSession, srv: _Server) -> List[WorkerLoad]:
        """The load of the workers behind ``srv`` now: the router's /engine_metrics (every worker), else the
        worker's own /metrics; [] when neither says anything (the limit then stays as it is)."""
        urls = [srv.load_url] if srv.load_url else [srv.base + "/engine_metrics", srv.base + "/metrics"]
        for url in urls:
            try:
                # identity: SGLang's /metrics (prometheus_client) gzips for a client that accepts it
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=_LOAD_TIMEOUT_S),
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

    async def _pilot(self, session: aiohttp.ClientSession, home: int) -> None:
        """Start ``home``'s worker tasks once it is ready; with ``concurrency: auto``, keep its limit on the
        workers' queues until the input runs out."""
        srv = self._servers[home]
        if not srv.ready:
            await srv.event.wait()
            if not srv.ready:
                return
        s = self.s
        if not s.adaptive:
            srv.limit = int(s.concurrency or 1)
            srv.stats["limit"] = srv.limit
            self._spawn(session, home)
            return
        policy = self._policy
        loads = await self._read_load(session, srv)
        if loads:
            srv.limit = initial_limit(len(loads), _START_PER_WORKER, policy)
        else:
            workers = await self._listed_workers(session, srv)
            srv.limit = initial_limit(workers, _BLIND_PER_WORKER, policy)
            self.log(f"generate: {srv.base} reports no load (sglang:num_running_reqs on /engine_metrics or "
                     f"/metrics): {srv.limit} requests in flight ({_BLIND_PER_WORKER} for each of {workers} "
                     "worker(s)) until it does; start the workers with --enable-metrics, or set generate.concurrency")
        self._note_limit(srv, loads)
        self._spawn(session, home)
        empty_before = True  # at the start the room is unknown: an empty first reading doubles at once
        while not self._exhausted and not self.stopping:
            await asyncio.sleep(s.load_interval)
            loads = await self._read_load(session, srv)
            limit = next_limit(srv.limit, srv.in_flight, loads, policy, empty_before)
            empty_before = all_empty(loads)
            if limit != srv.limit:
                srv.limit = limit
                self._spawn(session, home)
            self._note_limit(srv, loads)

    async def _listed_workers(self, session: aiohttp.ClientSession, srv: _Server) -> int:
        """How many workers a router lists (its GET /workers); 1 for a worker, or when it cannot say."""
        try:
            status, body = await self._get(session, srv.base + "/workers", _LOAD_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return 1
        listed = parse_router_workers(body) if status == 200 else None
        return max(1, len(listed)) if listed is not None else 1

    def _note_limit(self, srv: _Server, loads: List[WorkerLoad]) -> None:
        srv.stats["limit"] = srv.limit
        if loads:
            srv.stats.update(describe(loads))
        # a line when the limit moved by a quarter since the last one: the ramp and the settling, not every tick
        if srv.logged_limit == 0 or abs(srv.limit - srv.logged_limit) * 4 >= srv.logged_limit:
            srv.logged_limit = srv.limit
            load = describe(loads)
            self.log(f"generate: {srv.base}: {srv.limit} requests in flight at most ({load['workers']} workers "
                     f"report {load['running']} running, {load['queued']} queued)")

    async def _generate(self, session: aiohttp.ClientSession, job: _Job, home: int) -> None:
        s = self.s
        prog = self.progress
        last: Optional[RowError] = None
        srv = self._servers[home]
        for attempt in range(s.retries + 1):
            srv = self._server_for(home, attempt)
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
                self.out.add(self._output_line(job, assistant, finish, usage, srv.base, ids))
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
        self._error_row(job.row_id, job.row, str(last), attempt + 1, srv.base, last.status)
        self._failing += 1
        if self._failing >= s.max_consecutive_failures and not self.fatal:
            self.fatal = (f"{self._failing} rows failed one after the other (last: {last}); the servers look down: "
                          f"see {self.err.path}, fix them and run again (generate resumes)")
            self.request_stop()

    # ------------------------------------------------------------ housekeeping

    async def _ticker(self) -> None:
        """Run the housekeeping; a failure to write the output stops the run instead of stalling it."""
        try:
            await self._housekeeping()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a full disk, an I/O error: nothing more can be kept
            self.fatal = f"cannot write {self.out.path}: {exc}"
            self.log(f"generate: {self.fatal}")
            self.request_stop()

    async def _housekeeping(self) -> None:
        """Hand the buffered rows to the writer thread, fsync every ``fsync_interval``, rewrite the progress file."""
        loop = asyncio.get_running_loop()
        s = self.s
        tick = min(s.fsync_interval, s.progress_interval, 0.25)
        next_sync = loop.time() + s.fsync_interval
        next_progress = loop.time()
        next_log = loop.time() + _LOG_EVERY_S
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            sync = now >= next_sync
            if sync:
                next_sync = now + s.fsync_interval
            data = self.out.take()
            if data or sync:
                # write and fsync off the event loop: an append to a page under writeback waits
                # for the disk, and the requests must keep flowing meanwhile
                self._sync_fut = loop.run_in_executor(None, _write_and_sync, self.out, data, self.err, sync)
                # shielded: cancelling the ticker at the end must not cancel a write that has not started
                # (the rows are already out of the buffer); run() waits for it before the files close
                await asyncio.shield(self._sync_fut)
                self._sync_fut = None
            if now >= next_progress:
                self.write_progress()
                next_progress = now + s.progress_interval
            if now >= next_log:  # a line in the journal now and then, for whoever reads it there
                self.log(summary_line(self.progress.snapshot()))
                next_log = now + _LOG_EVERY_S

    def write_progress(self) -> None:
        try:
            write_json(self.progress_path, self.progress.snapshot(), durable=False)
        except OSError as exc:  # progress is advisory: a full disk shows up in the output writes
            self.log(f"generate: cannot write progress: {exc}")

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

    async def _serve(self, session: aiohttp.ClientSession, stop_wait: asyncio.Task) -> None:
        """Wait for the first ready server, run the workers to the end of the input or to a stop."""
        s = self.s
        first = asyncio.create_task(self._first_ready.wait())
        try:
            await asyncio.wait([first, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if self.fatal:
            raise GenerateError(self.fatal)
        if self.stopping:
            self.progress.state = "stopped"
            return
        if not self._ready_order:
            detail = "; ".join(f"{x.base}: {x.stats['last_error']}" for x in self._servers)
            raise GenerateError(f"no server became ready within generate.ready_timeout="
                                f"{s.ready_timeout:g}s ({detail})")
        self._encode_constants()
        self.progress.state = "running"
        self.write_progress()
        self._fleet = fleet_watch(s, self.progress, self.log, self._fail)
        pilots = [asyncio.create_task(self._pilot(session, i)) for i in range(len(self._servers))]
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
        if self.fatal:
            raise GenerateError(self.fatal)
        self.progress.state = "stopped" if self.stopping else "finished"

    async def run(self) -> None:
        s = self.s
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._first_ready = asyncio.Event()
        self._servers = [_Server(b, self.progress.servers[b]) for b in s.servers]
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
        ticker = None
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers,
                                             auto_decompress=False, raise_for_status=False) as session:
                self.progress.state = "waiting_for_servers"
                self.write_progress()
                ticker = asyncio.create_task(self._ticker())
                deadline = loop.time() + s.ready_timeout
                gates = [asyncio.create_task(self._gate(session, i, deadline)) for i in range(len(self._servers))]
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
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
            if self._sync_fut is not None:  # let a running fsync finish before the files close
                await asyncio.wait([self._sync_fut])


def _write_and_sync(out: AppendLog, data: bytes, err: AppendLog, sync: bool) -> None:
    out.write(data)
    if sync:
        out.sync()
        err.sync()
