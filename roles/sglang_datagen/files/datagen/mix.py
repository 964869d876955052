"""Whether ``target_mix`` asks for categories the run can supply: pure functions, no I/O.

A category in ``target_mix`` gets rows from the sources (each source's ``category``, its adapter's fixed
category, or the categories an adapter decides per row) or is already in the existing set. One that neither has
(a typo of a real category) would otherwise be planned for, get 0 rows, and leave the real category with no
target: the report would show it, after the training was stopped for the run. So it is an error, naming the
closest category that does exist.

A category the existing set has and ``target_mix`` lacks is a warning, not an error: its rows pass through the
merge untouched (``datagen.quota``: neither planned for nor cut), which is a choice a config may make on purpose
(a category to keep but not to grow), while a typo in ``target_mix`` never is.

Used where the existing set's categories are known: prepare (it measures the set) and ``check-mix`` (the role
reads the set's labels on the node before anything is stopped).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from datagen.adapters import ADAPTERS
from datagen.util import did_you_mean

Findings = Tuple[List[str], List[str]]  # (errors, warnings), each "key: message"


def source_categories(sources: Sequence[object]) -> Dict[str, List[str]]:
    """{category: [source names]} every source can supply (its ``category``, else its adapter's)."""
    supply: Dict[str, List[str]] = {}
    for spec in sources:
        adapter = ADAPTERS.get(getattr(spec, "adapter", "") or "")
        given = getattr(spec, "category", None)
        if given:
            categories: Iterable[str] = [given]
        elif adapter is not None and adapter.default_category:
            categories = [adapter.default_category]
        else:
            categories = adapter.row_categories if adapter is not None else ()
        for category in categories:
            supply.setdefault(category, []).append(getattr(spec, "name", "?"))
    return supply


def mix_findings(target_mix: Mapping[str, float], supply: Mapping[str, Sequence[str]],
                 existing: Optional[Set[str]]) -> Findings:
    """What ``target_mix`` asks for that nothing supplies (errors), and the existing set's categories it leaves
    out (warnings). EXISTING None: the existing set's categories are not known (it was not read), and a category
    only it might have cannot be told from a typo: nothing is judged (prepare judges it, having read the set)."""
    if existing is None:
        return [], []
    known = set(supply) | existing
    errors = []
    for category in sorted(target_mix):
        if category in known:
            continue
        has = ", ".join(sorted(known)) or "nothing"
        errors.append(f"target_mix.{category}: no source supplies it and the existing set does not have it "
                      f"(categories there are: {has}){did_you_mean(category, known)}; fix the name, or add a "
                      f"source with category: {category}")
    warnings = []
    for category in sorted((existing or set()) - set(target_mix)):
        warnings.append(f"target_mix leaves out {category}, a category of the existing set: its rows pass through "
                        f"the merge as they are, neither grown nor cut; add it to target_mix to steer its share")
    return errors, warnings
