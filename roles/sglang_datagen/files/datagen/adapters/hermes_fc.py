"""NousResearch/hermes-function-calling-v1.

Fields: ``id``, ``conversations`` [{from: system|human|gpt|tool, value}], ``category``, ``subcategory``, ``task``,
and in some files a JSON-string ``tools``. Without ``tools`` the tool list is read from the ``<tools>...</tools>``
block of the system turn (JSON or Python-literal) and that boilerplate system turn is dropped, because the
target's own chat template renders ``tools``. ``<tool_call>`` blocks in gpt turns become OpenAI ``tool_calls``;
``<tool_response>`` wrappers are stripped from tool turns (the template adds its own). Category ``tool_use``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

from datagen.prompts import (
    Adapter,
    Messages,
    Prompt,
    Unusable,
    loose_load,
    normalise_tools,
    to_prompt,
    turns_from_sharegpt,
)

_TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_TOOL_RESPONSE = re.compile(r"^\s*<tool_response>(.*?)</tool_response>\s*$", re.S)


def _assistant(content: str) -> Dict[str, Any]:
    calls = []
    for block in _TOOL_CALL.findall(content):
        try:
            call = loose_load(block)
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


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    turns = turns_from_sharegpt(raw.get("conversations"))
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
            t = _assistant(t["content"])
            pending = [c["id"] for c in t.get("tool_calls", [])]
        elif t["role"] == "tool":
            m = _TOOL_RESPONSE.match(t["content"])
            t = {"role": "tool", "content": m.group(1).strip() if m else t["content"]}
            if pending:
                t["tool_call_id"] = pending.pop(0)
        out.append(t)
    return to_prompt(out), tools or None, "tool_use"


ADAPTER = Adapter("hermes_fc", _adapt, "tool_use", "NousResearch/hermes-function-calling-v1")
