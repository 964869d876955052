"""Quota arithmetic: pure functions, no I/O.

Terms: ``existing`` = rows per category already in the training set, ``mix`` = target fraction per
category (sums to 1), ``n`` = new prompts to add. Categories absent from ``mix`` are neither
planned for nor cut; they pass through.

Without downsampling the merged total is fixed (existing + n), so each category's shortfall
``max(0, total * t_c - existing_c)`` is its claim, and n is shared in proportion to the claims:
every category moves toward its target and none overshoots (the claims always add up to at
least n). With downsampling allowed, categories already over their target will be cut at merge
time, so they get nothing and the others are planned to land exactly on their mutual proportions.
"""

from __future__ import annotations

from array import array
from typing import Dict, Hashable, Mapping, Optional, Tuple


def largest_remainder(total: int, weights: Mapping[Hashable, float]) -> Dict[Hashable, int]:
    """Split ``total`` into integers proportional to ``weights``; ties go to the smaller key (deterministic)."""
    keys = sorted(weights, key=str)
    wsum = float(sum(max(0.0, weights[k]) for k in keys))
    if total <= 0 or wsum <= 0:
        return {k: 0 for k in keys}
    exact = {k: total * max(0.0, weights[k]) / wsum for k in keys}
    out = {k: int(exact[k]) for k in keys}
    rest = total - sum(out.values())
    for k in sorted(keys, key=lambda k: (-(exact[k] - out[k]), str(k)))[:rest]:
        out[k] += 1
    return out


def capped_fill(total: int, weights: Mapping[Hashable, float], caps: Mapping[Hashable, int]) -> Dict[Hashable, int]:
    """Proportional split with per-key caps: what a capped key cannot take goes to the others."""
    alloc = {k: 0 for k in weights}
    remaining = total
    open_keys = {k for k in weights if weights[k] > 0 and caps.get(k, 0) > 0}
    while remaining > 0 and open_keys:
        share = largest_remainder(remaining, {k: weights[k] for k in open_keys})
        progressed = 0
        for k in sorted(open_keys, key=str):
            room = caps[k] - alloc[k]
            take = min(share[k], room)
            alloc[k] += take
            progressed += take
            if alloc[k] >= caps[k]:
                open_keys.discard(k)
        remaining -= progressed
        if progressed == 0:
            break
    return alloc


def over_target(existing: Mapping[str, int], mix: Mapping[str, float], n: int) -> Tuple[set, float]:
    """Categories that will be cut when downsampling is allowed, and the merged total after the cut."""
    listed = {c: existing.get(c, 0) for c in mix}
    over: set = set()
    while True:
        under = [c for c in mix if c not in over and mix[c] > 0]
        tsum = sum(mix[c] for c in under)
        if not under or tsum <= 0:
            return over, float(sum(listed.values()) + n)
        total = (sum(listed[c] for c in under) + n) / tsum
        newly = {c for c in under if listed[c] >= total * mix[c]}
        if not newly:
            return over, total
        over |= newly


def plan_categories(
    existing: Mapping[str, int], mix: Mapping[str, float], n: int,
    capacity: Optional[Mapping[str, int]] = None, downsample: bool = False,
) -> Dict[str, int]:
    """New prompts per category. ``capacity`` = prompts available per category (None: unlimited).

    A category that cannot supply its share passes the rest on to the categories that still
    fall short of their target, and then, if n is still not reached, to any category with
    supply in proportion to the target mix (the run delivers n rows when the sources have them).
    """
    cats = list(mix)
    caps = {c: (capacity.get(c, 0) if capacity is not None else n) for c in cats}
    if downsample:
        over, total = over_target(existing, mix, n)
    else:
        over, total = set(), float(sum(existing.get(c, 0) for c in cats) + n)
    claims = {c: max(0.0, total * mix[c] - existing.get(c, 0)) for c in cats if c not in over}
    alloc = capped_fill(n, claims, caps)
    left = n - sum(alloc.values())
    if left > 0:
        spare = {c: caps[c] - alloc.get(c, 0) for c in cats}
        extra = capped_fill(left, {c: mix[c] for c in cats if spare[c] > 0}, spare)
        for c, k in extra.items():
            alloc[c] = alloc.get(c, 0) + k
    return {c: alloc.get(c, 0) for c in cats}


