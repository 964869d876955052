"""BAAI/Infinity-Instruct config ``0625``.

Fields: ``id``, ``conversations`` [{from: human|gpt|system, value}], ``label`` {ability_en, ability_zh,
cate_ability_en, cate_ability_zh}, ``langdetect`` ("en", "zh-cn", ...), ``source``. Language filter on
``langdetect``; category from ``label.cate_ability_en``/``ability_en`` (coding, math, general).
"""

from __future__ import annotations

from typing import Any, Dict

from datagen.prompts import Adapter, Prompt, Unusable, to_prompt, turns_from_messages, turns_from_sharegpt

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


def _adapt(raw: Dict[str, Any], spec: Any) -> Prompt:
    lang = raw.get("langdetect")
    if not isinstance(lang, str) or not lang:
        raise Unusable("language_unknown")
    lang = lang.lower()
    if not any(lang == want or lang.startswith(want + "-") for want in spec.languages):
        raise Unusable("language_filtered")
    if "conversations" in raw:
        turns = turns_from_sharegpt(raw["conversations"])
    else:
        turns = turns_from_messages(raw.get("messages"))
    return to_prompt(turns), None, infinity_category(raw.get("label"))


ADAPTER = Adapter("infinity_instruct", _adapt, None, "BAAI/Infinity-Instruct (config 0625)",
                  row_categories=INFINITY_CATEGORIES)
