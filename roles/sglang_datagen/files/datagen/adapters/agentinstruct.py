"""THUDM/AgentInstruct.

Fields: ``id``, ``conversations`` [{from: human|gpt, loss, value}] (environment observations are human turns).
Category ``agent``.
"""

from __future__ import annotations

from typing import Any, Dict

from datagen.prompts import Adapter, Prompt, to_prompt, turns_from_sharegpt


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    return to_prompt(turns_from_sharegpt(raw.get("conversations"))), None, "agent"


ADAPTER = Adapter("agentinstruct", _adapt, "agent", "THUDM/AgentInstruct")