def plan_sources(
    category_quota: Mapping[str, int],
    available: Mapping[Tuple[str, str], int],
    weights: Mapping[str, float],
) -> Dict[Tuple[str, str], int]:
    """Share each category's quota among the sources that supply it, by source weight, capped by supply."""
    out: Dict[Tuple[str, str], int] = {}
    for cat, q in category_quota.items():
        keys = [k for k in available if k[1] == cat]
        fill = capped_fill(q, {k: weights.get(k[0], 1.0) for k in keys}, {k: available[k] for k in keys})
        out.update(fill)
    return out


def plan(
    existing: Mapping[str, int], mix: Mapping[str, float], n: int,
    available: Mapping[Tuple[str, str], int], weights: Mapping[str, float],
    manual: Mapping[str, int], downsample: bool = False,
) -> Dict[str, object]:
    """The whole prepare plan: rows to take per (source, category).

    Sources with a manual ``count`` are served first (spread over their categories by supply) and
    count as already present; the remaining budget is planned by category over the other sources.
    """
    take: Dict[Tuple[str, str], int] = {}
    effective = dict(existing)
    for src, want in sorted(manual.items()):
        keys = {k: v for k, v in available.items() if k[0] == src}
        got = capped_fill(min(want, sum(keys.values())), {k: float(v) for k, v in keys.items()}, keys)
        for k, v in got.items():
            take[k] = v
            effective[k[1]] = effective.get(k[1], 0) + v
    rest = max(0, n - sum(take.values()))
    auto = {k: v for k, v in available.items() if k[0] not in manual and k[1] in mix}
    capacity: Dict[str, int] = {}
    for (_src, cat), v in auto.items():
        capacity[cat] = capacity.get(cat, 0) + v
    # manual rows already moved the mix: plan the rest against existing + manual, over the same merged total
    cat_quota = plan_categories(effective, mix, rest, capacity, downsample)
    take.update(plan_sources(cat_quota, auto, weights))
    return {"category_quota": cat_quota, "take": take}


def downsample_keep(counts: Mapping[str, int], mix: Mapping[str, float]) -> Dict[str, int]:
    """Rows to keep per category at merge: over-target categories cut to exactly their target share.

    Over-target = share above target in the uncut merge. The cut total M solves
    M = sum(kept whole) / sum(their targets); nothing else is cut, so a category short of supply
    stays short (that needs more prompts, not fewer rows elsewhere). Unlisted categories pass through.
    """
    listed = {c: counts.get(c, 0) for c in mix}
    total = sum(listed.values())
    keep = dict(counts)
    if total == 0:
        return keep
    over = {c for c in listed if mix[c] > 0 and listed[c] / total > mix[c] + 1e-12}
    over |= {c for c in listed if mix[c] == 0 and listed[c] > 0}
    under = [c for c in listed if c not in over]
    tsum = sum(mix[c] for c in under)
    if not over or tsum <= 0:
        return keep
    merged = sum(listed[c] for c in under) / tsum
    for c in over:
        keep[c] = min(listed[c], int(round(merged * mix[c])))
    return keep


def shares(counts: Mapping[str, int], places: Optional[int] = 6) -> Dict[str, float]:
    """Each category's fraction of the rows (rounded to ``places``, None: exact); {} for no rows."""
    total = sum(counts.values())
    if not total:
        return {}
    return {c: (v / total if places is None else round(v / total, places)) for c, v in sorted(counts.items())}


def rank_threshold(ranks: array, k: int) -> int:
    """The rank at or under which exactly the ``k`` lowest-ranked rows fall (ranks are seeded 64-bit hashes).

    -1 keeps none; k at or past the count keeps all. A rerun with the same seed chooses the same rows.
    """
    if k <= 0:
        return -1
    if k >= len(ranks):
        return 2**64 - 1
    import numpy as np  # the pipeline's venv has it (pyarrow needs it); quota's planning does not

    return int(np.partition(np.frombuffer(ranks, dtype=np.uint64), k - 1)[k - 1])
