"""prepare: sources -> normalised, deduplicated, quota-balanced ``prompts.jsonl`` + manifest.

Two streaming passes. Pass 1 reads every source once, normalises, filters and deduplicates,
and spools usable rows to disk while keeping only 8-byte keys in memory (the dedup set and
one seeded rank per usable row). Then the quota plan is computed from the measured supply,
and pass 2 copies the chosen rows (the ``k`` smallest seeded ranks per source and category, so
the choice is deterministic for a seed and independent of file order) to ``prompts.jsonl``.
Memory is bounded by the dedup index, not by the size of the inputs.
"""

from __future__ import annotations

import os
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, List, TextIO, Tuple

from datagen import __version__, paths, quota
from datagen.config import ConfigError
from datagen.existing import iter_existing
from datagen.mix import mix_findings, source_categories
from datagen.prompts import Unusable, to_prompt
from datagen.sources import adapt, iter_source
from datagen.util import (
    AtomicWriter,
    DatagenError,
    bump,
    canonical_prompt,
    dumps,
    file_stamp,
    fingerprint,
    hash64,
    peak_rss_mib,
    prompt_key,
    read_json,
    stable_id,
    unit_interval,
    write_json,
)


def prepare_fingerprint(cfg: Any) -> str:
    stamps: List[Any] = []
    for s in cfg.sources:
        stamps.append([s.__dict__, [file_stamp(f) for f in s.files]])
    if cfg.existing:
        stamps.append([cfg.existing.__dict__, [file_stamp(f) for f in cfg.existing.files]])
    return fingerprint([
        "prepare", __version__, stamps, cfg.target_total, cfg.target_mix, cfg.seed, cfg.prepare.__dict__,
        cfg.merge.allow_downsample,
    ])


@dataclass
class Existing:
    """The existing set as prepare sees it: its composition, and its prompts as dedup keys."""

    counts: Dict[str, int] = field(default_factory=dict)
    keys: set = field(default_factory=set)
    without_text: int = 0


@dataclass
class Supply:
    """Pass 1's result: one seeded rank per usable row, by (source, category) bucket, and per-source stats."""

    ranks: Dict[Tuple[str, str], array] = field(default_factory=dict)
    bucket_no: Dict[Tuple[str, str], int] = field(default_factory=dict)
    per_source: Dict[str, Dict[str, Any]] = field(default_factory=dict)


