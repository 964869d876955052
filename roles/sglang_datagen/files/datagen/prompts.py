"""What every dataset adapter shares: the :class:`Adapter` record, turn parsing, the cut to a prompt, tool lists.

An adapter turns one raw record into a prompt ``(messages, tools, category)`` in OpenAI chat form, or raises
:class:`Unusable` with a short reason that the manifest counts. The prompt is the conversation up to (not
including) its last assistant turn: the target model writes that turn, so the drafter learns the target's
distribution. Earlier assistant turns stay as context.

The adapters themselves live one per module in :mod:`datagen.adapters`; this module imports none of them, so
they (and :mod:`datagen.existing`, which parses the existing set's turns) import it without a cycle.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

Messages = List[Dict[str, Any]]
Prompt = Tuple[Messages, Optional[List[Dict[str, Any]]], str]
AdaptFn = Callable[[Dict[str, Any], Any], Prompt]  # (raw record, the source's spec) -> prompt


class Unusable(Exception):
    """This record cannot become a prompt; ``reason`` is the manifest counter it goes to."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Adapter:
    name: str  # the module's name in datagen/adapters/, and what a source's ``adapter`` says
    fn: AdaptFn
    default_category: Optional[str]  # None: decided per row (or by the config's category)
    hub_repo: str = ""
    needs_category: bool = False  # generic adapters: the config must say what the rows are
    row_categories: Tuple[str, ...] = ()  # what a per-row decision can give (without a config category)


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


def turns_from_sharegpt(conv: Any) -> Messages:
    """ShareGPT turns ``[{from, value}]`` (``role``/``content`` accepted too) as checked OpenAI messages."""
    return [_turn(turn, ("from", "role"), ("value", "content"), tools=False) for turn in _turn_list(conv)]


def turns_from_messages(msgs: Any) -> Messages:
    """OpenAI messages ``[{role, content}]`` checked, keeping tool calls and what links tool results to them."""
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


def text_field(raw: Dict[str, Any], name: str) -> str:
    """RAW's string field NAME, non-blank; Unusable ``missing_<name>``/``malformed_<name>``/``empty_prompt``."""
    value = raw.get(name)
    if value is None:
        raise Unusable(f"missing_{name}")
    if not isinstance(value, str):
        raise Unusable(f"malformed_{name}")
    if not value.strip():
        raise Unusable("empty_prompt")
    return value


def single_field(name: str, field: str, category: str, hub_repo: str) -> Adapter:
    """The adapter of a dataset whose prompt is one text field, asked as a single user turn."""

    def adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
        return [{"role": "user", "content": text_field(raw, field)}], None, category

    return Adapter(name, adapt, category, hub_repo)


def loose_load(text: str) -> Any:
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
    """A tool list (JSON text, one tool, or a list; bare functions wrapped) in OpenAI ``tools`` form."""
    if isinstance(tools, str):
        tools = loose_load(tools) if tools.strip() else []
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
