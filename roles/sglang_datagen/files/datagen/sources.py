"""Source readers and one adapter per dataset, each reading the dataset's real Hugging Face schema.

An adapter turns one raw record into a prompt ``(messages, tools, category)`` in OpenAI chat
form, or raises :class:`Unusable` with a short reason that the manifest counts. The prompt is
the conversation up to (not including) its last assistant turn: the target model writes that
turn, so the drafter learns the target's distribution. Earlier assistant turns stay as context.

Schemas (field names exactly as on the Hub):

- ``infinity_instruct``  BAAI/Infinity-Instruct config ``0625``: ``id``, ``conversations``
  [{from: human|gpt|system, value}], ``label`` {ability_en, ability_zh, cate_ability_en,
  cate_ability_zh}, ``langdetect`` ("en", "zh-cn", ...), ``source``. Language filter on
  ``langdetect``; category from ``label.cate_ability_en``/``ability_en`` (coding, math, general).
- ``webinstruct``  TIGER-Lab/WebInstructSub: ``question``, ``answer`` (+ orig_question, orig_answer,
  source, index). Category ``science``.
- ``codefeedback``  m-a-p/CodeFeedback-Filtered-Instruction: ``query``, ``answer``, ``resource``, ``lang``.
  Category ``coding``.
- ``metamath``  meta-math/MetaMathQA: ``query``, ``response``, ``type``, ``original_question``. Category ``math``.
- ``hermes_fc``  NousResearch/hermes-function-calling-v1: ``id``, ``conversations``
  [{from: system|human|gpt|tool, value}], ``category``, ``subcategory``, ``task``, and in some files a
  JSON-string ``tools``. Without ``tools`` the tool list is read from the ``<tools>...</tools>`` block of
  the system turn (JSON or Python-literal) and that boilerplate system turn is dropped, because the
  target's own chat template renders ``tools``. ``<tool_call>`` blocks in gpt turns become OpenAI
  ``tool_calls``; ``<tool_response>`` wrappers are stripped from tool turns (the template adds its own).
  Category ``tool_use``.
- ``orca_agentinstruct``  microsoft/orca-agentinstruct-1M-v1: ``messages`` = JSON string of
  [{role, content}] (the split name is the task family). Category ``agent``.
- ``agentinstruct``  THUDM/AgentInstruct: ``id``, ``conversations`` [{from: human|gpt, loss, value}]
  (environment observations are human turns). Category ``agent``.
- ``sharegpt`` / ``messages``  generic ``conversations`` [{from, value}] or ``messages`` [{role, content}];
  set ``category`` in the config.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from datagen.util import DatagenError

Messages = List[Dict[str, Any]]
Prompt = Tuple[Messages, Optional[List[Dict[str, Any]]], str]


class Unusable(Exception):
    """This record cannot become a prompt; ``reason`` is the manifest counter it goes to."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


ROLE_MAP = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system", "tool": "tool",
    "function_response": "tool", "observation": "tool", "ipython": "tool",
}


