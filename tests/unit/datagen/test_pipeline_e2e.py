"""The whole pipeline through the CLI, as the role runs it: prepare -> generate (real stand-in server on
loopback, with the tokenizer) -> status -> tokenize -> merge -> report. Every prepared id comes out exactly
once; tool and agent rows survive every stage; every tokenized row is exactly the server's ids."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from harness import StandinProcess

from tests.support import datagen_rows as fx
from tests.support.datagen_rows import run_cli as datagen

pytestmark = pytest.mark.processes


@pytest.fixture
def server(tiny_tokenizer):
    s = StandinProcess(["--tokenizer", tiny_tokenizer], model="target-model").start()
    yield s
    s.stop()


def run_ok(*args):
    p = datagen(*args, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_pipeline_end_to_end(tmp_path, tiny_tokenizer, server):
    existing = fx.write_jsonl(tmp_path / "existing.jsonl", [
        {"id": f"e{i}", "category": "coding",
         "messages": [{"role": "user", "content": f"Write python function {i}"},
                      {"role": "assistant", "content": "def f(): return x"}]}
        for i in range(40)])
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, 8), servers=[server.url], tokenizer=tiny_tokenizer,
                          existing_dataset={"path": existing}, target_total=30, max_length=4096,
                          generate={"concurrency": 4}, tokenize={"prompt_check": "drop"})
    prep = run_ok("prepare", "--config", cfg)
    assert prep["written"] == 30
    work = tmp_path / "work"
    ids = [json.loads(line)["id"] for line in open(work / "prompts.jsonl")]

    run_ok("generate", "--config", cfg)
    status = run_ok("status", "--config", cfg)
    assert status["done"] == 30
    gen_ids = [json.loads(line)["id"] for line in open(work / "generated.jsonl")]
    assert sorted(gen_ids) == sorted(ids)

    tok = run_ok("tokenize", "--config", cfg)
    man = json.load(open(work / "tokenized" / "manifest.json"))
    # the local rendering (SGLang's tool normalisation included) gives the server's prompt ids on every row:
    # with prompt_check drop, not one row (tool and agent rows included) is left out
    assert man["prompt_check"]["checked"] == man["prompt_check"]["matched"] == 30
    assert man["skipped"] == {} and man["token_exact"] == 30 and man["truncated"] == 0
    rows = [r for s in man["shards"] for r in pq.read_table(s).to_pylist()]
    assert tok["rows_out"] == len(rows) == 30
    assert sorted(r["id"] for r in rows) == sorted(ids)
    generated = {g["id"]: g for g in map(json.loads, open(work / "generated.jsonl"))}
    for r in rows:  # 100% of rows: the training ids are the server's, the generated ones all supervised
        g = generated[r["id"]]
        assert r["input_ids"] == g["prompt_token_ids"] + g["response_token_ids"], r["id"]
        assert r["loss_mask"][len(g["prompt_token_ids"]):] == [1] * len(g["response_token_ids"]), r["id"]
    cats = [r["category"] for r in rows]
    assert cats.count("tool_use") >= 2 and cats.count("agent") >= 2
    # the tool rows' tools and earlier tool calls reached the server's prompt (and so the training row)
    assert all(generated[r["id"]].get("tools") for r in rows if r["category"] == "tool_use")
    assert all(sum(r["loss_mask"]) >= 2 for r in rows)

    merged = run_ok("merge", "--config", cfg)
    assert merged["rows"] == len(rows) + 40
    assert merged["mix_after"]["coding"] < merged["mix_before"]["coding"]
    rep = run_ok("report", "--config", cfg)
    assert any(f.endswith("composition.md") for f in rep["files"])
    assert "token-exact (the server's ids) 30; prompt check: 30 checked, 0 mismatched" in \
        open(work / "report" / "composition.md").read()
    # a second pass over every stage does nothing
    for stage in ("prepare", "tokenize", "merge", "report"):
        assert run_ok(stage, "--config", cfg)["skipped"] is True
