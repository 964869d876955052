"""An OpenAI-compatible stand-in for an SGLang server (a worker), for tests and the lab.

Only the GPU is missing, so only the model is faked: the HTTP surface follows
SGLang's (``/v1/chat/completions``, native ``/generate``, ``/v1/models``,
``/health``, ``/health_generate``, ``/metrics``), the text is deterministic
(a function of the prompt and the seed), usage counts are consistent, and
``finish_reason`` is ``length`` when ``max_tokens`` cuts the answer short.
Rows that carry ``tools`` get a tool call first and a final answer once the
conversation ends in a tool result; ``chat_template_kwargs.enable_thinking``
makes the model think first (``<think>...</think>``), which lands in ``reasoning_content``
only with ``--reasoning-parser``, as SGLang's reasoning parser does. The README's fidelity
table names the upstream file each behaviour follows.

A capacity like a real worker's (``--max-running-requests``, ``--max-queued-requests``,
``--max-total-tokens``, ``--batch-token-latency``): a running batch, a waiting queue, decode steps
that take longer the bigger the batch, and SGLang's scheduler gauges on ``/metrics``
(``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``...).

Faults to test a client against: latency, a rate of 503s (SGLang's queue-full answer, which carries
no Retry-After), a rate of dropped connections (closed with no answer, or after half a body),
a not-ready period (listening and serving, but /health and /health_generate answer 503), a hung
model (``--hang-while FILE``) and a delayed listen (connection refused first, like a server still
loading weights).

Loopback only. Run::

    python tests/lab/sglang_standin/standin.py --port 30000 --model lab-model \
        [--latency 0.05] [--fail-rate 0.2] [--drop-rate 0.05] [--not-ready-for 5] [--port-file F]

It also answers SGLang's command line in the role's
lab mode: unknown options are ignored, ``--model-path``/``--served-model-name``
give the model name.

``--tokenizer DIR`` (SGLang's ``--tokenizer-path``): ``usage.prompt_tokens`` is the token
count of the chat template rendered by that tokenizer (``apply_chat_template`` with the
request's ``tools`` and ``chat_template_kwargs``, ``add_generation_prompt=True``), as SGLang
counts it, instead of the chars/4 estimate; needs ``transformers``.

Only workers: the lab and the tests route through the real sglang-router (``harness.RouterProcess``).
``--not-ready-while FILE`` holds readiness back (503 on ``/health`` and ``/health_generate``, as SGLang
while it starts) while FILE exists; ``{port}`` in FILE is the bound port, so one worker of many can be held.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ipaddress
import json
import logging
import os
import random
import secrets
import signal
import socket
import sys
import time
import zlib
from typing import Any, Dict, List, Optional

from aiohttp import web

VOCAB = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more can out up about "
    "into than its only other new some could time these two may then do first any my now such like our "
    "over man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three"
).split()
_NV = len(VOCAB)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def auth_allowed(method: str, path: str, authorization: Optional[str], api_key: Optional[str]) -> bool:
    """Whether a request passes ``--api-key``, as SGLang 0.5.23 decides it for its normal endpoints.

    ``sglang/srt/utils/auth.py`` (``decide_request_auth``, installed by ``srt/entrypoints/http_server.py``
    through ``add_api_key_middleware``): OPTIONS and paths starting with /health, /ready or /metrics are always
    allowed (probes and Prometheus carry no secret); everything else needs ``Authorization: Bearer KEY``
    (scheme case-insensitive, constant-time comparison) once a key is set; without a key all is allowed.
    """
    if method == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
        return True
    if not api_key:
        return True
    parts = (authorization or "").split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], api_key)


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400,
               param: Optional[str] = None) -> Dict[str, Any]:
    """An OpenAI-route error as SGLang writes it: ``ErrorResponse`` (``entrypoints/openai/protocol.py``) built by
    ``create_error_response`` (``entrypoints/openai/serving_base.py``). Never a Retry-After header: neither
    serving_base.py nor http_server.py's exception handlers set one."""
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": code}


def error_response(message: str, err_type: str = "BadRequestError", code: int = 400) -> web.Response:
    return web.json_response(error_body(message, err_type, code), status=code)


# serving_base.py handle_request: an HTTPException (the scheduler's 503 abort, raised by tokenizer_manager.py
# _handle_abort_finish_reason) becomes type str(status_code); HTTPStatus is an IntEnum, "503" on Python >= 3.11,
# which sglang 0.5.23 requires
QUEUE_FULL = "The request queue is full."  # managers/scheduler.py _abort_on_queued_limit


def context_error(input_tokens: int, max_new_tokens: Optional[int], context_length: int) -> Optional[str]:
    """Why SGLang refuses a request for its length, or None (``managers/tokenizer_manager.py``
    ``_validate_one_request``, without ``--allow-auto-truncate``): the prompt alone must be shorter than the
    context, and the prompt plus the requested new tokens (when the request names a limit) must fit in it."""
    if input_tokens >= context_length:
        return (f"The input ({input_tokens} tokens) is longer than the model's context length "
                f"({context_length} tokens).")
    if max_new_tokens is not None and input_tokens + max_new_tokens > context_length:
        return (f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
                f"You requested a total of {input_tokens + max_new_tokens} tokens: {input_tokens} tokens from the "
                f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit.")
    return None


def lora_adapter(model: str, served: str) -> Optional[str]:
    """The LoRA adapter a request's ``model`` names (``base:adapter``), or None: any other name is served as the
    one model (``entrypoints/openai/serving_base.py`` ``_parse_model_parameter``; the name is not checked)."""
    if ":" not in model or model == served:
        return None
    adapter = model[len(served) + 1:] if model.startswith(served + ":") else model.split(":", 1)[1]
    return adapter.strip() or None


def first_stop(text: str, stops: List[str]) -> Optional[tuple]:
    """(start, end, stop string) of the stop string the decoder meets first in ``text``, or None.

    ``managers/schedule_batch.py`` (``FINISH_MATCHED_STR``) checks the stop strings after every token, in the
    request's order, so the match that ends earliest wins (the first listed on a tie); the detokenizer then cuts
    the text at that string's first occurrence (``detokenizer_manager.py`` ``trim_matched_stop``)."""
    best: Optional[tuple] = None
    for stop in stops:
        pos = text.find(stop) if stop else -1
        if pos >= 0 and (best is None or pos + len(stop) < best[1]):
            best = (pos, pos + len(stop), stop)
    return best


def split_reasoning(text: str) -> tuple:
    """(reasoning or None, the rest): the Qwen3 reasoning parser on a non-streamed answer
    (``srt/parser/reasoning_parser.py``); an answer cut inside ``<think>`` is all reasoning."""
    if not text.startswith("<think>"):
        return None, text
    reasoning, _sep, rest = text[len("<think>"):].partition("</think>")
    return reasoning.strip() or None, rest.lstrip("\n")


def split_tool_call(text: str) -> tuple:
    """(content, call or None): a complete Hermes/Qwen ``<tool_call>`` block becomes the call, the text before it
    (stripped) the content; an incomplete one stays text (``srt/function_call/qwen25_detector.py``)."""
    start = text.find("<tool_call>")
    end = text.find("</tool_call>", start + 1)
    if start < 0 or end < 0:
        return text, None
    try:
        call = json.loads(text[start + len("<tool_call>"):end])
    except ValueError:
        return text, None
    return text[:start].strip(), call if isinstance(call, dict) else None


def _words(seed: int, n: int) -> str:
    # a small LCG: deterministic and cheap enough that the stand-in never becomes the bottleneck
    out = []
    x = seed & 0xFFFFFFFF
    for _step in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(VOCAB[(x >> 8) % _NV])
    return " ".join(out)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content)