def run_prepare(cfg: Any, force: bool = False) -> Dict[str, Any]:
    t0 = time.monotonic()
    work = cfg.work_dir
    os.makedirs(work, exist_ok=True)
    out_path = paths.in_work(work, paths.PROMPTS)
    man_path = paths.in_work(work, paths.PREPARE_MANIFEST)
    fp = prepare_fingerprint(cfg)
    old = read_json(man_path)
    if (not force and old and old.get("fingerprint") == fp and os.path.exists(out_path)
            and os.path.getsize(out_path) == old.get("output_bytes")):
        return {"stage": "prepare", "skipped": True, "reason": "inputs and config unchanged", "written": old["written"],
                "prompts": out_path, "manifest": man_path}
    existing = read_existing(cfg)
    check_mix(cfg, existing)
    manual = manual_counts(cfg)
    spool_path = paths.in_work(work, paths.PREPARE_SPOOL)
    try:
        with open(spool_path, "w", encoding="utf-8") as spool:
            supply = spool_usable_rows(cfg, existing.keys, spool, manual)
        available = {k: len(v) for k, v in supply.ranks.items()}
        the_plan = quota.plan(existing.counts, cfg.target_mix, cfg.target_total, available,
                              {s.name: s.weight for s in cfg.sources}, manual,
                              downsample=cfg.merge.allow_downsample)
        take: Dict[Tuple[str, str], int] = the_plan["take"]  # type: ignore[assignment]
        thresholds = {k: quota.rank_threshold(supply.ranks[k], n) for k, n in take.items() if n > 0}
        supply.ranks.clear()
        written, by_cat = copy_chosen_rows(spool_path, out_path, supply.bucket_no, take, thresholds)
    finally:
        # the spool holds every usable row: never leave it behind, also after a failed read
        if os.path.exists(spool_path):
            os.unlink(spool_path)
    total_written = sum(written.values())
    merged = dict(existing.counts)
    for c, n in by_cat.items():
        bump(merged, c, n)
    manifest = {
        "stage": "prepare",
        "fingerprint": fp,
        "version": __version__,
        "seed": cfg.seed,
        "target_total": cfg.target_total,
        "target_mix": cfg.target_mix,
        "written": total_written,
        "shortfall": max(0, cfg.target_total - total_written),
        "written_per_source": written,
        "written_per_category": by_cat,
        "sources": supply.per_source,
        "available": {f"{s}/{c}": n for (s, c), n in sorted(available.items())},
        "planned_per_category": the_plan["category_quota"],
        "planned": {f"{s}/{c}": n for (s, c), n in sorted(take.items())},
        "existing": {"rows": sum(existing.counts.values()), "per_category": existing.counts,
                     "rows_without_text": existing.without_text, "dedup_keys": len(existing.keys)},
        "mix_before": quota.shares(existing.counts),
        "mix_after_projected": quota.shares(merged),
        "output_bytes": os.path.getsize(out_path),
        "seconds": round(time.monotonic() - t0, 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    write_json(man_path, manifest)
    return {"stage": "prepare", "skipped": False, "written": total_written, "shortfall": manifest["shortfall"],
            "prompts": out_path, "manifest": man_path}


def manual_counts(cfg: Any) -> Dict[str, int]:
    """Sources with a fixed ``count``: planned by that count, whatever the mix says of their categories."""
    return {s.name: s.count for s in cfg.sources if s.count is not None}


def read_existing(cfg: Any) -> Existing:
    existing = Existing()
    for _row, cat, msgs in iter_existing(cfg.existing) if cfg.existing else ():
        bump(existing.counts, cat)
        try:
            if not msgs:
                raise Unusable("no_text")
            existing.keys.add(prompt_key(to_prompt(msgs)))
        except Unusable:
            existing.without_text += 1
    return existing


def check_mix(cfg: Any, existing: Existing) -> None:
    """A target_mix category nothing supplies (a typo) would be planned for and get 0 rows: refused here too,
    for a run that did not pass the role's check (datagen.mix)."""
    mix_errors, mix_warnings = mix_findings(cfg.target_mix, source_categories(cfg.sources),
                                            set(existing.counts) if cfg.existing else set())
    if mix_errors:
        raise ConfigError(mix_errors)
    for warning in mix_warnings:
        print(f"datagen prepare: {warning}", file=sys.stderr, flush=True)


def spool_usable_rows(cfg: Any, existing_keys: set, spool: TextIO, manual: Dict[str, int]) -> Supply:
    """Pass 1: read every source once; spool each usable, new row as "rank bucket<TAB>json"."""
    supply = Supply()
    seen: set = set()
    for index, spec in enumerate(cfg.sources):
        stats = supply.per_source[spec.name] = {"read": 0, "usable": 0, "unusable": {}}
        for raw in iter_source(spec, index):
            stats["read"] += 1
            try:
                messages, tools, category, canonical = usable_prompt(cfg, spec, raw, manual)
                key = hash64(canonical)
                if key in existing_keys:
                    raise Unusable("duplicate_existing")
                if key in seen:
                    raise Unusable("duplicate")
            except Unusable as u:
                bump(stats["unusable"], u.reason)
                continue
            seen.add(key)
            row: Dict[str, Any] = {
                "id": stable_id(spec.name, messages, tools, canonical), "source": spec.name,
                "category": category, "messages": messages,
            }
            if tools:
                row["tools"] = tools
            rank = unit_interval(cfg.seed, row["id"])
            bucket = (spec.name, category)
            if bucket not in supply.ranks:
                supply.ranks[bucket] = array("Q")
                supply.bucket_no[bucket] = len(supply.bucket_no)
            supply.ranks[bucket].append(rank)
            # pass 2 decides from the prefix and copies the JSON untouched
            spool.write(f"{rank} {supply.bucket_no[bucket]}\t{dumps(row)}\n")
            stats["usable"] += 1
    return supply


def usable_prompt(cfg: Any, spec: Any, raw: Any, manual: Dict[str, int]) -> Tuple[list, list, str, str]:
    """(messages, tools, category, canonical text) of one source row, or :class:`Unusable` with the reason."""
    if raw is None:
        raise Unusable("malformed_json")
    messages, tools, category = adapt(spec, raw)
    chars = sum(len(m["content"]) for m in messages)
    if chars < cfg.prepare.min_prompt_chars:
        raise Unusable("too_short")
    if chars > cfg.prepare.max_prompt_chars:
        raise Unusable("too_long")
    if category not in cfg.target_mix and spec.name not in manual:
        raise Unusable("category_not_targeted")
    return messages, tools, category, canonical_prompt(messages, tools)


def copy_chosen_rows(spool_path: str, out_path: str, bucket_no: Dict[Tuple[str, str], int],
                     take: Dict[Tuple[str, str], int], thresholds: Dict[Tuple[str, str], int]
                     ) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Pass 2: copy each bucket's rows ranked at or under its threshold, up to its take; (per source, per category)."""
    buckets = {no: b for b, no in bucket_no.items()}
    taken = {no: 0 for no in buckets}
    limits = {no: take.get(b, 0) for no, b in buckets.items()}
    cut = {no: thresholds.get(b, -1) for no, b in buckets.items()}
    with AtomicWriter(out_path) as out, open(spool_path, encoding="utf-8") as spool_in:
        for line in spool_in:
            head, _sep, body = line.partition("\t")
            rank_s, no_s = head.split(" ")
            no = int(no_s)
            if taken[no] >= limits[no] or int(rank_s) > cut[no]:
                continue
            taken[no] += 1
            out.write(body)
    written: Dict[str, int] = {}
    by_cat: Dict[str, int] = {}
    for no, n in taken.items():
        if n:
            src, cat = buckets[no]
            bump(written, src, n)
            bump(by_cat, cat, n)
    return written, by_cat


__all__ = ["run_prepare", "prepare_fingerprint", "DatagenError"]
