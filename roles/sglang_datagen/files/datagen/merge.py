"""merge: new tokenized shards + the existing dataset -> ``merged/`` shards toward the target mix.

Every new row is kept. Existing rows are kept too, unless ``merge.allow_downsample`` is true:
then categories whose share in the uncut merge is above target are cut to exactly their
target share (``quota.downsample_keep``), taking existing rows first (the new rows are the
target model's own answers) and choosing them by a seeded hash rank, so a rerun cuts the same
rows. Existing rows that are already tokenized (``input_ids`` + ``loss_mask``) are copied; rows
with ``messages``/``conversations`` are tokenized here with the same tokenizer and rules.
Streams in two passes; memory holds one 8-byte rank per existing row of a category being cut.
"""

from __future__ import annotations

import os
import time
from array import array
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from datagen import __version__, paths, quota
from datagen.existing import iter_existing
from datagen.tokenize import (
    Renderer,
    ShardBuild,
    ShardWriter,
    load_tokenizer,
    new_stats,
    template_kwargs,
    tokenize_rows,
)
from datagen.util import (
    DatagenError,
    bump,
    file_stamp,
    fingerprint,
    peak_rss_mib,
    read_json,
    stable_id,
    unit_interval,
)


def _existing_id(row: Dict[str, Any], msgs: Optional[list], n: int) -> str:
    if row.get("id") not in (None, ""):
        return str(row["id"])
    if msgs:
        return stable_id("existing", msgs)
    return f"existing-{n}"


@dataclass
class Plan:
    """What the merge keeps: every category's rows before and uncut, and how many of each side stay."""

    before: Dict[str, int]  # the existing set's rows per category
    new_counts: Dict[str, int]  # the new shards' rows per category
    uncut: Dict[str, int]  # both, with nothing cut
    ex_keep: Dict[str, int]
    new_keep: Dict[str, int]
    thresholds: Dict[str, int]  # per category being cut: the highest existing-row rank kept (-1: none)
    needs_tokenizer: bool  # some existing row has messages, not tokens


