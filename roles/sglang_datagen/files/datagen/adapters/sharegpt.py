"""Any dataset in ShareGPT form: ``conversations`` [{from, value}].

Generic: the rows say nothing of what they are, so the config must set ``category``.
"""

from __future__ import annotations

from typing import Any, Dict

from datagen.prompts import Adapter, Prompt, to_prompt, turns_from_sharegpt


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    return to_prompt(turns_from_sharegpt(raw.get("conversations"))), None, ""


ADAPTER = Adapter("sharegpt", _adapt, None, needs_category=True)
