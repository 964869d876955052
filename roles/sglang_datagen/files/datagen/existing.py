"""Read the existing training set: its category per row and, where it carries text, its prompts.

Accepted rows (JSONL or Parquet): ``messages`` [{role, content}] or ``conversations`` [{from, value}]
(or the field named by ``existing_dataset.messages_field``), and/or already tokenized
``input_ids`` + ``loss_mask``. The category comes from ``category_field`` mapped through
``category_map``; rows without one get ``default_category`` or, failing that, a keyword guess
(coding / math / general) on the text, so a dataset without labels can still be measured.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Iterator, Optional, Set, Tuple

from datagen.prompts import Unusable, turns_from_messages, turns_from_sharegpt
from datagen.sources import iter_file
from datagen.util import DatagenError

_CODE = re.compile(
    r"```|\bdef \w+\(|\bclass \w+[:(]|#include|\bpublic static\b|\bfunction \w+\(|\bimport \w+|"
    r"\bSELECT\b.+\bFROM\b|=>|\bconsole\.log\b|\bfn \w+\(|</\w+>",
    re.S,
)
_MATH = re.compile(r"\\frac|\\sqrt|\$[^$]+\$|\\boxed|\b(solve|equation|integral|derivative|probability)\b", re.I)


GUESSED_CATEGORIES = ("coding", "math", "general")  # what guess_category gives


def guess_category(text: str) -> str:
    """Cheap keyword guess used only when the existing set has no category field."""
    if _CODE.search(text):
        return "coding"
    if _MATH.search(text):
        return "math"
    return "general"


def row_messages(row: Dict[str, Any], field: Optional[str]) -> Optional[list]:
    names = [field] if field else ["messages", "conversations"]
    for name in names:
        if name in row and row[name] is not None:
            value = row[name]
            try:
                if name == "conversations" or (isinstance(value, list) and value and isinstance(value[0], dict)
                                               and "from" in value[0]):
                    return turns_from_sharegpt(value)
                return turns_from_messages(value)
            except Unusable:
                return None
    return None


def iter_existing(spec: Any) -> Iterator[Tuple[Dict[str, Any], str, Optional[list]]]:
    """(row, category, messages or None) for every row of the existing dataset."""
    for path in spec.files:
        try:
            for row in iter_file(path):
                if not isinstance(row, dict):
                    continue
                msgs = row_messages(row, spec.messages_field)
                yield row, _category(row, spec, msgs), msgs
        except DatagenError as exc:
            raise DatagenError(f"existing_dataset.path: {exc}") from None
        except OSError as exc:
            raise DatagenError(f"existing_dataset.path: cannot read {path}: {exc.strerror}") from None


def labelled_category(value: Any, spec: Any) -> Optional[str]:
    """The category a row's ``category_field`` VALUE names (through ``category_map``); None when it names none."""
    if isinstance(value, str) and value:
        return spec.category_map.get(value, value)
    return None


def _category(row: Dict[str, Any], spec: Any, msgs: Optional[list]) -> str:
    labelled = labelled_category(row.get(spec.category_field) if spec.category_field else None, spec)
    if labelled is not None:
        return labelled
    if spec.default_category:
        return spec.default_category
    if msgs:
        return guess_category("\n".join(m["content"] for m in msgs[:4]))
    return "general"


def categories_from_labels(spec: Any, values: Iterable[Any], unlabelled: bool) -> Set[str]:
    """The categories an existing set has, from the distinct VALUES of its ``category_field`` (read elsewhere, e.g.
    on the node) and whether some rows have none (UNLABELLED): those get ``default_category`` or a guess."""
    found = {category for category in (labelled_category(value, spec) for value in values) if category is not None}
    if unlabelled:
        found |= {spec.default_category} if spec.default_category else set(GUESSED_CATEGORIES)
    return found


def measure(spec: Any) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for _row, cat, _msgs in iter_existing(spec):
        counts[cat] = counts.get(cat, 0) + 1
    return counts
