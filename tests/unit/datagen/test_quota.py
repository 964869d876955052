"""Quota arithmetic: exact numbers on small cases and the incident's own figures."""

from __future__ import annotations

from datagen import quota

MIX = {"coding": 0.45, "math": 0.2, "general": 0.2, "tool_use": 0.075, "agent": 0.075}
# the incident: 902K existing rows, 77% coding
EXISTING = {"coding": 694540, "math": 60000, "general": 147460}


def test_largest_remainder_sums_and_is_deterministic():
    got = quota.largest_remainder(10, {"a": 1, "b": 1, "c": 1})
    assert got == {"a": 4, "b": 3, "c": 3}
    assert sum(quota.largest_remainder(200000, {"x": 0.3, "y": 0.3, "z": 0.4}).values()) == 200000
    assert quota.largest_remainder(5, {"a": 0, "b": 0}) == {"a": 0, "b": 0}


def test_capped_fill_passes_the_excess_on():
    got = quota.capped_fill(100, {"a": 1, "b": 1, "c": 2}, {"a": 10, "b": 100, "c": 100})
    assert got == {"a": 10, "b": 30, "c": 60}


def test_plan_categories_moves_toward_target_without_overshoot():
    n = 200000
    got = quota.plan_categories(EXISTING, MIX, n)
    assert sum(got.values()) == n
    assert got["coding"] == 0  # already far over target
    total = sum(EXISTING.values()) + n
    for c in MIX:
        before = EXISTING.get(c, 0) / sum(EXISTING.values())
        after = (EXISTING.get(c, 0) + got[c]) / total
        # every category ends nearer its target and none crosses it
        assert abs(after - MIX[c]) <= abs(before - MIX[c]) + 1e-9
        if before < MIX[c]:
            assert after <= MIX[c] + 1e-6
    # shortfall-proportional: tool_use and agent have equal claims
    assert abs(got["tool_use"] - got["agent"]) <= 1


def test_plan_categories_capacity_redistributes():
    capacity = {"math": 1000, "general": 10**6, "tool_use": 5000, "agent": 10**6, "coding": 10**6}
    got = quota.plan_categories(EXISTING, MIX, 200000, capacity=capacity)
    assert got["math"] == 1000 and got["tool_use"] == 5000
    assert sum(got.values()) == 200000


def test_plan_categories_with_downsampling_lands_on_target_for_the_uncut():
    n = 200000
    got = quota.plan_categories(EXISTING, MIX, n, downsample=True)
    assert sum(got.values()) == n and got["coding"] == 0
    over, total = quota.over_target(EXISTING, MIX, n)
    assert "coding" in over
    for c in MIX:
        if c not in over:
            assert abs((EXISTING.get(c, 0) + got[c]) - total * MIX[c]) <= 1


def test_plan_manual_count_overrides_and_counts_toward_mix():
    available = {("ii", "general"): 500, ("ii", "coding"): 500, ("mm", "math"): 1000, ("h", "tool_use"): 1000,
                 ("oa", "agent"): 1000}
    got = quota.plan({}, MIX, 1000, available, {}, manual={"h": 300})
    take = got["take"]
    assert take[("h", "tool_use")] == 300
    assert sum(take.values()) == 1000
    # tool_use is over target through the manual count; the rest is planned without it
    assert got["category_quota"]["tool_use"] == 0


def test_plan_sources_by_weight_and_supply():
    take = quota.plan_sources({"coding": 90}, {("a", "coding"): 1000, ("b", "coding"): 20}, {"a": 1.0, "b": 2.0})
    assert take == {("a", "coding"): 70, ("b", "coding"): 20}


def test_downsample_keep_cuts_only_over_target():
    counts = {"coding": 694540, "math": 130000, "general": 200000, "tool_use": 40000, "agent": 38000}
    keep = quota.downsample_keep(counts, MIX)
    for c in ("math", "general", "tool_use", "agent"):
        assert keep[c] == counts[c]
    total = sum(keep.values())
    assert abs(keep["coding"] / total - MIX["coding"]) < 1e-5
    # unlisted categories pass through
    assert quota.downsample_keep({"coding": 10, "other": 5}, {"coding": 1.0}) == {"coding": 10, "other": 5}


def test_shares_are_fractions_of_the_rows_rounded_or_exact():
    assert quota.shares({"math": 1, "coding": 2}) == {"coding": 0.666667, "math": 0.333333}
    assert quota.shares({"math": 1, "coding": 2}, places=None) == {"coding": 2 / 3, "math": 1 / 3}
    assert quota.shares({}) == {} and quota.shares({"math": 0}) == {}


def test_rank_threshold_keeps_exactly_the_k_lowest_ranks():
    from array import array

    ranks = array("Q", [50, 10, 2**64 - 2, 30, 20])
    for k in range(len(ranks) + 2):
        cut = quota.rank_threshold(ranks, k)
        assert sum(1 for rank in ranks if rank <= cut) == min(k, len(ranks))
    assert quota.rank_threshold(ranks, 0) == -1 and quota.rank_threshold(ranks, 2) == 20
