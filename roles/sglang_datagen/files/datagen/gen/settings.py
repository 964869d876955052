"""Config -> :class:`GenerateSettings` for the generate stage (private).

Reads the top-level ``servers``, ``model`` and ``sampling`` keys and the
``generate`` section. Every bad value raises ``datagen.config.ConfigError``
whose message names the key and says what would be accepted.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from ..config import ConfigError

DEFAULT_MAX_TOKENS = 2048  # sampling.max_tokens when the config sets none

# Sampling keys SGLang's OpenAI-compatible endpoint accepts, with the JSON type each must have.
_NUM = (int, float)
SAMPLING_KEYS: Dict[str, Tuple[type, ...]] = {
    "max_tokens": (int,),
    "temperature": _NUM,
    "top_p": _NUM,
    "top_k": (int,),
    "min_p": _NUM,
    "presence_penalty": _NUM,
    "frequency_penalty": _NUM,
    "repetition_penalty": _NUM,
    "seed": (int,),
    "stop": (str, list),
    "n": (int,),
    "ignore_eos": (bool,),
    "skip_special_tokens": (bool,),
    "no_stop_trim": (bool,),
}

# generate.fewer_workers: what new requests do while fewer of generate.workers serve than are listed there
FEWER_WORKERS = ("continue", "wait")

# generate.thinking_switch: how the model's chat template is told whether to think. A kwarg name, or one of
# these two for templates without a switch. The default is Qwen3's (and GLM-4.5's) kwarg; DeepSeek-V3.x
# templates read ``thinking`` and ignore ``enable_thinking`` (SGLang's own toggle_param per template:
# REASONING_MODE_RULES in sglang/srt/parser/template_detection.py).
DEFAULT_THINKING_SWITCH = "enable_thinking"
NO_THINKING = "none"  # the template cannot think (Qwen2.5, Llama 3, Mistral)
ALWAYS_THINKS = "always"  # the template always thinks (DeepSeek-R1)
_SWITCH_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a kwarg reaches the template as a Jinja variable


def chat_template_kwargs(extra: Mapping[str, Any], thinking: bool, switch: str) -> Dict[str, Any]:
    """The ``chat_template_kwargs`` a request carries: ``extra`` plus ``{switch: thinking}``.

    Explicit whenever the template has a switch, never the template's default (Qwen3 thinks unless told
    not to); a template without one (``none``/``always``) gets nothing for it. Generate sends these and
    tokenize renders with them, so both take them from here.
    """
    kwargs = dict(extra)
    if switch not in (NO_THINKING, ALWAYS_THINKS):
        kwargs[switch] = thinking
    return kwargs


def thinking_problem(thinking: bool, switch: str) -> Optional[str]:
    """Why the template cannot do what ``generate.thinking`` asks (None: it can)."""
    if thinking and switch == NO_THINKING:
        return ("is true, but generate.thinking_switch is none (the model's chat template has no thinking switch, "
                "so it would not think); set generate.thinking_switch to the template's kwarg (enable_thinking for "
                "Qwen3, thinking for DeepSeek-V3.1) or generate.thinking: false")
    if not thinking and switch == ALWAYS_THINKS:
        return ("is false, but generate.thinking_switch is always (the model's chat template always thinks, "
                "so every answer would carry its thinking); set generate.thinking: true")
    return None


@dataclass(frozen=True)
class GenerateSettings:
    """Everything the generate stage needs, validated. Times are seconds."""

    servers: Tuple[str, ...]
    model: Optional[str]  # None: take the first model the servers list under /v1/models
    sampling: Dict[str, Any] = field(default_factory=lambda: {"max_tokens": DEFAULT_MAX_TOKENS})
    thinking: bool = False
    thinking_switch: str = DEFAULT_THINKING_SWITCH
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    extra_body: Dict[str, Any] = field(default_factory=dict)
    tool_choice: str = "auto"
    # in-flight requests per server; None ("auto"): driven by what the workers report (gen/concurrency.py)
    concurrency: Optional[int] = None
    concurrency_min: int = 8  # auto: per worker the server reports
    concurrency_max: int = 1024  # auto: per worker the server reports
    queue_target: int = 8  # auto: requests waiting in each worker's queue
    load_interval: float = 1.0  # auto: seconds between two readings of the workers' load
    retries: int = 8  # further attempts after the first
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    request_timeout: float = 900.0
    connect_timeout: float = 10.0
    fsync_interval: float = 1.0
    progress_interval: float = 1.0
    ready_timeout: float = 1800.0  # a large model loads for minutes; still bounded
    ready_interval: float = 2.0
    shutdown_grace: float = 15.0
    api_key_env: Optional[str] = None
    limit: Optional[int] = None  # generate at most this many new rows in one run
    # rows failing in a row (after their retries) before the run stops: a dead fleet must not
    # turn every prompt into an error line
    max_consecutive_failures: int = 200
    # the workers behind the router (``servers`` is then the router alone): every ``workers_interval`` the run
    # checks that the router routes to each of them and registers a ready one again (gen/fleet.py)
    workers: Tuple[str, ...] = ()
    workers_interval: float = 15.0
    fewer_workers: str = "continue"  # or "wait": hold new requests back until every worker serves again
    fewer_workers_max_wait: float = 1800.0  # wait: then the run fails, naming the workers

    @property
    def adaptive(self) -> bool:
        return self.concurrency is None

    @property
    def max_in_flight(self) -> int:
        """The most requests the run keeps in flight: a fixed ``concurrency`` per server, or auto's
        ``concurrency_max`` per worker, each worker behind a router counted."""
        per_server = self.concurrency_max * max(len(self.workers), 1) if self.adaptive else self.concurrency
        return per_server * len(self.servers)

    def template_kwargs(self) -> Dict[str, Any]:
        """``chat_template_kwargs`` as sent (:func:`chat_template_kwargs`)."""
        return chat_template_kwargs(self.chat_template_kwargs, self.thinking, self.thinking_switch)

    def api_key(self) -> Optional[str]:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


def _fail(key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{key}: {problem}; {fix}")


# The generate section's keys are GenerateSettings' own fields (servers, model and sampling are top-level keys),
# and each default is the field's: written once, in the dataclass above.
GENERATE_KEYS = {f.name for f in fields(GenerateSettings)} - {"servers", "model", "sampling"}
DEFAULTS: Dict[str, Any] = {f.name: f.default for f in fields(GenerateSettings) if f.default is not MISSING}
# the numeric settings and the least value each accepts
NUMBERS: Dict[str, float] = {
    "load_interval": 0.05, "backoff_base": 0.0, "backoff_max": 0.0, "request_timeout": 0.1, "connect_timeout": 0.1,
    "fsync_interval": 0.01, "progress_interval": 0.01, "ready_timeout": 0.0, "ready_interval": 0.01,
    "shutdown_grace": 0.0, "workers_interval": 0.05, "fewer_workers_max_wait": 0.0,
}
INTEGERS: Dict[str, int] = {
    "concurrency_min": 1, "concurrency_max": 1, "queue_target": 1, "retries": 0, "limit": 0,
    "max_consecutive_failures": 1,
}


def _number(section: Mapping[str, Any], name: str, minimum: float) -> float:
    value = section.get(name, DEFAULTS[name])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(f"generate.{name}", f"expected a number, got {value!r}", f"set a number >= {minimum}")
    if value < minimum:
        raise _fail(f"generate.{name}", f"{value!r} is below {minimum}", f"set a number >= {minimum}")
    return float(value)


def _integer(section: Mapping[str, Any], name: str, minimum: int) -> Optional[int]:
    value = section.get(name, DEFAULTS[name])
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"generate.{name}", f"expected an integer, got {value!r}", f"set an integer >= {minimum}")
    if value < minimum:
        raise _fail(f"generate.{name}", f"{value!r} is below {minimum}", f"set an integer >= {minimum}")
    return value


def _concurrency(section: Mapping[str, Any]) -> Optional[int]:
    """``auto`` (the default): None, the engine follows the workers' load; an integer >= 1: fixed, per server."""
    value = section.get("concurrency", "auto")
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail("generate.concurrency", f"expected auto or an integer >= 1, got {value!r}",
                    "write auto (follow the workers' queues) or a fixed number of requests in flight per server")
    return value


