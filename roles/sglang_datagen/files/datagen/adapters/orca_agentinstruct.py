"""microsoft/orca-agentinstruct-1M-v1.

Fields: ``messages`` = JSON string of [{role, content}] (the split name is the task family). Category ``agent``.
"""

from __future__ import annotations

from typing import Any, Dict

from datagen.prompts import Adapter, Prompt, Unusable, to_prompt, turns_from_messages


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    if "messages" not in raw:
        raise Unusable("missing_messages")
    return to_prompt(turns_from_messages(raw["messages"])), None, "agent"


ADAPTER = Adapter("orca_agentinstruct", _adapt, "agent", "microsoft/orca-agentinstruct-1M-v1")
