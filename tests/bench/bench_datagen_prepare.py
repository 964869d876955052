"""Benchmark: datagen prepare and tokenize, rows/s and peak RSS, each against a baseline run side by side.

    .venv/bin/python -m tests.bench.bench_datagen_prepare              # 20K rows, under a minute
    .venv/bin/python -m tests.bench.bench_datagen_prepare --rows 1000000

Synthetic rows in the six real source schemas (3% cross-source duplicates, 1% malformed lines)
plus an existing set of rows/4 (77% coding). Each variant runs in its own process so its peak
RSS is its own.

- prepare vs baseline: the common in-memory approach (load every normalised row into a list,
  dedup with a dict keyed by the full prompt text, random.sample per category). Same adapters,
  same output size.
- tokenize vs baseline: the common per-row approach, ``apply_chat_template(tokenize=True)`` on the
  full conversation and on each assistant turn's prefixes, mask from the prefix lengths (it writes
  no Parquet, which favours it). Tokenizer: the tests' tiny byte-level BPE with a ChatML template;
  a real 150K-vocab tokenizer is slower per token, so read the ratio, not the absolute rows/s.
Compare ratios, not seconds: the build machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from tests.support.paths import DATAGEN_FILES

FILES = str(DATAGEN_FILES)

WORDS = ("data model train token python function value list graph prove number matrix agent tool "
         "weather city file rename explain compute derive answer question reason step plan").split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _i in range(n)) + f" {rng.getrandbits(48):x}"


def make_inputs(d: str, rows: int, seed: int = 1) -> dict:
    from tests.support import datagen_rows as fx

    rng = random.Random(seed)
    per = rows // 6
    shared = [text(rng, 40) for _i in range(max(1, per * 3 // 100))]  # prompts repeated across sources
    os.makedirs(d, exist_ok=True)

    def q(i: int) -> str:
        return shared[i % len(shared)] if i % 33 == 0 else text(rng, rng.randint(30, 120))

    specs = []
    builders = {
        "infinity_instruct": lambda i: fx.infinity_row(i, text=q(i)),
        "webinstruct": lambda i: dict(fx.webinstruct_row(i), question=q(i)),
        "codefeedback": lambda i: dict(fx.codefeedback_row(i), query=q(i)),
        "metamath": lambda i: dict(fx.metamath_row(i), query=q(i)),
        "hermes_fc": fx.hermes_row,
        "orca_agentinstruct": lambda i: {"messages": json.dumps([{"role": "user", "content": q(i)},
                                                                 {"role": "assistant", "content": "ok"}])},
    }
    for name, build in builders.items():
        path = os.path.join(d, f"{name}.jsonl")
        with open(path, "w") as fh:
            for i in range(per):
                fh.write(json.dumps(build(i)) + "\n")
                if i % 100 == 99:
                    fh.write("{malformed\n")
        specs.append({"adapter": name, "path": path})
    ex = os.path.join(d, "existing.jsonl")
    with open(ex, "w") as fh:
        for i in range(rows // 4):
            cat = "coding" if i % 100 < 77 else ("math" if i % 2 else "general")
            fh.write(json.dumps({"category": cat, "messages": [{"role": "user", "content": text(rng, 40)},
                                                               {"role": "assistant", "content": "x"}]}) + "\n")
    return {"sources": specs, "existing": ex}


CHILD_PREPARE = r"""
import json, sys, time, resource
from datagen.config import load_config
from datagen.prepare import run_prepare
cfg = load_config({cfg!r})
t = time.monotonic()
res = run_prepare(cfg, force=True)
wall = time.monotonic() - t
man = json.load(open(res["manifest"]))
read = sum(s["read"] for s in man["sources"].values()) + man["existing"]["rows"]
print(json.dumps({{"rows": read, "written": res["written"], "wall_s": wall,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

CHILD_BASELINE = r"""
import json, random, sys, time, resource
from datagen.config import load_config
from datagen.prompts import Unusable, to_prompt
from datagen.sources import adapt, iter_source
from datagen.existing import iter_existing
from datagen.util import canonical_prompt
cfg = load_config({cfg!r})
t = time.monotonic()
existing = {{}}
n = 0
for row, cat, msgs in iter_existing(cfg.existing):
    n += 1
    existing[canonical_prompt(to_prompt(msgs))] = cat
rows, seen = [], {{}}
for i, spec in enumerate(cfg.sources):
    for raw in iter_source(spec, i):
        n += 1
        try:
            msgs, tools, cat = adapt(spec, raw)
        except Unusable:
            continue
        key = canonical_prompt(msgs, tools)
        if key in existing or key in seen:
            continue
        seen[key] = True
        rows.append({{"source": spec.name, "category": cat, "messages": msgs, "tools": tools}})
by_cat = {{}}
for r in rows:
    by_cat.setdefault(r["category"], []).append(r)
rng = random.Random(cfg.seed)
share = cfg.target_total // max(1, len(by_cat))
out = [r for c in sorted(by_cat) for r in rng.sample(by_cat[c], min(share, len(by_cat[c])))]
with open({out!r}, "w") as fh:
    for r in out:
        fh.write(json.dumps(r) + "\n")
wall = time.monotonic() - t
print(json.dumps({{"rows": n, "written": len(out), "wall_s": wall,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

CHILD_TOKENIZE = r"""
import json, sys, time, resource
from datagen.config import load_config
from datagen.tokenize import run_tokenize
cfg = load_config({cfg!r}, check_inputs=False)
cfg.tokenize.batch_size = {batch}
t = time.monotonic()
res = run_tokenize(cfg, force=True)
wall = time.monotonic() - t
print(json.dumps({{"rows": res["rows_in"], "written": res["rows_out"], "wall_s": wall,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


CHILD_TOKENIZE_BASELINE = r"""
import json, sys, time, resource
from datagen.config import load_config
from datagen.tokenize import load_tokenizer
from datagen.util import iter_jsonl
cfg = load_config({cfg!r}, check_inputs=False)
tok = load_tokenizer(cfg.tokenizer)
kw = dict(tokenize=True, return_dict=False, enable_thinking=False)
t = time.monotonic()
n = out = 0
for _, row in iter_jsonl({src!r}):
    n += 1
    msgs, tools = row["messages"], row.get("tools")
    ids = tok.apply_chat_template(msgs, tools=tools, **kw)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a = len(tok.apply_chat_template(msgs[:i], tools=tools, add_generation_prompt=True, **kw)) if i else 0
        b = len(tok.apply_chat_template(msgs[: i + 1], tools=tools, **kw))
        mask[a:b] = [1] * (b - a)
    ids, mask = ids[:cfg.max_length], mask[:cfg.max_length]
    out += any(x and y for x, y in zip(mask, mask[1:]))
wall = time.monotonic() - t
print(json.dumps({{"rows": n, "written": out, "wall_s": wall,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def child(code: str) -> dict:
    # the child imports only the datagen package (no test plumbing in its peak RSS)
    env = dict(os.environ, PYTHONPATH=FILES)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, check=False, env=env)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000, help="source rows in all (default 20000; try 1000000)")
    ap.add_argument("--tokenize-rows", type=int, default=None, help="generated rows to tokenize (default rows/3)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    import yaml

    from tests.support import datagen_rows as fx

    d = args.workdir or tempfile.mkdtemp(prefix="bench-datagen-")
    t = time.monotonic()
    inputs = make_inputs(os.path.join(d, "src"), args.rows)
    print(f"synthetic inputs: {args.rows:,} source rows + {args.rows // 4:,} existing in {time.monotonic() - t:.1f}s")
    tok_dir = fx.build_tiny_tokenizer(os.path.join(d, "tok"))
    n_tok = args.tokenize_rows or args.rows // 3
    cfg = {
        "work_dir": os.path.join(d, "work"), "model": "m", "tokenizer": tok_dir,
        "existing_dataset": {"path": inputs["existing"]}, "target_total": n_tok,
        "target_mix": {"coding": 0.45, "math": 0.15, "science": 0.1, "general": 0.15, "tool_use": 0.075,
                       "agent": 0.075},
        "sources": inputs["sources"], "seed": 1, "max_length": 2048,
    }
    cfg_path = os.path.join(d, "datagen.yml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)

    results = {}
    results["prepare"] = child(CHILD_PREPARE.format(cfg=cfg_path))
    results["prepare_baseline"] = child(CHILD_BASELINE.format(cfg=cfg_path,
                                                              out=os.path.join(d, "baseline.jsonl")))
    # generated.jsonl from the prompts, as generate would write it
    rng = random.Random(2)
    with open(os.path.join(d, "work", "prompts.jsonl")) as src, \
            open(os.path.join(d, "work", "generated.jsonl"), "w") as dst:
        for line in src:
            row = json.loads(line)
            row["messages"].append({"role": "assistant", "content": text(rng, rng.randint(60, 200))})
            row.update(finish_reason="stop", usage={"completion_tokens": 1})
            dst.write(json.dumps(row) + "\n")
    results["tokenize"] = child(CHILD_TOKENIZE.format(cfg=cfg_path, batch=256))
    results["tokenize_baseline"] = child(CHILD_TOKENIZE_BASELINE.format(
        cfg=cfg_path, src=os.path.join(d, "work", "generated.jsonl")))

    print(f"\n{'variant':<20}{'rows':>10}{'rows/s':>12}{'peak RSS MiB':>14}")
    for name, r in results.items():
        r["rows_per_s"] = r["rows"] / r["wall_s"] if r["wall_s"] else 0.0
        print(f"{name:<20}{r['rows']:>10,}{r['rows_per_s']:>12,.0f}{r['rss_mib']:>14.0f}")
    p, b = results["prepare"], results["prepare_baseline"]
    tk, tb = results["tokenize"], results["tokenize_baseline"]
    ratios = {
        "prepare_speed_vs_baseline": round(p["rows_per_s"] / b["rows_per_s"], 2),
        "prepare_rss_vs_baseline": round(p["rss_mib"] / b["rss_mib"], 2),
        "tokenize_speed_vs_baseline": round(tk["rows_per_s"] / tb["rows_per_s"], 2),
    }
    print("\nratios:", json.dumps(ratios))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": args.rows, "results": results, "ratios": ratios}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
