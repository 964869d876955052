"""report: a composition table (markdown) and PNG charts from the stage manifests and shards.

``report/composition.md``: the mix before (existing), the new rows, after (merged; or the
projection from prepare when merge has not run), the target and the distance to it, then per
source and per reason counts from prepare, tokenize and merge. ``report/mix.png``: grouped bars
before / after / target per category. ``report/lengths.png``: token-length histograms of the new
rows and of the existing rows in the merge (read from the ``num_tokens`` column only).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from datagen import __version__, paths
from datagen.quota import shares
from datagen.util import AtomicWriter, DatagenError, fingerprint, read_json, write_json


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def composition(before: Dict[str, int], new: Dict[str, int], after: Dict[str, int],
                target: Dict[str, float]) -> List[Dict[str, Any]]:
    """One row per category: counts, shares, target and the distance after - target (percentage points)."""
    cats = sorted(set(before) | set(new) | set(after) | set(target))
    sb, sa = shares(before, places=None), shares(after, places=None)
    rows = []
    for c in cats:
        rows.append({
            "category": c, "before": before.get(c, 0), "before_share": sb.get(c, 0.0), "new": new.get(c, 0),
            "after": after.get(c, 0), "after_share": sa.get(c, 0.0), "target": target.get(c),
            "gap_pp": None if c not in target else round(100 * (sa.get(c, 0.0) - target[c]), 2),
        })
    return rows


def markdown_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| category | existing | share | new | merged | share | target | gap (pp) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = "-" if r["gap_pp"] is None else f"{r['gap_pp']:+.1f}"
        lines.append(f"| {r['category']} | {r['before']:,} | {_pct(r['before_share'])} | {r['new']:,} | "
                     f"{r['after']:,} | {_pct(r['after_share'])} | {_pct(r['target'])} | {gap} |")
    tb = sum(r["before"] for r in rows)
    tn = sum(r["new"] for r in rows)
    ta = sum(r["after"] for r in rows)
    lines.append(f"| **total** | {tb:,} | | {tn:,} | {ta:,} | | | |")
    return "\n".join(lines)


def _lengths(shards: List[str], origin: Optional[str] = None) -> List[int]:
    import pyarrow.parquet as pq

    out: List[int] = []
    for s in shards:
        if not os.path.exists(s):
            continue
        pf = pq.ParquetFile(s)
        cols = ["num_tokens"] + (["origin"] if origin and "origin" in pf.schema_arrow.names else [])
        for batch in pf.iter_batches(columns=cols, batch_size=65536):
            n = batch.column(0).to_pylist()
            if len(cols) == 2:
                o = batch.column(1).to_pylist()
                n = [x for x, y in zip(n, o) if y == origin]
            out.extend(n)
    return out


def _charts(out_dir: str, rows: List[Dict[str, Any]], after_label: str, new_lens: List[int],
            ex_lens: List[int]) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")  # headless GPU node
    import matplotlib.pyplot as plt

    cats = [r["category"] for r in rows]
    x = list(range(len(cats)))
    w = 0.27
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cats)), 4))
    ax.bar([i - w for i in x], [100 * r["before_share"] for r in rows], w, label="existing")
    ax.bar(x, [100 * r["after_share"] for r in rows], w, label=after_label)
    ax.bar([i + w for i in x], [100 * (r["target"] or 0) for r in rows], w, label="target")
    ax.set_xticks(x)
    ax.set_xticklabels(cats, rotation=20)
    ax.set_ylabel("share of rows (%)")
    ax.set_title("Category mix before and after")
    ax.legend()
    fig.tight_layout()
    mix_png = os.path.join(out_dir, "mix.png")
    fig.savefig(mix_png, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    top = max(new_lens + ex_lens + [1])
    bins = list(range(0, top + top // 40 + 2, max(1, top // 40)))
    if ex_lens:
        ax.hist(ex_lens, bins=bins, alpha=0.6, label=f"existing ({len(ex_lens):,})", density=True)
    if new_lens:
        ax.hist(new_lens, bins=bins, alpha=0.6, label=f"new ({len(new_lens):,})", density=True)
    ax.set_xlabel("tokens per row")
    ax.set_ylabel("density")
    ax.set_title("Token length")
    if new_lens or ex_lens:
        ax.legend()
    fig.tight_layout()
    len_png = os.path.join(out_dir, "lengths.png")
    fig.savefig(len_png, dpi=110)
    plt.close(fig)
    return [mix_png, len_png]


def _counts_block(title: str, d: Dict[str, Any]) -> str:
    if not d:
        return ""
    lines = [f"### {title}", "", "| key | count |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" for k, v in sorted(d.items())]
    return "\n".join(lines) + "\n"


def run_report(cfg: Any, force: bool = False) -> Dict[str, Any]:
    work = cfg.work_dir
    prep = read_json(paths.in_work(work, paths.PREPARE_MANIFEST))
    tok = read_json(paths.in_work(work, paths.TOKENIZED_DIR, paths.MANIFEST))
    mrg = read_json(paths.in_work(work, paths.MERGED_DIR, paths.MANIFEST))
    if not (prep or mrg):
        raise DatagenError("report: no prepare or merge manifest in work_dir; run prepare (and merge) first")
    out_dir = paths.in_work(work, paths.REPORT_DIR)
    fp = fingerprint(["report", __version__, [m.get("fingerprint") if m else None for m in (prep, tok, mrg)],
                      cfg.target_mix])
    old = read_json(os.path.join(out_dir, "report.json"))
    if not force and old and old.get("fingerprint") == fp and all(os.path.exists(f) for f in old.get("files", [])):
        return {"stage": "report", "skipped": True, "reason": "manifests unchanged", "files": old["files"]}
    if mrg:
        before, new, after, label = (mrg["existing_per_category"], mrg["new_per_category"],
                                     mrg["merged_per_category"], "merged")
    else:
        before = prep["existing"]["per_category"]
        new = prep["written_per_category"]
        after = dict(before)
        for c, k in new.items():
            after[c] = after.get(c, 0) + k
        label = "projected (prepare)"
    rows = composition(before, new, after, cfg.target_mix)
    os.makedirs(out_dir, exist_ok=True)
    new_lens = _lengths(tok.get("shards", [])) if tok else []
    ex_lens = _lengths(mrg.get("shards", []), origin="existing") if mrg else []
    files = _charts(out_dir, rows, label, new_lens, ex_lens)

    md = [f"# Data-expansion composition ({label})", "", markdown_table(rows), ""]
    if prep:
        md += ["## prepare", "", f"written {prep['written']:,} of target {prep['target_total']:,} "
               f"(shortfall {prep['shortfall']:,}); existing rows {prep['existing']['rows']:,}", "",
               "| source | read | usable | written | unusable (by reason) |", "|---|---:|---:|---:|---|"]
        for name, s in prep["sources"].items():
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(s["unusable"].items())) or "-"
            md.append(f"| {name} | {s['read']:,} | {s['usable']:,} | {prep['written_per_source'].get(name, 0):,} "
                      f"| {reasons} |")
        md.append("")
    if tok:
        pc = tok["prompt_check"]
        md += ["## tokenize", "", f"rows in {tok['rows_in']:,}, out {tok['rows_out']:,}, truncated "
               f"{tok['truncated']:,}, tokens {tok['tokens']:,} (supervised {tok['supervised_tokens']:,}); "
               f"token-exact (the server's ids) {tok.get('token_exact', 0):,}; "
               f"prompt check: {pc['checked']:,} checked, {pc['mismatched']:,} mismatched", "",
               _counts_block("left out (by reason)", tok["skipped"]),
               _counts_block("prompt check mismatches (by reason)", pc.get("reasons") or {}),
               _counts_block("finish_reason", tok["finish_reason"])]
    if mrg:
        md += ["## merge", "", f"rows {mrg['rows']:,}; downsampling {'on' if mrg['allow_downsample'] else 'off'}", "",
               _counts_block("dropped (by category)", mrg["dropped_per_category"])]
    md += ["![mix](mix.png)", "", "![lengths](lengths.png)", ""]
    md_path = os.path.join(out_dir, "composition.md")
    with AtomicWriter(md_path) as fh:
        fh.write("\n".join(md))
    files = [md_path] + files
    write_json(os.path.join(out_dir, "report.json"),
               {"fingerprint": fp, "files": files, "composition": rows, "label": label})
    return {"stage": "report", "skipped": False, "files": files, "composition": rows}