def _turn_list(value: Any) -> List[Any]:
    """A conversation's turns, given as a list or as its JSON text (some exports store it as a string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise Unusable("malformed_json") from None
    if not isinstance(value, list) or not value:
        raise Unusable("missing_conversation")
    return value


def _first(turn: Dict[str, Any], keys: Tuple[str, ...], default: Any) -> Any:
    """The value of the first of KEYS that TURN has (``from`` before ``role``: a present key wins, even if null)."""
    return next((turn[key] for key in keys if key in turn), default)


def _turn(turn: Any, role_keys: Tuple[str, ...], content_keys: Tuple[str, ...], tools: bool) -> Dict[str, Any]:
    """One checked turn, Unusable naming what is wrong. TOOLS (OpenAI messages): a tool call may have no content,
    and what ties a tool result to its call is kept."""
    if not isinstance(turn, dict):
        raise Unusable("malformed_turn")
    role = ROLE_MAP.get(str(_first(turn, role_keys, "")).lower())
    content = _first(turn, content_keys, None)
    if role is None:
        raise Unusable("unknown_role")
    if tools and content is None and turn.get("tool_calls"):
        content = ""
    if not isinstance(content, str):
        raise Unusable("malformed_turn")
    msg: Dict[str, Any] = {"role": role, "content": content}
    for extra in ("tool_calls", "tool_call_id", "name") if tools else ():
        if turn.get(extra):
            msg[extra] = turn[extra]
    return msg


def _turns_from_sharegpt(conv: Any) -> Messages:
    return [_turn(turn, ("from", "role"), ("value", "content"), tools=False) for turn in _turn_list(conv)]


def _turns_from_messages(msgs: Any) -> Messages:
    return [_turn(turn, ("role",), ("content",), tools=True) for turn in _turn_list(msgs)]


def to_prompt(turns: Messages) -> Messages:
    """Cut a conversation to its prompt: drop trailing assistant turns and blank system turns; check shape."""
    turns = [t for t in turns if not (t["role"] == "system" and not t["content"].strip())]
    end = len(turns)
    while end and turns[end - 1]["role"] == "assistant":
        end -= 1
    prompt = turns[:end]
    if not prompt:
        raise Unusable("no_user_turn")
    if not any(t["role"] == "user" for t in prompt):
        raise Unusable("no_user_turn")
    if prompt[-1]["role"] not in ("user", "tool"):
        raise Unusable("no_user_turn")
    if not prompt[-1]["content"].strip():
        raise Unusable("empty_prompt")
    return prompt


def _text_field(raw: Dict[str, Any], name: str) -> str:
    value = raw.get(name)
    if value is None:
        raise Unusable(f"missing_{name}")
    if not isinstance(value, str):
        raise Unusable(f"malformed_{name}")
    if not value.strip():
        raise Unusable("empty_prompt")
    return value


# ---------------------------------------------------------------- adapters

_CODE_WORDS = ("programming", "software development", "coding", "code generation", "code ")
_MATH_WORDS = ("mathemat", "arithmetic", "calculation", "algebra", "geometry")


INFINITY_CATEGORIES = ("coding", "math", "general")  # what infinity_category gives


def infinity_category(label: Any) -> str:
    """coding / math / general from Infinity-Instruct's ability labels (first match wins, code before math)."""
    if not isinstance(label, dict):
        return "general"
    terms = " ".join(
        str(v).lower() for key in ("cate_ability_en", "ability_en") for v in (label.get(key) or []) if v
    ) + " "
    if any(w in terms for w in _CODE_WORDS):
        return "coding"
    if any(w in terms for w in _MATH_WORDS):
        return "math"
    return "general"


def _infinity(raw: Dict[str, Any], spec: Any) -> Prompt:
    lang = raw.get("langdetect")
    if not isinstance(lang, str) or not lang:
        raise Unusable("language_unknown")
    lang = lang.lower()
    if not any(lang == want or lang.startswith(want + "-") for want in spec.languages):
        raise Unusable("language_filtered")
    if "conversations" in raw:
        turns = _turns_from_sharegpt(raw["conversations"])
    else:
        turns = _turns_from_messages(raw.get("messages"))
    return to_prompt(turns), None, infinity_category(raw.get("label"))


def _single(field_name: str, category: str) -> Callable[[Dict[str, Any], Any], Prompt]:
    def adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
        return [{"role": "user", "content": _text_field(raw, field_name)}], None, category

    return adapt


_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_TOOL_RESPONSE = re.compile(r"^\s*<tool_response>(.*?)</tool_response>\s*$", re.S)