def parse_servers(raw: Any, key: str = "servers") -> Tuple[str, ...]:
    """Base URLs (``http://host:port``), trailing slashes and a trailing ``/v1`` removed."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise _fail(key, f"expected a non-empty list of base URLs, got {raw!r}",
                    "list the router or each worker, e.g. [http://127.0.0.1:30000]")
    out: List[str] = []
    for i, url in enumerate(raw):
        if not isinstance(url, str):
            raise _fail(f"{key}[{i}]", f"expected a URL string, got {url!r}", "write e.g. http://127.0.0.1:30000")
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _fail(f"{key}[{i}]", f"{url!r} is not an http(s) base URL", "write e.g. http://127.0.0.1:30000")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise _fail(f"{key}[{i}]", f"{url!r} has a bad port ({exc})", "write e.g. http://127.0.0.1:30000") from exc
        base = url.strip().rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        if base in out:
            raise _fail(f"{key}[{i}]", f"{url!r} is listed twice", "list each server once")
        out.append(base)
    return tuple(out)


def parse_model(raw: Any) -> Optional[str]:
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        # the core config may describe the model as a mapping; the served name is what the API wants
        for key in ("served_name", "served_model_name", "name"):
            if key in raw:
                raw = raw[key]
                break
        else:
            raise _fail("model", "a mapping needs a `name` (the served model name)", "add model.name")
    if not isinstance(raw, str) or not raw.strip():
        raise _fail("model", f"expected the served model name, got {raw!r}", "set model.name to what /v1/models lists")
    return raw.strip()


def parse_sampling(raw: Any) -> Dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise _fail("sampling", f"expected a mapping, got {raw!r}", "write e.g. {temperature: 0.7, max_tokens: 2048}")
    out: Dict[str, Any] = {}
    for key, value in raw.items():
        # max_length belongs to tokenize; the rest of the section must be something the server understands
        if key == "max_length":
            continue
        types = SAMPLING_KEYS.get(key)
        if types is None:
            raise _fail(f"sampling.{key}", "unknown sampling parameter",
                        "use one of " + ", ".join(sorted(SAMPLING_KEYS)))
        if isinstance(value, bool) and bool not in types:
            raise _fail(f"sampling.{key}", f"expected {'/'.join(t.__name__ for t in types)}, got {value!r}", "fix the value")
        if not isinstance(value, types):
            raise _fail(f"sampling.{key}", f"expected {'/'.join(t.__name__ for t in types)}, got {value!r}", "fix the value")
        out[key] = value
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    if out["max_tokens"] < 1:
        raise _fail("sampling.max_tokens", f"{out['max_tokens']!r} is below 1", "set a positive token budget")
    if out.get("n", 1) != 1:
        raise _fail("sampling.n", "one completion per prompt is what the output format holds", "remove n or set 1")
    if "temperature" in out and out["temperature"] < 0:
        raise _fail("sampling.temperature", f"{out['temperature']!r} is negative", "set 0 or more")
    if "top_p" in out and not 0 < out["top_p"] <= 1:
        raise _fail("sampling.top_p", f"{out['top_p']!r} is outside (0, 1]", "set a value in (0, 1]")
    return out


def _mapping(section: Mapping[str, Any], name: str) -> Dict[str, Any]:
    value = section.get(name) or {}
    if not isinstance(value, Mapping):
        raise _fail(f"generate.{name}", f"expected a mapping, got {value!r}", "write a YAML mapping")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise _fail(f"generate.{name}", f"not JSON-serialisable ({exc})", "use plain strings, numbers, lists, mappings") from exc
    return dict(value)


def _router_workers(section: Mapping[str, Any], servers: Tuple[str, ...]) -> Tuple[str, ...]:
    """``generate.workers``: the workers behind the one router in ``servers``; () when not set."""
    if not section.get("workers"):
        return ()
    workers = parse_servers(section["workers"], "generate.workers")
    if len(servers) != 1 or servers[0] in workers:
        raise _fail("generate.workers", f"lists the workers behind one router, but servers is {list(servers)}",
                    "set servers to the router alone, or remove generate.workers when servers lists the workers")
    return workers


def _fewer_workers(section: Mapping[str, Any]) -> str:
    value = section.get("fewer_workers", DEFAULTS["fewer_workers"])
    if value not in FEWER_WORKERS:
        raise _fail("generate.fewer_workers", f"{value!r} is not continue or wait",
                    "write continue (go on with the workers that serve) or wait (send no new request until every "
                    "worker serves again, at most generate.fewer_workers_max_wait seconds)")
    return str(value)


class _Problems:
    """Every problem of a config, one line each: each setting is judged on its own, so one bad value does not
    hide the next."""

    def __init__(self) -> None:
        self.lines: List[str] = []

    def add(self, key: str, problem: str, fix: str) -> None:
        self.lines.extend(_fail(key, problem, fix).errors)

    def judge(self, parse: Callable[[], Any], default: Any) -> Any:
        """PARSE's value, or DEFAULT (standing in, so that later checks can run) with its problem kept."""
        try:
            return parse()
        except ConfigError as exc:
            self.lines.extend(line for line in exc.errors if line not in self.lines)
            return default