class _OneLineForBadRequests(logging.Filter):
    """A request that is not HTTP/1 (sglang-router probes a worker over gRPC when /health fails) is one line,
    as uvicorn logs it under real SGLang ("Invalid HTTP request received."), not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == "BadHttpMessage":
            record.msg, record.args, record.exc_info = "WARNING:  Invalid HTTP request received.", (), None
        return True


logging.getLogger("aiohttp.server").addFilter(_OneLineForBadRequests())


def load_tokenizer(path: str) -> Any:
    """The fast tokenizer (with its chat template) in ``path``; SystemExit with the fix when unusable."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit("standin: --tokenizer needs the transformers package") from None
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # OSError, ValueError, HF errors
        raise SystemExit(f"standin: --tokenizer {path}: cannot load it: {exc}") from None
    if not getattr(tok, "is_fast", False) or not getattr(tok, "chat_template", None):
        raise SystemExit(f"standin: --tokenizer {path}: needs tokenizer.json and a chat_template")
    return tok


# ---------------------------------------------------------------- SGLang's request normalisation
# sglang 0.5.23, sglang/srt/entrypoints/openai/protocol.py (ChatCompletionMessageGenericParam, ToolCall,
# Function, Tool: model_dump) and serving_chat.py (_process_messages, normalize_tool_content,
# normalize_assistant_tool_call_arguments): what the chat template is given.

_GENERIC_FIELDS = ("role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls", "tools",
                   "prefix")


def sglang_tool(tool: Dict[str, Any]) -> Dict[str, Any]:
    """Tool.model_dump(): defer_loading (null unless set) added; the function's missing description/parameters
    as null after the keys the client sent, strict/defer_loading only when set, other keys dropped."""
    fn = tool.get("function") or {}
    defer = tool.get("defer_loading")
    vals = {"description": fn.get("description"), "name": fn.get("name"), "parameters": fn.get("parameters"),
            "strict": fn.get("strict"), "defer_loading": fn.get("defer_loading")}
    if vals["defer_loading"] is None:
        vals["defer_loading"] = defer
    vals = {k: v for k, v in vals.items() if v is not None or k not in ("strict", "defer_loading")}
    sent = [k for k in fn if k in vals]
    function = {k: vals[k] for k in sent + [k for k in vals if k not in sent]}
    return {"type": tool.get("type", "function"), "function": function, "defer_loading": defer}


def sglang_message(m: Dict[str, Any]) -> Dict[str, Any]:
    role = str(m.get("role", "")).lower()
    if role == "user":
        d: Dict[str, Any] = {"role": "user", "content": m.get("content")}
    else:
        d = {k: m.get(k) for k in _GENERIC_FIELDS}
        d["role"] = role
        calls = []
        for c in d["tool_calls"] or ():
            fn = c.get("function") or {}
            args = fn.get("arguments")
            if role == "assistant" and isinstance(args, str):
                args = json.loads(args)  # a ValueError is SGLang's 400
                if not isinstance(args, dict):
                    raise ValueError("Assistant tool call function.arguments must be a JSON object.")
            calls.append({"id": c.get("id"), "index": c.get("index"), "type": "function",
                          "function": {"name": fn.get("name"), "arguments": args}})
        d["tool_calls"] = calls if d["tool_calls"] is not None else None
        if d["tools"] is not None:
            d["tools"] = [sglang_tool(t) for t in d["tools"]]
    if d["content"] is None:
        d["content"] = ""
    content = d["content"]
    if role == "tool" and isinstance(content, list) and all(
            (isinstance(p, dict) and p.get("type") == "text") or isinstance(p, str) for p in content):
        d["content"] = " ".join(p.get("text", "") if isinstance(p, dict) else p for p in content)
    return d


def sglang_template_inputs(body: Dict[str, Any]) -> tuple:
    """(messages, tools) for apply_chat_template: no tools with tool_choice none, only the named one if named."""
    messages = [sglang_message(m) for m in body["messages"]]
    tools = body.get("tools") or None
    choice = body.get("tool_choice", "auto")
    if tools and choice != "none":
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            tools = [sglang_tool(t) for t in tools if (t.get("function") or {}).get("name") == name] or None
        else:
            tools = [sglang_tool(t) for t in tools]
    else:
        tools = None
    return messages, tools


def fake_ids(text: str, n: int) -> List[int]:
    """n token ids for text, without a tokenizer: deterministic, above the special range."""
    h = zlib.crc32(text.encode("utf-8", "surrogatepass"))
    return [1000 + (h + 7919 * i) % 30000 for i in range(n)]


