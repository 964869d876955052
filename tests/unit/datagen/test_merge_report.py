"""merge toward the target mix (with and without downsampling) and the report's table and charts."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from datagen.config import load_config
from datagen.merge import run_merge
from datagen.report import composition, markdown_table, run_report
from datagen.tokenize import load_tokenizer, run_tokenize
from datagen.util import DatagenError
from tests.support import datagen_rows as fx

MIX = {"coding": 0.5, "math": 0.25, "general": 0.25}


def existing_tokenized(tmp_path):
    rows = []
    for i in range(80):
        rows.append({"id": f"c{i}", "category": "coding", "input_ids": [1, 2, 3, 4 + i % 7], "loss_mask": [0, 0, 1, 1]})
    for i in range(20):
        rows.append({"id": f"m{i}", "category": "math", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]})
    return fx.write_parquet(tmp_path / "existing.parquet", rows)


def setup(tmp_path, tiny_tokenizer, existing=None, n_new=(10, 30), **top):
    tok = load_tokenizer(tiny_tokenizer)
    sources = fx.six_sources(tmp_path, 1)
    for src in sources:  # their own categories are not in this MIX; only the later stages run here
        src["category"] = "general"
    cfg = load_config(fx.write_config(tmp_path, sources, tokenizer=tiny_tokenizer, target_mix=MIX,
                                      existing_dataset={"path": existing or existing_tokenized(tmp_path)}, **top))
    os.makedirs(cfg.work_dir, exist_ok=True)
    with open(os.path.join(cfg.work_dir, "generated.jsonl"), "w") as fh:
        for cat, n in zip(("math", "general"), n_new):
            for i in range(n):
                fh.write(json.dumps(fx.generated_row(
                    tok, f"{cat}{i}", [{"role": "user", "content": f"Explain idea number {i} of {cat}."}],
                    "It is simple and it is degrees." * (1 + i % 3), category=cat)) + "\n")
    run_tokenize(cfg)
    return cfg, tok


def merged(cfg):
    man = json.load(open(os.path.join(cfg.work_dir, "merged", "manifest.json")))
    rows = []
    for s in man["shards"]:
        rows.extend(pq.read_table(s).to_pylist())
    return man, rows


def test_merge_keeps_everything_without_downsampling(tmp_path, tiny_tokenizer):
    cfg, _tok = setup(tmp_path, tiny_tokenizer)
    res = run_merge(cfg)
    man, rows = merged(cfg)
    assert res["rows"] == len(rows) == 140
    assert man["merged_per_category"] == {"coding": 80, "math": 30, "general": 30}
    assert man["mix_before"] == {"coding": 0.8, "math": 0.2}
    assert {r["origin"] for r in rows} == {"new", "existing"}
    ex = next(r for r in rows if r["id"] == "c3")
    assert ex["input_ids"] == [1, 2, 3, 7] and ex["loss_mask"] == [0, 0, 1, 1]
    assert run_merge(cfg)["skipped"] is True


def test_merge_downsamples_over_target_to_exact_share(tmp_path, tiny_tokenizer):
    cfg, _tok = setup(tmp_path, tiny_tokenizer, merge={"allow_downsample": True})
    run_merge(cfg)
    man, rows = merged(cfg)
    # coding 80 of 140 is over 50%: cut to the size of the rest (60); math and general kept whole
    assert man["merged_per_category"] == {"coding": 60, "math": 30, "general": 30}
    assert man["dropped_per_category"] == {"coding": 20}
    first = sorted(r["id"] for r in rows)
    run_merge(cfg, force=True)
    assert sorted(r["id"] for r in merged(cfg)[1]) == first  # the same rows are cut on a rerun


def test_merge_tokenizes_existing_rows_with_messages(tmp_path, tiny_tokenizer):
    ex = fx.write_jsonl(tmp_path / "existing.jsonl", [
        {"category": "coding", "conversations": [{"from": "human", "value": f"Write python function {i}"},
                                                 {"from": "gpt", "value": "def f(): return x squared"}]}
        for i in range(5)])
    cfg, tok = setup(tmp_path, tiny_tokenizer, existing=ex, n_new=(2, 2))
    run_merge(cfg)
    _man, rows = merged(cfg)
    olds = [r for r in rows if r["origin"] == "existing"]
    assert len(olds) == 5
    assert tok.decode([t for t, m in zip(olds[0]["input_ids"], olds[0]["loss_mask"]) if m]) == \
        "def f(): return x squared<|im_end|>\n"


def test_merge_needs_tokenize_first(tmp_path, tiny_tokenizer):
    cfg, _tok = setup(tmp_path, tiny_tokenizer)
    import shutil

    shutil.rmtree(os.path.join(cfg.work_dir, "tokenized"))
    with pytest.raises(DatagenError, match="run `python -m datagen tokenize` first"):
        run_merge(cfg)


def test_report_table_and_charts(tmp_path, tiny_tokenizer):
    cfg, _tok = setup(tmp_path, tiny_tokenizer, merge={"allow_downsample": True})
    run_merge(cfg)
    res = run_report(cfg)
    md, mix, lens = res["files"]
    text = open(md).read()
    assert "| coding | 80 | 80.0% | 0 | 60 | 50.0% | 50.0% | +0.0 |" in text
    assert "| math | 20 | 20.0% | 10 | 30 | 25.0% | 25.0% | +0.0 |" in text
    for png in (mix, lens):
        with open(png, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert run_report(cfg)["skipped"] is True


def test_composition_rows_and_gap():
    rows = composition({"coding": 77, "math": 23}, {"math": 20}, {"coding": 77, "math": 43}, {"coding": 0.5, "math": 0.5})
    assert rows[0]["gap_pp"] == pytest.approx(14.17, abs=0.01)
    assert "| **total** | 100 | | 20 | 120 | | | |" in markdown_table(rows)
