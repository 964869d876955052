"""Benchmark: the datagen generate client against the common thread-pool client, side by side.

Both talk to the same zero-latency SGLang stand-in (tests/lab/sglang_standin) on
loopback, one after the other, each in its own process, so the numbers compare
client cost only (the stand-in and the client share this machine's cores: read
ratios, not absolute seconds).

- ``openai-pool``: a 128-thread ``ThreadPoolExecutor`` over the ``openai``
  package, writing each answer to a JSONL file (what SpecForge's
  regenerate_train_data.py does; no fsync, no resume, no progress).
- ``datagen``: ``datagen.generate.run_generate`` with everything on: durable
  output (flush + fsync every second), the resume index, the progress file,
  retries armed. Run at two sizes to show RSS does not grow with the input.

Goals (issue 7): datagen >= 8x the pool's requests/s, < 0.5 ms client CPU per
request, peak RSS flat from the small to the large run.

    .venv/bin/python -m tests.bench.bench_datagen_client                 # < 1 min
    .venv/bin/python -m tests.bench.bench_datagen_client --small 10000 --large 200000 --pool 5000
    ... --json results.json --check                                       # exit 1 if a goal is missed
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from harness import StandinProcess

from tests.bench.goals import finish, goal_flags
from tests.support.paths import ROOT

MODEL = "bench-model"
MAX_TOKENS = 32


def make_prompts(path: str, n: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            row = {"id": f"{i:024x}", "source": "bench", "category": "chat",
                   "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                {"role": "user", "content": f"Explain item {i} of the list in two sentences."}]}
            fh.write(json.dumps(row) + "\n")


def _vm_hwm_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def child_openai(url: str, prompts: str, out: str, threads: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=3)
    with open(prompts, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]

    def one(row):
        resp = client.chat.completions.create(model=MODEL, messages=row["messages"], max_tokens=MAX_TOKENS,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        return {"id": row["id"], "messages": row["messages"] + [{"role": "assistant",
                                                                 "content": resp.choices[0].message.content}],
                "finish_reason": resp.choices[0].finish_reason, "usage": resp.usage.model_dump()}

    t0 = time.perf_counter()
    c0 = time.process_time()
    with open(out, "w", encoding="utf-8") as fh, ThreadPoolExecutor(threads) as pool:
        for result in pool.map(one, rows):
            fh.write(json.dumps(result) + "\n")
    return {"requests": len(rows), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def child_datagen(url: str, prompts: str, work: str, concurrency: int) -> dict:
    from datagen.gen.journal import count_lines
    from datagen.generate import run_generate, settings_from_config

    settings = settings_from_config({
        "servers": [url], "model": MODEL, "sampling": {"max_tokens": MAX_TOKENS},
        "generate": {"concurrency": concurrency, "fsync_interval": 1.0, "progress_interval": 1.0, "thinking": False},
    })
    t0 = time.perf_counter()
    c0 = time.process_time()
    result = run_generate(settings, prompts, work)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines = count_lines(os.path.join(work, "generated.jsonl"))  # in blocks: reading it whole would be the peak RSS
    assert lines == result["written"] and result["errors"] == 0, result
    return {"requests": result["written"], "wall_s": wall, "cpu_s": cpu}


def run_child(kind: str, url: str, prompts: str, work: str, arg: int) -> dict:
    cmd = [sys.executable, "-m", "tests.bench.bench_datagen_client", "--child", kind, "--url", url, "--prompts", prompts,
           "--work", work, "--arg", str(arg)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False, cwd=str(ROOT))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{proc.stdout}\n{proc.stderr}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    # whole-process CPU (start-up and imports included) as the kernel counted it
    res["cpu_total_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res["req_s"] = res["requests"] / res["wall_s"]
    res["cpu_ms_per_req"] = 1000.0 * res["cpu_s"] / res["requests"]
    return res


def main() -> int:
    ap = goal_flags(argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0]))
    ap.add_argument("--small", type=int, default=10000, help="prompts in the small datagen run")
    ap.add_argument("--large", type=int, default=60000, help="prompts in the large datagen run (200000 for the full check)")
    ap.add_argument("--pool", type=int, default=3000, help="requests for the openai thread-pool run")
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=128, help="datagen in-flight requests")
    ap.add_argument("--child", choices=("openai", "datagen"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--arg", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        if a.child == "openai":
            res = child_openai(a.url, a.prompts, os.path.join(a.work, "out.jsonl"), a.arg)
        else:
            res = child_datagen(a.url, a.prompts, a.work, a.arg)
        res["peak_rss_mib"] = _vm_hwm_mib()
        print(json.dumps(res))
        return 0

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-datagen-") as tmp, \
            StandinProcess(["--max-natural-tokens", str(MAX_TOKENS + 8)], model=MODEL) as server:
        for name, n in (("openai-pool", a.pool), ("datagen-small", a.small), ("datagen-large", a.large)):
            work = os.path.join(tmp, name)
            os.makedirs(work)
            prompts = os.path.join(work, "prompts.jsonl")
            make_prompts(prompts, n)
            kind, arg = ("openai", a.threads) if name == "openai-pool" else ("datagen", a.concurrency)
            results[name] = run_child(kind, server.url, prompts, work, arg)
            r = results[name]
            print(f"{name:14s} {r['requests']:>7d} req  {r['wall_s']:7.2f} s  {r['req_s']:8.0f} req/s  "
                  f"{r['cpu_ms_per_req']:6.3f} ms CPU/req  peak RSS {r['peak_rss_mib']:6.1f} MiB", flush=True)

    pool, small, large = results["openai-pool"], results["datagen-small"], results["datagen-large"]
    speedup = large["req_s"] / pool["req_s"]
    rss_growth = large["peak_rss_mib"] - small["peak_rss_mib"]
    goals = {
        "speedup_vs_pool >= 8": speedup >= 8.0,
        "cpu_ms_per_req < 0.5": large["cpu_ms_per_req"] < 0.5,
        "rss_flat (growth < 10 MiB)": rss_growth < 10.0,
    }
    summary = {"results": results, "speedup_vs_pool": round(speedup, 2), "rss_growth_mib": round(rss_growth, 1),
               "cpu_ratio_pool_over_datagen": round(pool["cpu_ms_per_req"] / large["cpu_ms_per_req"], 1),
               "cores": os.cpu_count()}
    print(f"\ndatagen vs openai pool: {speedup:.1f}x requests/s, "
          f"{summary['cpu_ratio_pool_over_datagen']}x less CPU per request; "
          f"peak RSS {small['peak_rss_mib']:.1f} MiB at {a.small} -> {large['peak_rss_mib']:.1f} MiB at {a.large} prompts")
    return finish(summary, goals, a.json, a.check)


if __name__ == "__main__":
    sys.exit(main())