# ---------------------------------------------------------------- the capacity model
# sglang 0.5.23: a worker runs at most --max-running-requests requests in one batch and keeps the rest in a
# waiting queue (managers/scheduler.py: waiting_queue, running_batch; managers/schedule_policy.py: PrefillAdder
# stops adding once the running batch is full or the token pool cannot hold another request); a request joins
# the batch between steps and leaves it when its last token is sampled (continuous batching). A full queue
# (--max-queued-requests) aborts the new request with 503 "The request queue is full."
# (scheduler.py _abort_on_queued_limit).
#
# The time model (the stand-in's own, documented in README.md): one decode step samples one token for every
# running request and takes  --token-latency + --batch-token-latency * running  seconds, the memory-bound part
# that does not depend on the batch plus the part that grows with it. A worker's token throughput,
# running / step time, therefore grows with the batch and is highest at --max-running-requests.


DEFAULT_TOKEN_POOL = 1 << 20  # --max-total-tokens unset: a pool that no test fills


class QueueFull(Exception):
    """The waiting queue holds --max-queued-requests already."""


class _Seq:
    __slots__ = ("left", "tokens", "reserve", "done")

    def __init__(self, tokens: int, prompt_tokens: int, reserve: int, done: asyncio.Future) -> None:
        self.left = tokens
        self.tokens = prompt_tokens
        self.reserve = reserve
        self.done = done


class BatchScheduler:
    """Continuous batching with a running cap, a FIFO waiting queue and a token pool; one step loop per worker."""

    def __init__(self, max_running: Optional[int], max_queued: Optional[int], max_total_tokens: int,
                 token_latency: float, batch_token_latency: float) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.max_total_tokens = max_total_tokens
        self.token_latency = token_latency
        self.batch_token_latency = batch_token_latency
        self.waiting: collections.deque[_Seq] = collections.deque()
        self.running: List[_Seq] = []
        self.used_tokens = 0  # KV tokens held by the running batch (prompt + sampled so far)
        self._reserved = 0  # what the running batch may still grow to (prompt + max new tokens)
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task] = None

    def step_seconds(self, batch: int) -> float:
        return self.token_latency + self.batch_token_latency * batch

    async def run(self, tokens: int, prompt_tokens: int, max_new_tokens: int) -> None:
        """Return once ``tokens`` tokens were sampled for this request (queued first when the batch is full)."""
        if self.max_queued is not None and len(self.waiting) + 1 > self.max_queued:
            raise QueueFull("The request queue is full.")
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        seq = _Seq(max(1, tokens), prompt_tokens, prompt_tokens + max(1, max_new_tokens),
                   asyncio.get_running_loop().create_future())
        self.waiting.append(seq)
        self._wake.set()
        try:
            await seq.done
        except asyncio.CancelledError:  # the client went away: the loop drops it at the next step
            seq.left = 0
            raise

    def _admit(self) -> None:
        # schedule_policy.py PrefillAdder: FIFO, while the batch has room and the pool can hold the request
        # (its prompt plus every token it may still sample); one request always runs, however large
        while self.waiting:
            seq = self.waiting[0]
            if seq.done.done():
                self.waiting.popleft()
                continue
            if self.max_running is not None and len(self.running) >= self.max_running:
                return
            if self.running and self._reserved + seq.reserve > self.max_total_tokens:
                return
            self.waiting.popleft()
            self.running.append(seq)
            self._reserved += seq.reserve
            self.used_tokens += seq.tokens

    async def _loop(self) -> None:
        while True:
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(self.step_seconds(len(self.running)))
            still: List[_Seq] = []
            for seq in self.running:
                if seq.left > 0 and not seq.done.done():
                    seq.left -= 1
                    seq.tokens += 1
                    self.used_tokens += 1
                if seq.left > 0 and not seq.done.done():
                    still.append(seq)
                    continue
                self._reserved -= seq.reserve
                self.used_tokens -= seq.tokens
                if not seq.done.done():
                    seq.done.set_result(None)
            self.running = still

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.max_total_tokens if self.max_total_tokens else 0.0