def settings_from_config(raw: Mapping[str, Any]) -> GenerateSettings:
    """Validate the parts of the datagen config that generate reads; ConfigError lists every problem."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(raw).__name__}")
    section = raw.get("generate") or {}
    if not isinstance(section, Mapping):
        raise _fail("generate", f"expected a mapping, got {section!r}", "write a YAML mapping")
    problems = _Problems()
    if "servers" not in raw:
        problems.add("servers", "missing", "list the SGLang router or workers, e.g. [http://127.0.0.1:30000]")
    for key in sorted(set(section) - GENERATE_KEYS):
        problems.add(f"generate.{key}", "unknown key", "use one of " + ", ".join(sorted(GENERATE_KEYS)))
    values: Dict[str, Any] = {name: problems.judge(partial(_number, section, name, least), DEFAULTS[name])
                              for name, least in NUMBERS.items()}
    values.update((name, problems.judge(partial(_integer, section, name, least), DEFAULTS[name]))
                  for name, least in INTEGERS.items())
    for low, high in (("concurrency_min", "concurrency_max"), ("backoff_base", "backoff_max")):
        if values[high] < values[low]:
            problems.add(f"generate.{high}", f"{values[high]} is below {low} {values[low]}", f"raise {high} or lower {low}")
    servers = problems.judge(partial(parse_servers, raw.get("servers")), ()) if "servers" in raw else ()
    judged: Dict[str, Any] = dict(
        model=problems.judge(partial(parse_model, raw.get("model")), None),
        sampling=problems.judge(partial(parse_sampling, raw.get("sampling")), {}),
        **problems.judge(partial(_thinking, section), {}),
        extra_body=problems.judge(partial(_extra_body, section), {}),
        tool_choice=problems.judge(partial(_tool_choice, section), DEFAULTS["tool_choice"]),
        concurrency=problems.judge(partial(_concurrency, section), None),
        api_key_env=problems.judge(partial(_api_key_env, section), None),
        workers=problems.judge(partial(_router_workers, section, servers), ()) if servers else (),
        fewer_workers=problems.judge(partial(_fewer_workers, section), DEFAULTS["fewer_workers"]),
    )
    if problems.lines:
        raise ConfigError(problems.lines)
    return GenerateSettings(servers=servers, **judged, **values)


def _thinking(section: Mapping[str, Any]) -> Dict[str, Any]:
    """generate.thinking, thinking_switch and chat_template_kwargs, which must agree with each other."""
    thinking = section.get("thinking", DEFAULTS["thinking"])
    if not isinstance(thinking, bool):
        raise _fail("generate.thinking", f"expected true or false, got {thinking!r}",
                    "say whether the chat template should think (sent as generate.thinking_switch)")
    switch = section.get("thinking_switch", DEFAULTS["thinking_switch"])
    if not isinstance(switch, str) or not _SWITCH_NAME.match(switch):
        raise _fail("generate.thinking_switch", f"expected the chat template's thinking kwarg, got {switch!r}",
                    f"write e.g. enable_thinking (Qwen3) or thinking (DeepSeek-V3.1), {NO_THINKING} for a template "
                    f"without a switch, {ALWAYS_THINKS} for one that always thinks")
    problem = thinking_problem(thinking, switch)
    if problem:
        raise ConfigError(f"generate.thinking: {problem}")
    kwargs = _mapping(section, "chat_template_kwargs")
    # a switch set here would fight generate.thinking (or, for the other family's name, be silently ignored)
    switches = sorted(set(kwargs) & ({DEFAULT_THINKING_SWITCH, "thinking", switch} - {NO_THINKING, ALWAYS_THINKS}))
    if switches:
        raise _fail(f"generate.chat_template_kwargs.{switches[0]}", "a thinking switch is set through generate.thinking",
                    f"move it to generate.thinking (sent as {switch}, generate.thinking_switch)")
    return {"thinking": thinking, "thinking_switch": switch, "chat_template_kwargs": kwargs}


def _extra_body(section: Mapping[str, Any]) -> Dict[str, Any]:
    extra_body = _mapping(section, "extra_body")
    clash = sorted(set(extra_body) & ({"model", "messages", "tools", "chat_template_kwargs", "stream"} | set(SAMPLING_KEYS)))
    if clash:
        raise _fail(f"generate.extra_body.{clash[0]}", "is set elsewhere", "use sampling / generate.thinking / model")
    return extra_body


def _tool_choice(section: Mapping[str, Any]) -> str:
    tool_choice = section.get("tool_choice", DEFAULTS["tool_choice"])
    if tool_choice not in ("auto", "required", "none"):
        raise _fail("generate.tool_choice", f"{tool_choice!r} is not auto, required or none", "pick one of those")
    return str(tool_choice)


def _api_key_env(section: Mapping[str, Any]) -> Optional[str]:
    api_key_env = section.get("api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
        raise _fail("generate.api_key_env", f"expected an environment variable name, got {api_key_env!r}",
                    "name the variable holding the key (the key itself never goes in the config)")
    return api_key_env
