"""prepare end to end on local files in the real schemas: dedup, reasons, quotas, determinism, idempotence."""

from __future__ import annotations

import json
import os

import pytest

from datagen.config import load_config
from datagen.prepare import run_prepare
from datagen.util import DatagenError
from tests.support import datagen_rows as fx


def existing_rows():
    rows = []
    for i in range(80):
        rows.append({"id": f"e{i}", "category": "coding", "messages": [
            {"role": "user", "content": f"Existing coding task {i}"}, {"role": "assistant", "content": "def x(): ..."}]})
    for i in range(20):
        rows.append({"id": f"m{i}", "category": "math", "messages": [
            {"role": "user", "content": f"Existing math task {i}"}, {"role": "assistant", "content": "4"}]})
    # the same prompt as metamath_row(0), spaced differently: must count as duplicate_existing
    rows.append({"id": "dup", "category": "math", "messages": [
        {"role": "user", "content": "What  is 0 plus\n0?"}, {"role": "assistant", "content": "0"}]})
    return rows


def setup(tmp_path, n=20, **top):
    sources = fx.six_sources(tmp_path, n)
    # malformed rows in the real files: a broken line, a row without the field, a non-English row
    with open(sources[2]["path"], "a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"answer": "no query"}) + "\n")
        # cross-source duplicate: a webinstruct question again in codefeedback
        fh.write(json.dumps({"query": fx.webinstruct_row(3)["question"], "answer": "x"}) + "\n")
    fx.write_jsonl(tmp_path / "src" / "ii2.jsonl", [fx.infinity_row(99, lang="zh-cn")])
    sources[0]["path"] = [sources[0]["path"], str(tmp_path / "src" / "ii2.jsonl")]
    top.setdefault("existing_dataset", {"path": fx.write_jsonl(tmp_path / "existing.jsonl", existing_rows())})
    return load_config(fx.write_config(tmp_path, sources, **top))


def read_prompts(cfg):
    with open(os.path.join(cfg.work_dir, "prompts.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def manifest(cfg):
    with open(os.path.join(cfg.work_dir, "prepare.manifest.json")) as fh:
        return json.load(fh)


def test_prepare_counts_every_row_and_balances(tmp_path):
    cfg = setup(tmp_path)
    res = run_prepare(cfg)
    rows = read_prompts(cfg)
    man = manifest(cfg)
    assert res["written"] == len(rows) == 60 and man["shortfall"] == 0
    # every row read is either usable or counted under a reason
    for name, s in man["sources"].items():
        assert s["read"] == s["usable"] + sum(s["unusable"].values()), name
    assert man["sources"]["codefeedback"]["unusable"] == {"malformed_json": 1, "missing_query": 1, "duplicate": 1}
    assert man["sources"]["infinity"]["unusable"] == {"language_filtered": 1}
    assert man["sources"]["metamath"]["unusable"] == {"duplicate_existing": 1}
    # ids unique, schema exact
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert set(r) <= {"id", "source", "category", "messages", "tools"}
        assert r["messages"][-1]["role"] in ("user", "tool")
    # existing is 79% coding (80 of 101): coding is over target, so no coding prompts are planned
    assert man["planned_per_category"]["coding"] == 0
    assert "coding" not in man["written_per_category"]
    # tool and agent rows survive with their tools and tool turns
    hermes = [r for r in rows if r["source"] == "hermes"]
    assert hermes and all(r["tools"][0]["function"]["name"] == "get_weather" for r in hermes)
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant", "tool"] for r in hermes)
    assert any(r["category"] == "agent" for r in rows)
    # the projected mix is nearer the target than the existing one for coding
    assert man["mix_after_projected"]["coding"] < man["mix_before"]["coding"]


def test_prepare_is_deterministic_and_seeded(tmp_path):
    cfg = setup(tmp_path)
    run_prepare(cfg)
    first = open(os.path.join(cfg.work_dir, "prompts.jsonl"), "rb").read()
    run_prepare(cfg, force=True)
    assert open(os.path.join(cfg.work_dir, "prompts.jsonl"), "rb").read() == first
    cfg.seed = 8
    run_prepare(cfg, force=True)
    assert open(os.path.join(cfg.work_dir, "prompts.jsonl"), "rb").read() != first


def test_prepare_skips_when_unchanged_and_redoes_on_change(tmp_path):
    cfg = setup(tmp_path)
    assert run_prepare(cfg)["skipped"] is False
    assert run_prepare(cfg)["skipped"] is True
    with open(cfg.sources[3].files[0], "ab"):
        pass
    os.utime(cfg.sources[3].files[0], ns=(1, 1))  # a changed input file
    assert run_prepare(cfg)["skipped"] is False
    cfg.target_total = 30
    res = run_prepare(cfg)
    assert res["skipped"] is False and res["written"] == 30


def test_manual_count_overrides_plan(tmp_path):
    sources = fx.six_sources(tmp_path, 20)
    sources[4]["count"] = 17
    cfg = load_config(fx.write_config(tmp_path, sources))
    run_prepare(cfg)
    rows = read_prompts(cfg)
    assert sum(r["source"] == "hermes" for r in rows) == 17
    assert len(rows) == 60


def test_shortfall_reported_when_sources_run_dry(tmp_path):
    cfg = load_config(fx.write_config(tmp_path, fx.six_sources(tmp_path, 3), target_total=1000))
    res = run_prepare(cfg)
    assert res["written"] == 18 and res["shortfall"] == 982


def test_unreadable_source_at_run_time_names_the_source(tmp_path):
    sources = fx.six_sources(tmp_path, 3)
    with open(sources[3]["path"], "wb") as fh:
        fh.write(b"PAR1 this is not parquet")
    cfg = load_config(fx.write_config(tmp_path, sources))
    with pytest.raises(DatagenError, match=r"sources\[3\]\.path: cannot read Parquet file"):
        run_prepare(cfg)
    assert os.listdir(cfg.work_dir) == []  # no spool, no half-written prompts


def test_hub_source_without_datasets_package_is_a_clear_error(tmp_path):
    try:
        import datasets  # noqa: F401

        pytest.skip("the datasets package is installed here")
    except ImportError:
        pass
    sources = [{"adapter": "metamath", "hub": {"repo": "meta-math/MetaMathQA", "revision": "a" * 40}}]
    cfg = load_config(fx.write_config(tmp_path, sources, target_mix={"math": 1.0}))
    with pytest.raises(DatagenError, match=r"sources\[0\]\.hub: reading from the Hub needs the `datasets` package"):
        run_prepare(cfg)
