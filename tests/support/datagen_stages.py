"""The datagen stages as the fault suite kills and checks them: where each stage's kill lands, whether a
stage is done, and the dataset's checks after a restart. One implementation for both sides: the host
tests (tests/faults/test_datagen_faults.py) import it; the lab tests run this very file inside CT200
(``python -c SOURCE check WORK ROWS``, the pipeline venv's python: pyarrow is there), so it uses only the
standard library and pyarrow, and imports nothing of tests/.

    python datagen_stages.py kill STAGE WORK ROWS TIMEOUT UNIT   start UNIT (--no-block), then
        ``systemctl kill -s SIGKILL UNIT`` (the whole cgroup) the moment STAGE's kill point is reached
    python datagen_stages.py check WORK ROWS                     the dataset's problems, as JSON
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

PIPELINE = ("prepare", "generate", "tokenize", "merge", "report")


def lines(path: str) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def kill_point_reached(stage: str, work: str, rows: int) -> bool:
    """True once STAGE has visibly started writing its output (the moment its kill lands): prepare's spool,
    a third of the rows generated, tokenize's and merge's build directories, the report directory."""
    if stage == "prepare":
        return os.path.exists(os.path.join(work, "prepare.spool.jsonl"))
    if stage == "generate":
        return lines(os.path.join(work, "generated.jsonl")) >= rows // 3
    if stage == "tokenize":
        return bool(glob.glob(os.path.join(work, "tokenized.tmp-*")))
    if stage == "merge":
        return bool(glob.glob(os.path.join(work, "merged.tmp-*")))
    return os.path.isdir(os.path.join(work, "report"))


def done_output(stage: str, work: str) -> str:
    """The file whose presence says STAGE finished (generate: its rows file, finished when it holds every row)."""
    return os.path.join(work, {"prepare": "prepare.manifest.json", "generate": "generated.jsonl",
                               "tokenize": "tokenized/manifest.json", "merge": "merged/manifest.json",
                               "report": "report/report.json"}[stage])


def stage_done(stage: str, work: str, rows: int) -> bool:
    path = done_output(stage, work)
    if stage == "generate":
        return lines(path) >= rows
    return os.path.exists(path)


def leftovers(work: str) -> List[str]:
    """What a killed stage may leave behind and the restart must clean up (build directories, temp files)."""
    return sorted(glob.glob(os.path.join(work, "*.tmp-*")) + glob.glob(os.path.join(work, "*.old-*"))
                  + glob.glob(os.path.join(work, "*.tmp")) + glob.glob(os.path.join(work, "prepare.spool.jsonl")))


def dataset_problems(work: str, rows: int) -> Tuple[List[str], int]:
    """(problems, ids lost): every prepared id exactly once in generated.jsonl and in the tokenized and merged
    shards, every shard readable (a truncated Parquet file has no footer) and listed, the report there,
    nothing of a killed run left."""
    import pyarrow.parquet as pq

    problems: List[str] = []
    with open(os.path.join(work, "prompts.jsonl"), encoding="utf-8") as fh:
        ids = [json.loads(line)["id"] for line in fh]
    if not len(ids) == len(set(ids)) == rows:
        problems.append(f"prompts.jsonl: {len(ids)} ids, {len(set(ids))} distinct, {rows} wanted")
    with open(os.path.join(work, "generated.jsonl"), encoding="utf-8") as fh:
        generated = [json.loads(line)["id"] for line in fh]
    if sorted(generated) != sorted(ids):
        problems.append(f"generated.jsonl: {len(generated)} rows, {len(set(generated))} distinct, "
                        f"{len(set(ids) - set(generated))} ids missing")
    lost = 0
    for sub in ("tokenized", "merged"):
        man = json.load(open(os.path.join(work, sub, "manifest.json"), encoding="utf-8"))
        got: List[str] = []
        for shard in man["shards"]:
            try:
                table = pq.read_table(shard)
            except Exception as exc:  # noqa: BLE001 - any unreadable shard is the finding
                problems.append(f"{sub}: shard {shard} does not read: {exc}")
                continue
            got += table.column("id").to_pylist() if sub == "tokenized" else [
                r["id"] for r in table.select(["id", "origin"]).to_pylist() if r["origin"] == "new"]
        if len(got) != len(set(got)):
            problems.append(f"{sub}: an id appears twice ({len(got) - len(set(got))} duplicates)")
        lost += len(set(ids) - set(got))
        if sorted(got) != sorted(ids):
            problems.append(f"{sub}: {len(set(ids) - set(got))} ids lost, {len(set(got) - set(ids))} extra")
        stray = sorted(set(glob.glob(os.path.join(work, sub, "*.parquet"))) - set(man["shards"]))
        if stray:
            problems.append(f"{sub}: shards not in the manifest: {stray}")
    if not os.path.exists(os.path.join(work, "report", "report.json")):
        problems.append("report/report.json missing")
    left = leftovers(work)
    if left:
        problems.append(f"left behind by the killed run: {left}")
    return problems, lost


def kill_unit_at(stage: str, work: str, rows: int, timeout: float, unit: str) -> Dict[str, object]:
    """Start UNIT, then SIGKILL its whole cgroup through systemd the moment STAGE's kill point is reached
    (bounded by TIMEOUT); what landed, and whether the stage was still unfinished right after the kill."""
    subprocess.run(["systemctl", "start", "--no-block", unit], check=True)
    deadline = time.monotonic() + timeout
    landed = False
    while time.monotonic() < deadline:
        if kill_point_reached(stage, work, rows):
            subprocess.run(["systemctl", "kill", "-s", "SIGKILL", unit], check=True)
            landed = True
            break
        time.sleep(0.0005)
    killed_at = time.time()
    time.sleep(0.5)  # the cgroup empties; what the killed stage left is what the restart finds
    unfinished = not stage_done(stage, work, rows)
    return {"landed": landed, "unfinished": unfinished, "killed_at": killed_at, "left": leftovers(work)}


def main(argv: List[str]) -> int:
    if argv[0] == "kill":
        stage, work, rows, timeout, unit = argv[1:6]
        print(json.dumps(kill_unit_at(stage, work, int(rows), float(timeout), unit)))
        return 0
    if argv[0] == "check":
        problems, lost = dataset_problems(argv[1], int(argv[2]))
        print(json.dumps({"problems": problems, "lost": lost}))
        return 0
    print(f"unknown command {argv[0]!r}: kill or check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