def _loose_load(text: str) -> Any:
    """JSON, else a Python literal: hermes writes many tool lists and calls with single quotes."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise Unusable("malformed_tools") from None


def normalise_tools(tools: Any) -> List[Dict[str, Any]]:
    if isinstance(tools, str):
        tools = _loose_load(tools) if tools.strip() else []
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise Unusable("malformed_tools")
    out = []
    for t in tools:
        if not isinstance(t, dict):
            raise Unusable("malformed_tools")
        if "function" not in t:
            if "name" not in t:
                raise Unusable("malformed_tools")
            t = {"type": "function", "function": t}
        if not isinstance(t["function"], dict) or not t["function"].get("name"):
            raise Unusable("malformed_tools")
        out.append({"type": t.get("type", "function"), "function": t["function"]})
    return out


def _hermes_assistant(content: str) -> Dict[str, Any]:
    calls = []
    for block in _TOOL_CALL.findall(content):
        try:
            call = _loose_load(block)
        except Unusable:
            return {"role": "assistant", "content": content}
        if not isinstance(call, dict) or "name" not in call:
            return {"role": "assistant", "content": content}
        args = call.get("arguments", {})
        # OpenAI wire format: arguments is a JSON string (chat templates accept a string as is)
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append({"id": f"call_{len(calls)}", "type": "function",
                      "function": {"name": call["name"], "arguments": args}})
    if not calls:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": _TOOL_CALL.sub("", content).strip(), "tool_calls": calls}


def _hermes(raw: Dict[str, Any], spec: Any) -> Prompt:
    turns = _turns_from_sharegpt(raw.get("conversations"))
    tools: Optional[List[Dict[str, Any]]] = None
    if raw.get("tools") not in (None, "", []):
        tools = normalise_tools(raw["tools"])
    out: Messages = []
    pending: List[str] = []  # ids of tool calls not yet answered, so tool turns carry tool_call_id
    for t in turns:
        if t["role"] == "system":
            # the prose mentions "<tools> </tools> XML tags" before the real block: take the non-blank one
            blocks = [b for b in _TOOLS_BLOCK.findall(t["content"]) if b.strip()]
            if blocks:
                if tools is None:
                    tools = normalise_tools(blocks[0])
                continue  # boilerplate around the tool list: the target's template writes its own
        elif t["role"] == "assistant":
            t = _hermes_assistant(t["content"])
            pending = [c["id"] for c in t.get("tool_calls", [])]
        elif t["role"] == "tool":
            m = _TOOL_RESPONSE.match(t["content"])
            t = {"role": "tool", "content": m.group(1).strip() if m else t["content"]}
            if pending:
                t["tool_call_id"] = pending.pop(0)
        out.append(t)
    return to_prompt(out), tools or None, "tool_use"


def _orca_agent(raw: Dict[str, Any], spec: Any) -> Prompt:
    if "messages" not in raw:
        raise Unusable("missing_messages")
    return to_prompt(_turns_from_messages(raw["messages"])), None, "agent"


def _agentinstruct(raw: Dict[str, Any], spec: Any) -> Prompt:
    return to_prompt(_turns_from_sharegpt(raw.get("conversations"))), None, "agent"


def _generic_sharegpt(raw: Dict[str, Any], spec: Any) -> Prompt:
    return to_prompt(_turns_from_sharegpt(raw.get("conversations"))), None, ""


def _generic_messages(raw: Dict[str, Any], spec: Any) -> Prompt:
    tools = normalise_tools(raw["tools"]) if raw.get("tools") else None
    return to_prompt(_turns_from_messages(raw.get("messages"))), tools, ""


@dataclass(frozen=True)
class Adapter:
    name: str
    fn: Callable[[Dict[str, Any], Any], Prompt]
    default_category: Optional[str]  # None: decided per row (or by the config's category)
    hub_repo: str = ""
    needs_category: bool = False  # generic adapters: the config must say what the rows are
    row_categories: Tuple[str, ...] = ()  # what a per-row decision can give (without a config category)


ADAPTERS: Dict[str, Adapter] = {
    a.name: a
    for a in (
        Adapter("infinity_instruct", _infinity, None, "BAAI/Infinity-Instruct (config 0625)",
                row_categories=INFINITY_CATEGORIES),
        Adapter("webinstruct", _single("question", "science"), "science", "TIGER-Lab/WebInstructSub"),
        Adapter("codefeedback", _single("query", "coding"), "coding", "m-a-p/CodeFeedback-Filtered-Instruction"),
        Adapter("metamath", _single("query", "math"), "math", "meta-math/MetaMathQA"),
        Adapter("hermes_fc", _hermes, "tool_use", "NousResearch/hermes-function-calling-v1"),
        Adapter("orca_agentinstruct", _orca_agent, "agent", "microsoft/orca-agentinstruct-1M-v1"),
        Adapter("agentinstruct", _agentinstruct, "agent", "THUDM/AgentInstruct"),
        Adapter("sharegpt", _generic_sharegpt, None, needs_category=True),
        Adapter("messages", _generic_messages, None, needs_category=True),
    )
}


def adapt(spec: Any, raw: Any) -> Prompt:
    """Apply the source's adapter; the config's ``category`` overrides the adapter's."""
    if not isinstance(raw, dict):
        raise Unusable("malformed_record")
    messages, tools, category = ADAPTERS[spec.adapter].fn(raw, spec)
    category = spec.category or category
    if not category:
        raise Unusable("no_category")
    return messages, tools, category


