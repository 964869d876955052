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
from typing import Any, Dict, List, Tuple

from datagen import __version__, paths, quota
from datagen.config import ConfigError
from datagen.existing import iter_existing
from datagen.mix import mix_findings, source_categories
from datagen.sources import Unusable, adapt, iter_source, to_prompt
from datagen.util import (
    AtomicWriter,
    DatagenError,
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


def _bump(d: Dict[str, int], key: str, by: int = 1) -> None:
    d[key] = d.get(key, 0) + by


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

    # existing set: composition, and its prompts into the dedup index
    existing_keys: set = set()
    existing_counts: Dict[str, int] = {}
    existing_no_text = 0
    if cfg.existing:
        for _row, cat, msgs in iter_existing(cfg.existing):
            _bump(existing_counts, cat)
            if msgs:
                try:
                    existing_keys.add(prompt_key(to_prompt(msgs)))
                except Unusable:
                    existing_no_text += 1
            else:
                existing_no_text += 1

    # a target_mix category nothing supplies (a typo) would be planned for and get 0 rows: refused here too,
    # for a run that did not pass the role's check (datagen.mix)
    mix_errors, mix_warnings = mix_findings(cfg.target_mix, source_categories(cfg.sources),
                                            set(existing_counts) if cfg.existing else set())
    if mix_errors:
        raise ConfigError(mix_errors)
    for warning in mix_warnings:
        print(f"datagen prepare: {warning}", file=sys.stderr, flush=True)

    seen: set = set()
    ranks: Dict[Tuple[str, str], array] = {}
    bucket_no: Dict[Tuple[str, str], int] = {}
    per_source: Dict[str, Dict[str, Any]] = {}
    manual = {s.name: s.count for s in cfg.sources if s.count is not None}
    spool_path = paths.in_work(work, paths.PREPARE_SPOOL)
    try:
        with open(spool_path, "w", encoding="utf-8") as spool:
            for index, spec in enumerate(cfg.sources):
                stats = per_source[spec.name] = {"read": 0, "usable": 0, "unusable": {}}
                unusable = stats["unusable"]
                for raw in iter_source(spec, index):
                    stats["read"] += 1
                    try:
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
                        canonical = canonical_prompt(messages, tools)
                        key = hash64(canonical)
                        if key in existing_keys:
                            raise Unusable("duplicate_existing")
                        if key in seen:
                            raise Unusable("duplicate")
                    except Unusable as u:
                        _bump(unusable, u.reason)
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
                    if bucket not in ranks:
                        ranks[bucket] = array("Q")
                        bucket_no[bucket] = len(bucket_no)
                    ranks[bucket].append(rank)
                    # "rank bucket<TAB>json": pass 2 decides from the prefix and copies the JSON untouched
                    spool.write(f"{rank} {bucket_no[bucket]}\t{dumps(row)}\n")
                    stats["usable"] += 1

        available = {k: len(v) for k, v in ranks.items()}
        weights = {s.name: s.weight for s in cfg.sources}
        the_plan = quota.plan(existing_counts, cfg.target_mix, cfg.target_total, available, weights, manual,
                              downsample=cfg.merge.allow_downsample)
        take: Dict[Tuple[str, str], int] = the_plan["take"]  # type: ignore[assignment]
        thresholds = {k: _kth_smallest(ranks[k], n) for k, n in take.items() if n > 0}
        del ranks

        written: Dict[str, int] = {}
        by_cat: Dict[str, int] = {}
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
        for no, n in taken.items():
            if n:
                src, cat = buckets[no]
                _bump(written, src, n)
                _bump(by_cat, cat, n)
    finally:
        # the spool holds every usable row: never leave it behind, also after a failed read
        if os.path.exists(spool_path):
            os.unlink(spool_path)

    total_written = sum(written.values())
    merged = dict(existing_counts)
    for c, n in by_cat.items():
        _bump(merged, c, n)
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
        "sources": per_source,
        "available": {f"{s}/{c}": n for (s, c), n in sorted(available.items())},
        "planned_per_category": the_plan["category_quota"],
        "planned": {f"{s}/{c}": n for (s, c), n in sorted(take.items())},
        "existing": {"rows": sum(existing_counts.values()), "per_category": existing_counts,
                     "rows_without_text": existing_no_text, "dedup_keys": len(existing_keys)},
        "mix_before": _shares(existing_counts),
        "mix_after_projected": _shares(merged),
        "output_bytes": os.path.getsize(out_path),
        "seconds": round(time.monotonic() - t0, 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    write_json(man_path, manifest)
    return {"stage": "prepare", "skipped": False, "written": total_written, "shortfall": manifest["shortfall"],
            "prompts": out_path, "manifest": man_path}


def _kth_smallest(values: array, k: int) -> int:
    if k >= len(values):
        return 2**64 - 1
    import numpy as np

    arr = np.frombuffer(values, dtype=np.uint64)
    return int(np.partition(arr, k - 1)[k - 1])


def _shares(counts: Dict[str, int]) -> Dict[str, float]:
    total = sum(counts.values())
    return {c: round(n / total, 6) for c, n in sorted(counts.items())} if total else {}


__all__ = ["run_prepare", "prepare_fingerprint", "DatagenError"]
