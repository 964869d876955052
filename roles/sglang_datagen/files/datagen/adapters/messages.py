"""Any dataset in OpenAI chat form: ``messages`` [{role, content}], with an optional ``tools`` list.

Generic: the rows say nothing of what they are, so the config must set ``category``. Tool calls and what ties a
tool result to its call (``tool_call_id``, ``name``) are kept.
"""

from __future__ import annotations

from typing import Any, Dict

from datagen.prompts import Adapter, Prompt, normalise_tools, to_prompt, turns_from_messages


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    tools = normalise_tools(raw["tools"]) if raw.get("tools") else None
    return to_prompt(turns_from_messages(raw.get("messages"))), tools, ""


ADAPTER = Adapter("messages", _adapt, None, needs_category=True)