# ---------------------------------------------------------------- readers

def iter_file(path: str) -> Iterator[Any]:
    """Records of one local file; a line or record that is not a JSON object yields None (counted)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DatagenError(f"cannot read Parquet file {path}: {exc}") from None
        for batch in pf.iter_batches(batch_size=2048):
            yield from batch.to_pylist()
        return
    if path.endswith(".json"):
        with open(path, "rb") as fh:
            head = fh.read(1)
            while head and head.isspace():
                head = fh.read(1)
        if head == b"[":  # a JSON array file, as hermes-function-calling-v1 and MetaMathQA ship
            with open(path, encoding="utf-8") as fh:
                yield from iter_json_array(fh, path)
            return
    from datagen.util import iter_jsonl

    for _line_no, obj in iter_jsonl(path, tolerate_torn_tail=False):
        yield obj


def iter_json_array(fh: Any, name: str, chunk: int = 1 << 20) -> Iterator[Any]:
    """Elements of a top-level JSON array, decoded one at a time (MetaMathQA's 395K-row file is one array:
    ``json.load`` would hold all of it in memory)."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    started = False

    def more() -> bool:
        nonlocal buf, pos, eof
        data = fh.read(chunk)
        if not data:
            eof = True
            return False
        buf, pos = buf[pos:] + data, 0
        return True

    while True:
        while pos < len(buf) and (buf[pos].isspace() or (started and buf[pos] == ",")):
            pos += 1
        if pos >= len(buf):
            if not more():
                raise DatagenError(f"not valid JSON: {name}: the array is not closed")
            continue
        if not started:
            if buf[pos] != "[":
                raise DatagenError(f"not valid JSON: {name}: expected an array")
            started, pos = True, pos + 1
            continue
        if buf[pos] == "]":
            return
        try:
            obj, end = decoder.raw_decode(buf, pos)
        except ValueError as exc:
            if not eof and more():
                continue
            raise DatagenError(f"not valid JSON: {name}: {exc}") from None
        if end == len(buf) and not eof and more():
            continue  # a value ending exactly at the buffer's end may be cut short: decode it again
        pos = end
        yield obj


def iter_hub(spec: Any, key: str) -> Iterator[Any]:
    hub = spec.hub or {}
    try:
        import datasets  # optional: only for Hub sources
    except ImportError:
        raise DatagenError(
            f"{key}.hub: reading from the Hub needs the `datasets` package "
            "(pip install -r requirements-datagen.txt), or download the files and set path instead"
        ) from None
    try:
        ds = datasets.load_dataset(
            hub["repo"], hub.get("config"), split=hub.get("split", "train"), revision=hub["revision"],
            data_files=hub.get("data_files"), streaming=True,
        )
    except Exception as exc:  # network, auth, missing revision: all end the run with the reason
        raise DatagenError(f"{key}.hub: cannot open {hub.get('repo')}@{hub.get('revision')}: {exc}") from None
    yield from ds


def iter_source(spec: Any, index: int) -> Iterator[Any]:
    """Raw records of one source, at most ``limit``; read errors name ``sources[i]``."""
    key = f"sources[{index}]"
    n = 0
    if spec.hub:
        records: Iterator[Any] = iter_hub(spec, key)
    else:
        records = (r for f in spec.files for r in _iter_file_named(f, key))
    for rec in records:
        if spec.limit is not None and n >= spec.limit:
            return
        n += 1
        yield rec


def _iter_file_named(path: str, key: str) -> Iterator[Any]:
    try:
        yield from iter_file(path)
    except DatagenError as exc:
        raise DatagenError(f"{key}.path: {exc}") from None
    except OSError as exc:
        raise DatagenError(f"{key}.path: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DatagenError(f"{key}.path: {path} is not UTF-8 text") from None
