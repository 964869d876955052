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
    file_stamp,
    fingerprint,
    peak_rss_mib,
    read_json,
    stable_id,
    unit_interval,
)


def _bump(d: Dict[str, int], key: str, by: int = 1) -> None:
    d[key] = d.get(key, 0) + by


def _existing_id(row: Dict[str, Any], msgs: Optional[list], n: int) -> str:
    if row.get("id") not in (None, ""):
        return str(row["id"])
    if msgs:
        return stable_id("existing", msgs)
    return f"existing-{n}"


def _shares(counts: Dict[str, int]) -> Dict[str, float]:
    total = sum(counts.values())
    return {c: round(v / total, 6) for c, v in sorted(counts.items())} if total else {}


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

    import pyarrow.parquet as pq

    # pass 1: composition of both sides, ranks of existing rows
    new_counts: Dict[str, int] = {}
    for s in new_shards:
        for batch in pq.ParquetFile(s).iter_batches(columns=["category"], batch_size=65536):
            for c in batch.column(0).to_pylist():
                _bump(new_counts, c)
    ex_counts: Dict[str, int] = {}
    ranks: Dict[str, array] = {}
    needs_tokenizer = False
    n = 0
    if ex:
        for row, cat, msgs in iter_existing(ex):
            _bump(ex_counts, cat)
            if "input_ids" not in row:
                needs_tokenizer = True
            ranks.setdefault(cat, array("Q")).append(unit_interval(cfg.seed, _existing_id(row, msgs, n)))
            n += 1
    before = dict(ex_counts)
    uncut = dict(ex_counts)
    for c, k in new_counts.items():
        _bump(uncut, c, k)
    keep = quota.downsample_keep(uncut, cfg.target_mix) if cfg.merge.allow_downsample else dict(uncut)
    ex_keep = {c: max(0, keep.get(c, 0) - new_counts.get(c, 0)) for c in ex_counts}
    new_keep = {c: min(new_counts[c], keep.get(c, new_counts[c])) for c in new_counts}
    thresholds: Dict[str, int] = {}
    for c, arr in ranks.items():
        if ex_keep[c] < len(arr):
            import numpy as np

            k = ex_keep[c]
            thresholds[c] = -1 if k == 0 else int(np.partition(np.frombuffer(arr, dtype=np.uint64), k - 1)[k - 1])
    del ranks

    # pass 2: write
    after: Dict[str, int] = {}
    stats = new_stats()
    renderer = None
    if needs_tokenizer:
        renderer = Renderer(load_tokenizer(cfg.tokenizer), template_kwargs(cfg.raw))
    build = ShardBuild(out_dir, cfg.merge.shard_rows, with_origin=True)
    with build as writer:
        taken_new: Dict[str, int] = {}
        for s in new_shards:
            for batch in pq.ParquetFile(s).iter_batches(batch_size=4096):
                rows = []
                for r in batch.to_pylist():
                    c = r["category"]
                    if taken_new.get(c, 0) >= new_keep.get(c, 0):
                        continue
                    _bump(taken_new, c)
                    r["origin"] = "new"
                    rows.append(r)
                    _bump(after, c)
                writer.write(rows)
        if ex:
            pending: List[Dict[str, Any]] = []
            taken_ex: Dict[str, int] = {}
            n = 0
            for row, cat, msgs in iter_existing(ex):
                rid = _existing_id(row, msgs, n)
                n += 1
                if cat in thresholds and (thresholds[cat] < 0 or unit_interval(cfg.seed, rid) > thresholds[cat]):
                    continue
                if taken_ex.get(cat, 0) >= ex_keep.get(cat, 0):
                    continue
                _bump(taken_ex, cat)
                if "input_ids" in row and "loss_mask" in row:
                    ids, mask = list(row["input_ids"]), list(row["loss_mask"])
                    writer.write([{
                        "id": rid, "source": str(row.get("source") or "existing"), "category": cat,
                        "input_ids": ids, "loss_mask": mask, "num_tokens": len(ids), "num_supervised": sum(mask),
                        "truncated": False, "finish_reason": None, "origin": "existing",
                    }])
                    _bump(after, cat)
                elif msgs:
                    pending.append({"id": rid, "source": str(row.get("source") or "existing"), "category": cat,
                                    "messages": msgs, "tools": row.get("tools") or None})
                    if len(pending) >= cfg.tokenize.batch_size:
                        _write_tokenized(pending, renderer, cfg, stats, writer, after)
                        pending = []
                else:
                    _bump(stats["skipped"], "existing_row_without_tokens_or_messages")
            _write_tokenized(pending, renderer, cfg, stats, writer, after)
    manifest = {
        "stage": "merge", "fingerprint": fp, "version": __version__, "allow_downsample": cfg.merge.allow_downsample,
        "rows": sum(after.values()), "existing_per_category": before, "new_per_category": new_counts,
        "merged_per_category": after, "dropped_per_category": {c: uncut[c] - after.get(c, 0) for c in uncut
                                                               if uncut[c] - after.get(c, 0)},
        "mix_before": _shares(before), "mix_after": _shares(after), "target_mix": cfg.target_mix,
        "existing_tokenized_here": {k: v for k, v in stats.items() if k in ("skipped", "truncated")},
        "shards": build.shards, "seconds": round(time.monotonic() - t0, 3), "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    build.publish(manifest)
    return {"stage": "merge", "skipped": False, "rows": manifest["rows"], "mix_before": manifest["mix_before"],
            "mix_after": manifest["mix_after"], "dir": out_dir}


def _write_tokenized(rows: List[Dict[str, Any]], renderer: Any, cfg: Any, stats: Dict[str, Any],
                     writer: ShardWriter, after: Dict[str, int]) -> None:
    if not rows:
        return
    done = tokenize_rows(rows, renderer, cfg.max_length, cfg.tokenize.supervise, stats)
    for r in done:
        r["origin"] = "existing"
        _bump(after, r["category"])
    writer.write(done)