class StandIn:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.model = args.model
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.started = time.time()
        self.counters: Dict[str, int] = {
            "requests": 0, "ok": 0, "injected_503": 0, "dropped": 0, "prompt_tokens": 0, "generation_tokens": 0,
        }
        self.active = 0  # requests in the model without a capacity model
        a = args
        capacity = (a.max_running_requests, a.max_queued_requests, a.max_total_tokens) != (None, None, None)
        self.scheduler: Optional[BatchScheduler] = BatchScheduler(
            a.max_running_requests, a.max_queued_requests, a.max_total_tokens or DEFAULT_TOKEN_POOL, a.token_latency,
            a.batch_token_latency) if capacity or a.batch_token_latency > 0 else None
        self.seen_ids: Dict[str, int] = {}
        self.hold_file = ""  # set once the port is known ({port} in --not-ready-while)
        self.hang_file = ""  # likewise for --hang-while
        # tokenizer_manager.py: gracefully_exit (set by SIGTERM), server_status UnHealthy (a health check timed out)
        self.gracefully_exit = False
        self.unhealthy = False
        self.in_flight = 0  # chat and generate requests not yet answered: what a SIGTERM drains
        self.tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None

    # ------------------------------------------------------------------ helpers

    def chat_prompt_ids(self, messages: List[Dict[str, Any]], tools: Any, kwargs: Dict[str, Any]) -> List[int]:
        """The prompt ids as SGLang makes them (serving_chat.py _process_messages): the chat template rendered
        with the normalised messages/tools and add_generation_prompt, encoded without special tokens;
        without --tokenizer, chars/4 made-up ids."""
        if self.tokenizer is None:
            n = sum(4 + len(_text_of(m.get("content"))) // 4 for m in messages)
            n += len(json.dumps(tools)) // 4 if tools else 0
            return fake_ids(json.dumps(messages), n)
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True, **kwargs)
        return self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids

    def output_ids(self, raw: str, n_words: int, max_tokens: int, stop: bool) -> tuple:
        """(ids, truncated): what the model sampled for ``raw``, the stop token last when it stopped by itself
        (the scheduler appends every sampled id; detokenizer_manager.py trims only the text)."""
        if self.tokenizer is None:
            ids = fake_ids(raw, n_words)
            eos = 2
        else:
            ids = self.tokenizer.backend_tokenizer.encode(raw, add_special_tokens=False).ids
            eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            if not isinstance(eos, int) or eos == self.tokenizer.unk_token_id:
                eos = self.tokenizer.eos_token_id
        if stop:
            ids = ids + [eos]
        if len(ids) > max_tokens:
            return ids[:max_tokens], True
        return ids, False

    def count_text(self, text: str) -> int:
        if self.tokenizer is None:
            return 1 + len(text) // 4
        return len(self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    def ready(self) -> bool:
        """Past SGLang's ``ServerStatus.Starting``: past ``--not-ready-for`` and no ``--not-ready-while`` file."""
        if self.hold_file and os.path.exists(self.hold_file):
            return False
        return time.monotonic() - self.t0 >= self.a.not_ready_for

    def hung(self) -> bool:
        """The model produces nothing (``--hang-while FILE`` exists): a stuck scheduler or GPU."""
        return bool(self.hang_file) and os.path.exists(self.hang_file)

    async def _fault(self, request: web.Request) -> Optional[web.StreamResponse]:
        """Maybe inject a fault: a 503, or a dropped connection. None: answer normally."""
        a = self.a
        if not self.ready():
            # http_server.py gates only /health and /health_generate on server_status: SGLang's own warm-up
            # request is a chat or generate request served while Starting, and so is anyone else's
            self.counters["while_not_ready"] = self.counters.get("while_not_ready", 0) + 1
        r = self.rng.random()
        if r < a.fail_rate:
            # what a real worker says when it sheds load: the queue-full abort (no Retry-After)
            self.counters["injected_503"] += 1
            return self.queue_full()
        if r < a.fail_rate + a.drop_rate:
            self.counters["dropped"] += 1
            if self.rng.random() < 0.5:
                # half a body, then the connection goes: the client must not take it for an answer
                resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                               "Content-Length": "4096"})
                await resp.prepare(request)
                await resp.write(b'{"id":"x","object":"chat.completion","choices":[{"index":0,')
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # aiohttp drops the handler quietly
        return None

    def _completion(self, prompt: str, max_tokens: int, seed: int) -> tuple:
        """(text, completion_tokens, finish_reason): the length is a function of the prompt."""
        h = zlib.crc32(prompt.encode("utf-8", "surrogatepass"), seed) & 0xFFFFFFFF
        natural = self.a.min_tokens + h % max(1, self.a.max_natural_tokens - self.a.min_tokens + 1)
        n = min(natural, max_tokens)
        return _words(h, n), n, ("length" if natural > max_tokens else "stop")

    async def _latency(self, n_tokens: int, prompt_tokens: int, max_new_tokens: int) -> None:
        """The model's time for one request: ``--latency``, then its tokens (through the batch scheduler when
        a capacity is set; raises QueueFull when its queue is full)."""
        while self.hung():  # requests wait as long as the model hangs
            await asyncio.sleep(0.05)
        if self.a.latency > 0:
            await asyncio.sleep(self.a.latency)
        if self.scheduler is not None:
            await self.scheduler.run(n_tokens, prompt_tokens, max_new_tokens)
            return
        self.active += 1  # no capacity: every request runs at once (sglang:num_running_reqs, no queue)
        try:
            if self.a.token_latency > 0:
                await asyncio.sleep(self.a.token_latency * n_tokens)
        finally:
            self.active -= 1

    @staticmethod
    def queue_full() -> web.StreamResponse:
        # scheduler.py _abort_on_queued_limit (status 503), turned into an HTTPException by tokenizer_manager.py
        # and into ErrorResponse(type=str(503)) by serving_base.py handle_request (and for /generate by
        # http_server.py's HTTPException handler, the same body)
        return error_response(QUEUE_FULL, "503", 503)

    # ------------------------------------------------------------------ endpoints

    def _answer(self, prompt: str, last: Dict[str, Any], t_tools: Any, max_tokens: int, seed: int,
                thinking: bool) -> tuple:
        """(raw, n, finish): the text the model writes (Qwen/Hermes markup: ``<think>...</think>``, then the
        answer or a ``<tool_call>`` block), its token count and how it ends by itself ("stop", "length")."""
        # the reasoning (10 tokens) and the stop token come out of the same max_tokens budget
        reserve = 10 if thinking else 0
        text, n, finish = self._completion(prompt, max(1, max_tokens - reserve - 1), seed)
        if finish == "length":  # it would not have stopped: the whole budget is answer, no stop token
            text, n, finish = self._completion(prompt, max(1, max_tokens - reserve), seed)
        raw = text
        if t_tools and last.get("role") != "tool":
            fn = t_tools[0]["function"]
            props = list((fn.get("parameters") or {}).get("properties", {}))
            args = {p: _words(zlib.crc32(p.encode(), seed), 2) for p in props}
            raw = "<tool_call>\n" + json.dumps({"name": fn.get("name") or "tool", "arguments": args}) + "\n</tool_call>"
            n, finish = 8 + 4 * len(props), "stop"
        if thinking:
            raw = "<think>\nLet me think. " + _words(n, 8) + "\n</think>\n\n" + raw
            n += 10
        return raw, n, finish

    def _sampled(self, raw: str, n: int, max_tokens: int, natural: str, stops: List[str],
                 no_stop_trim: bool) -> tuple:
        """(text, output ids, finish_reason, matched_stop): what decoding ``raw`` gives under ``max_tokens`` and the
        request's ``stop`` strings. A stop string met within the budget ends it there ("stop", the string; the
        text cut before it unless ``no_stop_trim``: ``detokenizer_manager.py`` ``trim_matched_stop``); else
        ``max_tokens`` cuts it ("length") or the model stops by itself (the stop token last, ``matched_stop`` its
        id)."""
        out_ids, cut = self.output_ids(raw, n, max_tokens, natural != "length")
        hit = first_stop(raw, stops)
        if hit is not None:
            start, end, stop = hit
            upto = raw[:end]
            if self.tokenizer is not None:
                ids = self.tokenizer.backend_tokenizer.encode(upto, add_special_tokens=False).ids
            else:  # made-up ids: as many as the share of the text sampled up to the match
                ids = fake_ids(upto, max(1, round(n * len(upto) / max(1, len(raw)))))
            if len(ids) <= max_tokens:
                return (upto if no_stop_trim else raw[:start]), ids, "stop", stop
        if cut:  # ran into max_tokens: what was sampled
            return (self.tokenizer.decode(out_ids) if self.tokenizer is not None else raw), out_ids, "length", None
        return raw, out_ids, natural, out_ids[-1] if natural != "length" else None

    def _message(self, text: str, tools: bool, call_id: str) -> tuple:
        """(message, has tool calls): the parsers on the sampled text (``serving_chat.py`` ``_build_chat_response``):
        the reasoning parser only when the worker has ``--reasoning-parser``, then the tool-call markup when the
        request has tools; ``content`` is "" rather than null."""
        reasoning = None
        if self.a.reasoning_parser:
            reasoning, text = split_reasoning(text)
        message: Dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": reasoning}
        if tools:
            content, call = split_tool_call(text)
            if call is not None:
                message["content"] = content
                message["tool_calls"] = [{"id": call_id, "index": 0, "type": "function", "function": {
                    "name": call.get("name") or "tool", "arguments": json.dumps(call.get("arguments") or {})}}]
                return message, True
        return message, False

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.counters["requests"] += 1
        fault = await self._fault(request)
        if fault is not None:
            return fault
        try:
            body = json.loads(await request.read())
            messages: List[Dict[str, Any]] = body["messages"]
            if not isinstance(messages, list):
                raise ValueError("messages must be a list")
        except (ValueError, KeyError, TypeError) as exc:
            # http_server.py: a body that does not validate is a 400 "Bad Request" (not FastAPI's 422)
            return error_response(f"bad request: {exc}", "Bad Request")
        if not messages:
            return error_response("Messages cannot be empty.")  # serving_chat.py _validate_request
        # the model name is not checked (serving_base.py _parse_model_parameter: only "base:adapter" means a
        # LoRA adapter, refused without --enable-lora by tokenizer_manager.py); the response echoes it
        model = str(body.get("model") or "default")  # protocol.py DEFAULT_MODEL_NAME
        adapter = lora_adapter(model, self.model)
        if adapter is not None:
            return error_response(f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch "
                                  "the server with --enable-lora flag and preload adapters using --lora-paths or "
                                  "/load_lora_adapter endpoint.")
        kwargs = body.get("chat_template_kwargs") or {}
        if body.get("stream") and (body.get("return_prompt_token_ids") or body.get("return_token_ids")):
            # serving_chat.py _convert_to_internal_request: a ValueError, type "BadRequest"
            return error_response("return_token_ids is not supported with streaming on /v1/chat/completions. "
                                  "Please set stream=false when using return_token_ids=true.", "BadRequest")
        try:
            t_messages, t_tools = sglang_template_inputs(body)
            prompt_ids = self.chat_prompt_ids(t_messages, t_tools, kwargs)
        except Exception as exc:  # bad tool-call arguments, jinja errors (bad role order...): SGLang's 400
            return error_response(f"chat template: {exc}", "BadRequest")
        prompt_tokens = len(prompt_ids)
        # protocol.py: max_new_tokens = max_completion_tokens or max_tokens (None: no total check, the scheduler's
        # own default)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        too_long = context_error(prompt_tokens, int(limit) if limit else None, self.a.context_length)
        if too_long:
            return error_response(too_long)  # a ValueError in generate_request: serving_chat.py's default type
        max_tokens = int(limit or 128)
        # SGLang samples with a request's seed only under --enable-deterministic-inference
        # (srt/sampling/sampling_batch_info.py); otherwise the seed is ignored
        seed = int(body.get("seed") or 0) if self.a.enable_deterministic_inference else 0
        last = messages[-1]
        prompt = _text_of(last.get("content")) + "|" + str(len(messages))
        raw, n, natural = self._answer(prompt, last, t_tools, max_tokens, seed, bool(kwargs.get("enable_thinking")))
        stops = body.get("stop") or []
        text, out_ids, finish, matched = self._sampled(raw, n, max_tokens, natural,
                                                       [stops] if isinstance(stops, str) else list(stops),
                                                       bool(body.get("no_stop_trim")))
        message, called = self._message(text, bool(t_tools), f"call_{zlib.crc32(prompt.encode()) & 0xFFFFFF:06x}")
        if called and finish == "stop":  # serving_chat.py _process_tool_calls: "tool_calls", matched dropped
            finish, matched = "tool_calls", None
        n = len(out_ids)
        try:
            await self._latency(n, prompt_tokens, max_tokens)
        except QueueFull:
            return self.queue_full()
        self.counters["ok"] += 1
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["generation_tokens"] += n
        choice: Dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                                  "matched_stop": matched}
        # protocol.py ChatCompletionResponseChoice: the ids only when asked (return_token_ids implies both)
        if body.get("return_prompt_token_ids") or body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt_ids
        if body.get("return_token_ids"):
            choice["response_token_ids"] = out_ids
        resp: Dict[str, Any] = {
            "id": f"chatcmpl-{self.counters['requests']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n,
                      "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None},
            "metadata": None,
        }
        # server flags --return-input-ids/--return-output-ids (or the request's *_in_sglext): the response-level
        # sglext, which sglang-router passes through although it drops the request flags
        sglext: Dict[str, Any] = {}
        if self.a.return_input_ids or body.get("return_input_ids_in_sglext"):
            sglext["input_ids"] = prompt_ids
        if self.a.return_output_ids or body.get("return_output_ids_in_sglext"):
            sglext["output_ids"] = [out_ids]
        if sglext:
            resp["sglext"] = sglext
        if self.a.record_requests:
            with open(self.a.record_requests, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(body) + "\n")
        return web.Response(body=json.dumps(resp).encode(), content_type="application/json")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's native endpoint: ``{text, sampling_params}`` -> ``{text, meta_info}``."""
        self.counters["requests"] += 1
        fault = await self._fault(request)
        if fault is not None:
            return fault
        try:
            body = json.loads(await request.read())
            prompt = body.get("text")
            input_ids = body.get("input_ids")
            if prompt is None and input_ids is not None:
                prompt = " ".join(map(str, input_ids))
            if not isinstance(prompt, str):
                raise ValueError("text (or input_ids) is required")
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": {"message": f"bad request: {exc}"}}, status=400)
        sp = body.get("sampling_params") or {}
        prompt_tokens = len(input_ids) if isinstance(input_ids, list) else self.count_text(prompt)
        too_long = context_error(prompt_tokens, sp.get("max_new_tokens"), self.a.context_length)
        if too_long:  # http_server.py generate_request: a ValueError is _create_error_response's {"error": ...}
            return web.json_response({"error": {"message": too_long}}, status=400)
        max_new = int(sp.get("max_new_tokens") or 128)
        text, n, finish = self._completion(prompt, max_new, int(sp.get("seed") or 0))
        out_ids, _cut = self.output_ids(text, n, max_new, finish != "length")
        n = len(out_ids)
        try:
            await self._latency(n, prompt_tokens, max_new)
        except QueueFull:
            return self.queue_full()
        self.counters["ok"] += 1
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["generation_tokens"] += n
        reason: Dict[str, Any] = {"type": finish}
        if finish == "length":
            reason["length"] = n
        # tokenizer_manager.py: the finished request's out_dict is {text, output_ids, meta_info}
        return web.json_response({"text": text, "output_ids": out_ids, "meta_info": {
            "id": f"gen-{self.counters['requests']}", "prompt_tokens": prompt_tokens, "completion_tokens": n,
            "cached_tokens": 0, "finish_reason": reason}})

    def model_card(self) -> Dict[str, Any]:
        return {"id": self.model, "object": "model", "created": int(self.started), "owned_by": "sglang",
                "root": self.model, "max_model_len": self.a.context_length}

    async def models(self, request: web.Request) -> web.StreamResponse:
        # SGLang answers /v1/models as soon as it listens (http_server.py available_models), ready or not
        return web.json_response({"object": "list", "data": [self.model_card()]})

    async def retrieve_model(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["model"] != self.model:
            return web.json_response({"error": {"message": f"The model '{request.match_info['model']}' does not "
                                                "exist", "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}}, status=404)
        return web.json_response(self.model_card())

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        """SGLang's /model_info (and the deprecated /get_model_info): sglang-router reads the model id here."""
        return web.json_response({
            "model_path": self.a.model_path or self.model, "served_model_name": self.model,
            "tokenizer_path": self.a.tokenizer or self.a.model_path or self.model, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "load_format": "auto",
            "reasoning_parser": self.a.reasoning_parser, "tool_call_parser": self.a.tool_call_parser,
            "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "standin", "architectures": ["StandIn"]})

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        """A subset of SGLang's /server_info (and /get_server_info): the launch settings sglang-router reads."""
        return web.json_response({
            "model_path": self.a.model_path or self.model, "served_model_name": self.model,
            "tokenizer_path": self.a.tokenizer, "context_length": self.a.context_length, "tp_size": 1, "dp_size": 1,
            "reasoning_parser": self.a.reasoning_parser, "tool_call_parser": self.a.tool_call_parser,
            "enable_deterministic_inference": self.a.enable_deterministic_inference, "version": "standin", "internal_states": [{}]})

    async def health_generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's ``/health`` and ``/health_generate`` (``entrypoints/http_server.py`` ``health_generate``): 503
        while shutting down or starting; otherwise a one-token generation, 200 once the model answers, 503 (and
        the worker UnHealthy) when it does not within the health-check timeout."""
        self.counters["health_generate"] = self.counters.get("health_generate", 0) + 1
        if self.gracefully_exit or not self.ready():
            return web.Response(status=503)
        if not await self._one_token():
            print("standin: Health check failed. Server couldn't get a response from detokenizer for last "
                  f"{self.a.health_check_timeout:g} seconds.", file=sys.stderr, flush=True)
            self.unhealthy = True
            return web.Response(status=503)
        self.unhealthy = False  # http_server.py: a health check that succeeds sets the status Up again
        return web.Response(status=200)

    async def _one_token(self) -> bool:
        """Whether the health check's generation comes back in time. Upstream it is a real one-token request
        (1 to 20 s on a busy node, polled once a second); here ``--health-generate-latency``, longer while hung."""
        deadline = time.monotonic() + self.a.health_check_timeout
        await asyncio.sleep(min(self.a.health_generate_latency, self.a.health_check_timeout))
        while self.hung():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def ready_endpoint(self, request: web.Request) -> web.StreamResponse:
        # http_server.py /ready: tokenizer_manager.is_ready(), no generation
        up = not self.gracefully_exit and self.ready() and not self.unhealthy
        return web.Response(status=200 if up else 503)

    def scheduler_gauges(self) -> Dict[str, float]:
        """What the scheduler reports now (metrics_reporter.py: running batch, waiting queue, token pool)."""
        sch = self.scheduler
        if sch is None:
            return {"num_running_reqs": self.active, "num_queue_reqs": 0, "token_usage": 0.0,
                    "num_used_tokens": 0, "max_total_num_tokens": self.a.max_total_tokens or DEFAULT_TOKEN_POOL}
        return {"num_running_reqs": len(sch.running), "num_queue_reqs": len(sch.waiting),
                "token_usage": sch.token_usage, "num_used_tokens": sch.used_tokens,
                "max_total_num_tokens": sch.max_total_tokens}

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        c = self.counters
        # observability/metrics_collector.py: the scheduler's gauges carry model_name, engine_type, tp_rank,
        # pp_rank, moe_ep_rank (SchedulerMetricsCollector labels, engine_type "unified" without disaggregation);
        # the tokenizer's counters model_name and engine_type (tokenizer_metric_labels); prometheus_client
        # writes gauge values as floats
        sched_labels = (f'model_name="{self.model}",engine_type="unified",tp_rank="0",pp_rank="0",'
                        'moe_ep_rank="0"')
        helps = {"num_running_reqs": "The number of running requests.",
                 "num_queue_reqs": "The number of requests in the waiting queue.",
                 "token_usage": "The token usage.", "num_used_tokens": "The number of used tokens.",
                 "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool."}
        lines: List[str] = []
        for name, value in self.scheduler_gauges().items():
            lines += [f"# HELP sglang:{name} {helps[name]}", f"# TYPE sglang:{name} gauge",
                      f"sglang:{name}{{{sched_labels}}} {float(value)!r}"]
        label = f'model_name="{self.model}",engine_type="unified"'
        lines += [
            "# TYPE sglang:prompt_tokens_total counter", f"sglang:prompt_tokens_total{{{label}}} {c['prompt_tokens']}",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{{{label}}} {c['generation_tokens']}",
            "# TYPE sglang:num_requests_total counter", f"sglang:num_requests_total{{{label}}} {c['requests']}",
            "# TYPE standin_ok_total counter", f"standin_ok_total {c['ok']}",
            "# TYPE standin_injected_503_total counter", f"standin_injected_503_total {c['injected_503']}",
            "# TYPE standin_dropped_total counter", f"standin_dropped_total {c['dropped']}",
            "# TYPE standin_unauthorized_total counter", f"standin_unauthorized_total {c.get('unauthorized', 0)}",
            "# TYPE standin_requests_while_not_ready_total counter",
            f"standin_requests_while_not_ready_total {c.get('while_not_ready', 0)}",
            "# TYPE standin_health_generate_total counter",
            f"standin_health_generate_total {c.get('health_generate', 0)}",
            "# TYPE standin_start_time_seconds gauge", f"standin_start_time_seconds {self.started:.3f}",
            "# TYPE standin_tokenizer_info gauge", f"standin_tokenizer_info {1 if self.tokenizer else 0}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    @web.middleware
    async def _count_in_flight(self, request: web.Request, handler):
        """Count the model requests in flight: a SIGTERM waits for them (tokenizer_manager.py sigterm_watchdog)."""
        if request.path not in ("/v1/chat/completions", "/generate"):
            return await handler(request)
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1

    async def drain(self) -> None:
        """SIGTERM (tokenizer_manager.py ``SignalHandler.sigterm_handler`` and ``sigterm_watchdog``): health answers
        503 from now on; requests keep being served until none is left (checked every ``--drain-poll`` seconds,
        5 upstream), at once when a health check had failed (UnHealthy: SGLang force-exits)."""
        print("standin: SIGTERM received. Draining requests and shutting down...", file=sys.stderr, flush=True)
        self.gracefully_exit = True
        said = 0.0  # the count is logged every 5 s, as upstream's loop does, however fast the stand-in polls
        while True:
            await asyncio.sleep(self.a.drain_poll)
            if self.unhealthy:
                print("standin: Signal SIGTERM received while health check failed. Force exiting.",
                      file=sys.stderr, flush=True)
                return
            if self.in_flight == 0:
                return
            if time.monotonic() - said >= 5.0:
                said = time.monotonic()
                print(f"standin: Gracefully exiting... Remaining number of requests {self.in_flight}.",
                      file=sys.stderr, flush=True)

    @web.middleware
    async def _api_key(self, request: web.Request, handler):
        """SGLang's answer to a request without the key: 401 ``{"error": "Unauthorized"}`` (auth.py's middleware)."""
        if not auth_allowed(request.method, request.path, request.headers.get("Authorization"),
                            self.a.api_key):
            self.counters["unauthorized"] = self.counters.get("unauthorized", 0) + 1
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._api_key, self._count_in_flight])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.retrieve_model)  # http_server.py: {model:path}
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info)
        # http_server.py: one handler for both paths (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on by default)
        app.router.add_get("/health", self.health_generate)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/ready", self.ready_endpoint)
        app.router.add_get("/metrics", self.metrics)
        return app


# sampling/watermarking/core.py WATERMARK_SECRET_FIELD_NAMES: the only server_args fields SGLang's log line redacts
WATERMARK_SECRETS = ("watermark_key", "watermark_key_b", "watermark_config")


def merge_config(parser: argparse.ArgumentParser, argv: List[str]) -> List[str]:
    """``argv`` with ``--config FILE`` replaced by the file's settings, as SGLang merges them
    (``sglang/srt/utils/server_args_config_parser.py`` ``ConfigArgumentMerger``): one ``--config`` only, a .yaml or
    .yml file holding a mapping; each key becomes ``--KEY`` spelled as written (so ``api_key`` gives ``--api_key``,
    which the parser then refuses); a boolean of a store_true flag is the bare flag when true and nothing when
    false, of any other key ``--KEY true|false``; a list is ``--KEY a b``, a mapping its JSON, the rest ``str()``.
    The file's flags go first, then the command line without ``--config FILE``: argparse keeps the last value,
    so the command line wins. ValueError says what is wrong, as upstream raises it."""
    import yaml  # only with --config

    at = [i for i, a in enumerate(argv) if a == "--config"]
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if at[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = argv[at[0] + 1]
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {suffix}")
    if not os.path.exists(path):
        raise ValueError(f"Config file not found: {path}")
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    # the keys of store_true flags: dest and every long spelling, normalised to underscores (_config_keys)
    flags = {key for act in parser._actions if isinstance(act, argparse._StoreTrueAction)
             for key in [act.dest] + [o[2:].replace("-", "_") for o in act.option_strings if o.startswith("--")]}
    out: List[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if str(key).replace("-", "_") in flags:
                out += [f"--{key}"] if value else []
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out + argv[:at[0]] + argv[at[0] + 2:]


def server_args_line(args: argparse.Namespace) -> str:
    """The start-up line SGLang logs (``sglang/srt/entrypoints/engine.py``: ``server_args=`` and the resolved
    settings, ``_server_args_for_logging``): only the watermark secrets are redacted, ``api_key`` is in clear.
    The stand-in's settings under SGLang's field names, in SGLang's log format ("[%Y-%m-%d %H:%M:%S] ")."""
    rename = {"model": "served_model_name", "tokenizer": "tokenizer_path"}
    fields = {rename.get(k, k): v for k, v in vars(args).items() if k not in ("config", "worker_urls")}
    for secret in WATERMARK_SECRETS:
        fields[secret] = "<redacted>" if fields.get(secret) is not None else None
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] server_args={fields}"


def build_parser() -> argparse.ArgumentParser:
    """The stand-in's flags: its own, and the SGLang ones it follows (others are accepted and ignored)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--host", default="127.0.0.1", help="loopback only")
    ap.add_argument("--port", type=int, default=30000, help="0: any free port (see --port-file)")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--model", "--served-model-name", dest="model", default=None)
    ap.add_argument("--model-path", default=None, help="SGLang's flag; the model name when --model is not given")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault injection")
    ap.add_argument("--return-input-ids", action="store_true",
                    help="SGLang's flag: every chat response carries sglext.input_ids")
    ap.add_argument("--return-output-ids", action="store_true",
                    help="SGLang's flag: every chat response carries sglext.output_ids")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    ap.add_argument("--token-latency", type=float, default=0.0, help="seconds per generated token")
    ap.add_argument("--max-running-requests", type=int, default=None,
                    help="SGLang's flag: requests in one batch, the rest wait in the queue (default: no cap)")
    ap.add_argument("--max-queued-requests", type=int, default=None,
                    help="SGLang's flag: a request beyond this many waiting is refused with 503 (default: no cap)")
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="SGLang's flag: the token pool (KV cache); a request is admitted when the batch's "
                         "prompts plus max new tokens fit (default: 1048576, never the limit)")
    ap.add_argument("--batch-token-latency", type=float, default=0.0,
                    help="seconds a decode step takes longer per running request (step time: "
                         "--token-latency + this x running)")
    ap.add_argument("--fail-rate", type=float, default=0.0,
                    help="share of requests answered 503 as SGLang answers a full queue (no Retry-After)")
    ap.add_argument("--drop-rate", type=float, default=0.0, help="share of requests whose connection is dropped")
    ap.add_argument("--not-ready-for", type=float, default=0.0,
                    help="seconds /health and /health_generate answer 503 (starting; chat is served)")
    ap.add_argument("--not-ready-while", default="", metavar="FILE",
                    help="/health and /health_generate answer 503 while FILE exists ({port}: the bound port), "
                         "as a worker still starting")
    ap.add_argument("--hang-while", default="", metavar="FILE",
                    help="the model hangs while FILE exists ({port}: the bound port): requests wait, /health and "
                         "/health_generate answer 503 after --health-check-timeout")
    ap.add_argument("--health-generate-latency", type=float, default=0.02,
                    help="seconds the health check's one-token generation takes (1 to 20 s on a real node)")
    ap.add_argument("--health-check-timeout", type=float,
                    default=float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")),
                    help="seconds a health check waits for its token (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT)")
    ap.add_argument("--drain-poll", type=float, default=0.1,
                    help="after SIGTERM, seconds between checks for requests still in flight (5 in SGLang)")
    ap.add_argument("--enable-deterministic-inference", action="store_true",
                    help="SGLang's flag: only then does a request's seed change the answer")
    ap.add_argument("--reasoning-parser", default=None,
                    help="SGLang's flag: thinking goes to reasoning_content (else it stays in content); "
                         "reported by /model_info")
    ap.add_argument("--tool-call-parser", default=None, help="SGLang's flag; reported by /model_info")
    ap.add_argument("--listen-delay", type=float, default=0.0, help="seconds before the port is opened")
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-natural-tokens", type=int, default=64, help="longest natural answer in tokens")
    ap.add_argument("--context-length", type=int, default=32768)
    ap.add_argument("--record-requests", help="append every chat request body to this JSONL file")
    ap.add_argument("--api-key", default=None,
                    help="SGLang's flag: every endpoint but /health*, /ready*, /metrics needs 'Authorization: Bearer KEY'")
    ap.add_argument("--tokenizer", "--tokenizer-path", dest="tokenizer", default=None,
                    help="count prompt_tokens with this tokenizer's chat template (needs transformers)")
    for secret in WATERMARK_SECRETS:  # accepted so that the server_args line shows what upstream redacts
        ap.add_argument("--" + secret.replace("_", "-"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, metavar="FILE.yaml",
                    help="SGLang's config file: its keys are flags (api-key: KEY), the command line wins")
    ap.add_argument("--worker-urls", nargs="+", default=None, help=argparse.SUPPRESS)
    return ap


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        try:
            argv = merge_config(ap, argv)
        except (ValueError, OSError) as exc:  # upstream raises these out of prepare_server_args
            ap.exit(1, f"standin: --config: {exc}\n")
    # no SGLang flag has an underscore, so its parser refuses --api_key (what an api_key: key in the config
    # file turns into); the stand-in ignores flags it does not know, but not these
    wrong = [a for a in argv if a.startswith("--") and "_" in a.split("=", 1)[0]]
    if wrong:
        ap.error(f"unrecognized arguments: {' '.join(wrong)}")
    args, _unknown = ap.parse_known_args(argv)  # SGLang/router flags in lab mode are accepted and ignored
    if args.model is None:
        args.model = os.path.basename((args.model_path or "standin-model").rstrip("/")) or "standin-model"
    if not _is_loopback(args.host):
        ap.error(f"--host {args.host}: the stand-in listens on loopback only (127.0.0.1)")
    for name in ("fail_rate", "drop_rate"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            ap.error(f"--{name.replace('_', '-')} must be between 0 and 1")
    for name in ("max_running_requests", "max_queued_requests", "max_total_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("batch_token_latency", "token_latency", "health_generate_latency", "health_check_timeout",
                 "drain_poll"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative")
    if args.fail_rate + args.drop_rate > 1.0:
        ap.error("--fail-rate plus --drop-rate must not exceed 1")
    if args.worker_urls:
        ap.error("--worker-urls: the stand-in is a worker only; route with the real sglang-router "
                 "(python -m sglang_router.launch_router --worker-urls ...; harness.RouterProcess in tests)")
    return args


async def serve(args: argparse.Namespace) -> None:
    print(server_args_line(args), file=sys.stderr, flush=True)  # before the model loads, as upstream
    if args.listen_delay > 0:
        await asyncio.sleep(args.listen_delay)
    standin = StandIn(args)
    standin.t0 = time.monotonic()
    app = standin.app()
    what = f"{args.model!r}" + (f" (prompt tokens: {args.tokenizer})" if args.tokenizer else "")
    # shutdown_timeout: after the drain nothing is in flight but what a force exit (UnHealthy) leaves hanging
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    site = web.SockSite(runner, sock, backlog=4096)
    await site.start()
    port = sock.getsockname()[1]
    if args.not_ready_while:
        standin.hold_file = args.not_ready_while.replace("{port}", str(port))
    if args.hang_while:
        standin.hang_file = args.hang_while.replace("{port}", str(port))
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"standin: serving {what} on http://{args.host}:{port}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    draining: List[asyncio.Task] = []  # the one drain a first SIGTERM starts (kept referenced)

    async def drain_then_stop() -> None:
        await standin.drain()
        stop.set()

    # SIGTERM drains (health 503 meanwhile), as SGLang's sigterm handler and watchdog; SIGINT stops at once
    loop.add_signal_handler(signal.SIGTERM, lambda: draining or draining.append(loop.create_task(drain_then_stop())))
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Optional[List[str]] = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
