"""One row of a generate run (private to ``gen.client``): checked, turned into a request body, and its answer
into an output line.

Request bodies and output lines are assembled from pre-encoded JSON fragments: the constant part (model,
sampling, chat template kwargs) is encoded once per run (:class:`RowCodec`), and each row's ``messages`` is
encoded once and reused for both the request and the output line.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ..sglang_chat import TOKEN_ID_FLAGS, canonical_request, token_ids_from_response
from .settings import GenerateSettings

# Keys the output row owns; an input row's own copy would make duplicate JSON keys.
OUTPUT_KEYS = frozenset({"id", "messages", "tools", "finish_reason", "usage", "sampling", "server", "model",
                         "prompt_token_ids", "response_token_ids"})

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


class RowError(Exception):
    """One row failed. ``retry`` tells whether another attempt could succeed."""

    def __init__(self, message: str, retry: bool, status: Optional[int] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.retry = retry
        self.status = status
        self.retry_after = retry_after


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


class Job:
    """One row on its way: the row, its request body, and its messages (and tools) encoded once for both."""

    __slots__ = ("row", "row_id", "body", "messages_json", "tools_json")

    def __init__(self, row: Dict[str, Any], body: bytes, messages_json: str, tools_json: Optional[str]) -> None:
        self.row = row
        self.row_id: str = row["id"]
        self.body = body
        self.messages_json = messages_json
        self.tools_json = tools_json


class RowCodec:
    """Request bodies and output lines for one run's model and settings."""

    def __init__(self, settings: GenerateSettings, model: Optional[str]) -> None:
        const: Dict[str, Any] = {"model": model, "stream": False}
        const.update(settings.sampling)
        const.update(settings.extra_body)
        const.update(TOKEN_ID_FLAGS)  # the training row is the ids the server consumed and produced
        const["chat_template_kwargs"] = settings.template_kwargs()
        self._prefix = _dumps(const)[:-1]
        self._tool_choice = ',"tool_choice":' + _dumps(settings.tool_choice)
        self._tail = ',"sampling":' + _dumps(settings.sampling) + ',"model":' + _dumps(model)

    def job(self, row: Dict[str, Any]) -> Job:
        # what the worker will see, by either route: the output row keeps exactly that, for tokenize to render
        messages, tools = canonical_request(prompt_messages(row["messages"]), row.get("tools"))
        messages_json = _dumps(messages)
        tools_json = _dumps(tools) if tools else None
        parts = [self._prefix, ',"messages":', messages_json]
        if tools_json is not None:
            parts += [',"tools":', tools_json, self._tool_choice]
        parts.append("}")
        return Job(row, "".join(parts).encode("utf-8", "surrogatepass"), messages_json, tools_json)

    def output_line(self, job: Job, assistant: Dict[str, Any], finish: Optional[str],
                    usage: Dict[str, Any], server: str, ids: Tuple[List[int], List[int]]) -> str:
        head: Dict[str, Any] = {"id": job.row_id}  # id first: resume finds it without a full parse
        for key, value in job.row.items():
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