def run_merge(cfg: Any, force: bool = False) -> Dict[str, Any]:
    t0 = time.monotonic()
    tok_dir = paths.in_work(cfg.work_dir, paths.TOKENIZED_DIR)
    tok_man = read_json(os.path.join(tok_dir, paths.MANIFEST))
    if not tok_man:
        raise DatagenError(f"merge: {tok_dir}/manifest.json not found; run `python -m datagen tokenize` first")
    new_shards = [s for s in tok_man.get("shards", []) if os.path.exists(s)]
    out_dir = paths.in_work(cfg.work_dir, paths.MERGED_DIR)
    man_path = os.path.join(out_dir, paths.MANIFEST)
    ex = cfg.existing
    fp = fingerprint([
        "merge", __version__, tok_man.get("fingerprint"), cfg.target_mix, cfg.merge.__dict__, cfg.seed, cfg.max_length,
        cfg.tokenizer, [ex.__dict__, [file_stamp(f) for f in ex.files]] if ex else None,
    ])
    old = read_json(man_path)
    if not force and old and old.get("fingerprint") == fp and all(os.path.exists(s) for s in old.get("shards", [])):
        return {"stage": "merge", "skipped": True, "reason": "inputs and config unchanged", "rows": old["rows"],
                "dir": out_dir}
    plan = plan_merge(cfg, new_shards)
    after: Dict[str, int] = {}
    stats = new_stats()
    build = ShardBuild(out_dir, cfg.merge.shard_rows, with_origin=True)
    with build as writer:
        write_new_rows(writer, new_shards, plan.new_keep, after)
        if ex:
            renderer = Renderer(load_tokenizer(cfg.tokenizer), template_kwargs(cfg.raw)) if plan.needs_tokenizer else None
            write_existing_rows(writer, cfg, plan, renderer, stats, after)
    manifest = {
        "stage": "merge", "fingerprint": fp, "version": __version__, "allow_downsample": cfg.merge.allow_downsample,
        "rows": sum(after.values()), "existing_per_category": plan.before, "new_per_category": plan.new_counts,
        "merged_per_category": after, "dropped_per_category": {c: plan.uncut[c] - after.get(c, 0) for c in plan.uncut
                                                               if plan.uncut[c] - after.get(c, 0)},
        "mix_before": quota.shares(plan.before), "mix_after": quota.shares(after), "target_mix": cfg.target_mix,
        "existing_tokenized_here": {k: v for k, v in stats.items() if k in ("skipped", "truncated")},
        "shards": build.shards, "seconds": round(time.monotonic() - t0, 3), "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    build.publish(manifest)
    return {"stage": "merge", "skipped": False, "rows": manifest["rows"], "mix_before": manifest["mix_before"],
            "mix_after": manifest["mix_after"], "dir": out_dir}


def plan_merge(cfg: Any, new_shards: List[str]) -> Plan:
    """Pass 1: the composition of both sides, and the seeded ranks of the existing rows of categories being cut."""
    import pyarrow.parquet as pq

    new_counts: Dict[str, int] = {}
    for s in new_shards:
        for batch in pq.ParquetFile(s).iter_batches(columns=["category"], batch_size=65536):
            for c in batch.column(0).to_pylist():
                bump(new_counts, c)
    ex_counts: Dict[str, int] = {}
    ranks: Dict[str, array] = {}
    needs_tokenizer = False
    for n, (row, cat, msgs) in enumerate(iter_existing(cfg.existing) if cfg.existing else ()):
        bump(ex_counts, cat)
        needs_tokenizer = needs_tokenizer or "input_ids" not in row
        ranks.setdefault(cat, array("Q")).append(unit_interval(cfg.seed, _existing_id(row, msgs, n)))
    uncut = dict(ex_counts)
    for c, k in new_counts.items():
        bump(uncut, c, k)
    keep = quota.downsample_keep(uncut, cfg.target_mix) if cfg.merge.allow_downsample else dict(uncut)
    ex_keep = {c: max(0, keep.get(c, 0) - new_counts.get(c, 0)) for c in ex_counts}
    new_keep = {c: min(new_counts[c], keep.get(c, new_counts[c])) for c in new_counts}
    thresholds = {c: quota.rank_threshold(arr, ex_keep[c]) for c, arr in ranks.items() if ex_keep[c] < len(arr)}
    return Plan(dict(ex_counts), new_counts, uncut, ex_keep, new_keep, thresholds, needs_tokenizer)


def write_new_rows(writer: ShardWriter, new_shards: List[str], new_keep: Dict[str, int], after: Dict[str, int]) -> None:
    """Pass 2, the new side: each category's rows up to its keep, in shard order."""
    import pyarrow.parquet as pq

    taken: Dict[str, int] = {}
    for s in new_shards:
        for batch in pq.ParquetFile(s).iter_batches(batch_size=4096):
            rows = []
            for r in batch.to_pylist():
                c = r["category"]
                if taken.get(c, 0) >= new_keep.get(c, 0):
                    continue
                bump(taken, c)
                r["origin"] = "new"
                rows.append(r)
                bump(after, c)
            writer.write(rows)


def write_existing_rows(writer: ShardWriter, cfg: Any, plan: Plan, renderer: Any, stats: Dict[str, Any],
                        after: Dict[str, int]) -> None:
    """Pass 2, the existing side: rows ranked within their category's cut, copied if tokenized, else tokenized."""
    pending: List[Dict[str, Any]] = []
    taken: Dict[str, int] = {}
    for n, (row, cat, msgs) in enumerate(iter_existing(cfg.existing)):
        rid = _existing_id(row, msgs, n)
        cut = plan.thresholds.get(cat)
        if cut is not None and (cut < 0 or unit_interval(cfg.seed, rid) > cut):
            continue
        if taken.get(cat, 0) >= plan.ex_keep.get(cat, 0):
            continue
        bump(taken, cat)
        source = str(row.get("source") or "existing")
        if "input_ids" in row and "loss_mask" in row:
            ids, mask = list(row["input_ids"]), list(row["loss_mask"])
            writer.write([{
                "id": rid, "source": source, "category": cat,
                "input_ids": ids, "loss_mask": mask, "num_tokens": len(ids), "num_supervised": sum(mask),
                "truncated": False, "finish_reason": None, "origin": "existing",
            }])
            bump(after, cat)
        elif msgs:
            pending.append({"id": rid, "source": source, "category": cat, "messages": msgs,
                            "tools": row.get("tools") or None})
            if len(pending) >= cfg.tokenize.batch_size:
                _write_tokenized(pending, renderer, cfg, stats, writer, after)
                pending = []
        else:
            bump(stats["skipped"], "existing_row_without_tokens_or_messages")
    _write_tokenized(pending, renderer, cfg, stats, writer, after)


def _write_tokenized(rows: List[Dict[str, Any]], renderer: Any, cfg: Any, stats: Dict[str, Any],
                     writer: ShardWriter, after: Dict[str, int]) -> None:
    if not rows:
        return
    done = tokenize_rows(rows, renderer, cfg.max_length, cfg.tokenize.supervise, stats)
    for r in done:
        r["origin"] = "existing"
        bump(after, r["category"])
    writer.write(done)
