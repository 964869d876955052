"""The datagen pipeline in CT200 as its lab tests watch it (straight through ``lxc-attach``, not the code under test)."""

from __future__ import annotations

import json
import re
import time
from typing import List, Tuple

import yaml

from tests.support.lab import DATAGEN_HOST, MAIN_CT, trainer
from tests.support.net import http, parse_metrics
from tests.support.paths import LAB_INVENTORY, TESTS
from tests.support.playbook import PlaybookRun, run_playbook
from tests.support.ssh import attach

WORK = "/srv/datagen/work"
# The role's converge play (the datagen half alone) and the lab inventory's datagen settings.
CONVERGE = TESTS / "integration" / "sglang_datagen" / "converge.yml"
# task names of role sglang_datagen that tests look for in a play's output
INSTALL_TASK = "Install SGLang, sglang-router and the pipeline's requirements in one resolution"
GATE_TASK = "Wait until every worker is ready and the router routes to all of them"
LAB_VARS_FILE = LAB_INVENTORY / "group_vars" / "training_containers.yml"
# the single-node lab's router and its eight stand-in workers (CT200 shares this machine's loopback)
ROUTER = f"http://{DATAGEN_HOST}:30000"
WORKERS = [f"http://{DATAGEN_HOST}:{31000 + i}" for i in range(8)]

# inside CT200: the tokenized rows against the server's ids in generated.jsonl (token-exact rows)
TOKEN_EXACT_PY = r"""
import json, sys
import pyarrow.parquet as pq
work = sys.argv[1]
gen = {r["id"]: r for r in map(json.loads, open(work + "/generated.jsonl"))}
man = json.load(open(work + "/tokenized/manifest.json"))
rows = [r for s in man["shards"] for r in pq.read_table(s, columns=["id", "input_ids", "loss_mask"]).to_pylist()]
def exact(r):
    p, o = gen[r["id"]]["prompt_token_ids"], gen[r["id"]]["response_token_ids"]
    return r["input_ids"] == p + o and r["loss_mask"][len(p):] == [1] * len(o)
print(json.dumps({"rows": len(rows), "distinct": len({r["id"] for r in rows}), "exact": sum(map(exact, rows)),
                  "with_ids": sum(bool(g.get("prompt_token_ids") and g.get("response_token_ids")) for g in gen.values()),
                  "tool": sum(bool(gen[r["id"]].get("tools")) for r in rows),
                  "agent": sum(any(m["role"] == "tool" for m in gen[r["id"]]["messages"]) for r in rows)}))
"""


def reset_pipeline(status: dict, vmid: str = MAIN_CT) -> None:
    """A pipeline that must run again in container VMID: no finished marker, no generated rows.

    A pipeline still running (an earlier test's, or one the resume timer started at boot) is stopped
    first, so it cannot write into the files removed here."""
    attach(status, "systemctl", "stop", "datagen-pipeline.timer", "datagen-pipeline.service", vmid=vmid, check=False)
    attach(status, "rm", "-rf", f"{WORK}/pipeline.done", f"{WORK}/pipeline.started", f"{WORK}/generated.jsonl",
           f"{WORK}/generate.progress.json", f"{WORK}/generate.errors.jsonl", f"{WORK}/tokenized", f"{WORK}/merged",
           f"{WORK}/report", vmid=vmid)


def wait_pipeline_finished(status: dict, timeout: float) -> None:
    """The pipeline runs on after the play: wait (bounded) until its unit has finished all its stages."""
    deadline = time.monotonic() + timeout
    while True:
        state = attach(status, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip()
        marker = attach(status, "test", "-s", f"{WORK}/pipeline.done", check=False).returncode == 0
        if state in ("inactive", "failed") and marker:
            return
        assert state != "failed", attach(status, "journalctl", "-u", "datagen-pipeline", "--no-pager",
                                         check=False).stdout
        assert time.monotonic() < deadline, f"pipeline still {state}: " + attach(
            status, "journalctl", "-u", "datagen-pipeline", "--no-pager", "-n", "40", check=False).stdout
        time.sleep(1)


def generated_rows(status: dict) -> List[dict]:
    """The rows of generated.jsonl so far."""
    return [json.loads(line) for line in attach(status, "cat", f"{WORK}/generated.jsonl", check=False).stdout.splitlines()]


def prepared_ids(status: dict) -> set:
    """The ids prepare wrote to prompts.jsonl in CT200 (every one must come back generated)."""
    return {json.loads(line)["id"] for line in attach(status, "cat", f"{WORK}/prompts.jsonl").stdout.splitlines()}


def lab_worker_args(*extra: str) -> str:
    """Extra vars: the lab inventory's worker arguments, then ``extra`` (the stand-in's argparse: the last wins)."""
    args = yaml.safe_load(LAB_VARS_FILE.read_text())["sglang_datagen_worker_extra_args"]
    return json.dumps({"sglang_datagen_worker_extra_args": [*args, *extra]})


def free_gpus() -> None:
    """CT200's GPUs free, as the datagen half alone requires (it refuses to serve beside a job that holds them,
    the role's tasks/gpus_free.yml): the lab trainer stopped, nothing started in its place. A module that calls
    it uses the ``trainer_back_afterwards`` fixture (tests/conftest.py), so the suites after it find the trainer
    running."""
    trainer("none")


def play_result(*extra: str) -> PlaybookRun:
    """The role's converge play (the datagen half alone, on freed GPUs: :func:`free_gpus`) on the lab inventory,
    EXTRA ansible-playbook args."""
    free_gpus()
    return run_playbook(CONVERGE, LAB_INVENTORY, args=extra, timeout=800)


def play(*extra: str) -> Tuple[str, int]:
    """The converge play, asserted ok; (its stdout, the number of changed tasks on ct200)."""
    done = play_result(*extra)
    recap = re.search(r"ct200\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", done.stdout)
    # the failing task's first lines, then the tail: a long loop result can push the reason out of the tail
    fatal = [line[:400] for line in done.stdout.splitlines() if line.startswith(("fatal:", "failed:"))
             or "UNREACHABLE!" in line][:5]
    assert done.rc == 0 and recap, "\n".join(fatal) + "\n" + done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout, int(recap.group(2))


def server_metrics() -> dict:
    """Every worker's /metrics as {url: {name: value}} ({} for one that does not answer 200); the lab's
    containers share this machine's network, so CT200's loopback is this one's."""
    replies = {url: http(url + "/metrics", timeout=10) for url in WORKERS}
    return {url: parse_metrics(reply.text) if reply.status == 200 else {} for url, reply in replies.items()}


def router_listed() -> list:
    """The real router's GET /workers list (the single-node lab's router asks no API key)."""
    return http(ROUTER + "/workers", timeout=10).expect(200).json()["workers"]


def router_workers() -> dict:
    """{url: healthy} from the real router's worker list (GET /workers)."""
    return {w["url"]: w["is_healthy"] for w in router_listed()}
