"""Faults in the data half, on real processes: the datagen stages as the pipeline unit runs them
(``python -m datagen STAGE --config ...``, one after the other), the SGLang stand-in on loopback,
and a real size-limited filesystem (tmpfs) as ``work_dir``.

- Each stage (prepare, generate, tokenize, merge, report) SIGKILLed while it works (the kill
  lands when the stage's own in-progress output appears), then the whole unit restarted from the
  top as systemd restarts a oneshot unit: every prepared id exactly once in the tokenized and
  merged shards, every shard readable with the row count its manifest says, no build directory
  of the killed run left behind.
- ``work_dir`` filling up during generate, tokenize and merge: exit status 1 and one line naming
  the path and the space needed (no traceback), nothing half-written taken as done, and the run
  completes once the space is freed.

The lab-side faults of the data half (workers and router killed under systemd, CT200 rebooted
mid-pipeline) are in ``test_datagen_lab_faults.py``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest
from harness import StandinProcess

from datagen import space
from tests.support import datagen_rows as fx
from tests.support import datagen_stages as stages
from tests.support import faults
from tests.support.faults import Fault
from tests.support.paths import DATAGEN_FILES

FILES = str(DATAGEN_FILES)

PIPELINE = stages.PIPELINE
ROWS = 1200  # enough that every stage runs long enough (tens of ms at least) to be killed mid-way
KILL_WAIT_S = 60  # bound on waiting for a stage to reach its kill point


def _env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=FILES)


def datagen(stage: str, cfg: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datagen", stage, "--config", cfg], capture_output=True,
                          text=True, env=_env(), timeout=timeout, cwd="/", check=False)


def run_unit(cfg: str) -> List[dict]:
    """The pipeline unit's ExecStart lines, in order, as systemd runs a oneshot unit (stop at the first failure)."""
    out = []
    for stage in PIPELINE:
        p = datagen(stage, cfg)
        assert p.returncode == 0, f"{stage}: {p.stderr[-3000:]}"
        out.append(json.loads(p.stdout))
    return out


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    tok = fx.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    # a little latency so generate is killed with rows still in flight
    s = StandinProcess(["--tokenizer", tok, "--latency", "0.004"], model="target-model").start()
    yield s, tok
    s.stop()


def make_config(tmp_path: Path, work: Path, standin, n_existing: int = 200) -> str:
    server, tok = standin
    existing = fx.write_jsonl(tmp_path / "existing.jsonl", [
        {"id": f"e{i}", "category": "coding",
         "messages": [{"role": "user", "content": f"Write python function {i}"},
                      {"role": "assistant", "content": "def f(): return x"}]}
        for i in range(n_existing)])
    cfg = fx.write_config(tmp_path, fx.six_sources(tmp_path, ROWS // 4), servers=[server.url], tokenizer=tok,
                          existing_dataset={"path": existing}, target_total=ROWS, max_length=4096,
                          generate={"concurrency": 8}, tokenize={"prompt_check": "drop", "batch_size": 64})
    # write_config puts work_dir under tmp_path; point it where the test wants it
    import yaml

    raw = yaml.safe_load(Path(cfg).read_text())
    raw["work_dir"] = str(work)
    Path(cfg).write_text(yaml.safe_dump(raw, sort_keys=False))
    return cfg


def _lines(path: Path) -> int:
    return stages.lines(str(path))


def kill_point(stage: str, work: Path) -> Callable[[], bool]:
    """True once ``stage`` has visibly started writing its output (the moment its kill lands)."""
    return lambda: stages.kill_point_reached(stage, str(work), ROWS)


def kill_stage_at(stage: str, cfg: str, reached: Callable[[], bool]) -> Dict[str, object]:
    """Run ``stage``, SIGKILL its whole process group the moment ``reached()`` is true; bounded."""
    proc = subprocess.Popen([sys.executable, "-m", "datagen", stage, "--config", cfg], env=_env(), cwd="/",
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + KILL_WAIT_S
    landed = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if reached():
                os.killpg(proc.pid, signal.SIGKILL)
                landed = True
                break
            time.sleep(0.001)
    finally:
        if proc.poll() is None and not landed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
    return {"landed": landed, "rc": proc.returncode, "stderr": err}


def check_dataset(work: Path) -> Dict[str, int]:
    """Every prepared id exactly once in tokenized and merged; shards whole; nothing of a dead build left."""
    problems, lost = stages.dataset_problems(str(work), ROWS)
    assert problems == [], problems
    return {"rows": ROWS, "lost": lost}


@pytest.fixture
def small_fs(tmp_path):
    """``tmp_path/work`` as a real 16 MiB tmpfs (a size-limited filesystem of its own)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI and the lab run as root)")
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "gpuops-faults-full", str(work)], check=True)
    try:
        yield work
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)


def fill(work: Path, leave: int) -> Path:
    """Fill ``work``'s filesystem until only ``leave`` bytes are free; the ballast file is returned."""
    st = os.statvfs(work)
    ballast = work / "ballast"
    with open(ballast, "wb") as fh:
        fh.write(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))
    return ballast


def done_marker(stage: str, work: Path) -> Optional[Path]:
    return {"tokenize": work / "tokenized" / "manifest.json", "merge": work / "merged" / "manifest.json"}.get(stage)


@dataclass
class Run:
    """One point's context: the pipeline's config and its work_dir."""

    cfg: str
    work: Path


def run_up_to(ctx: Run, stage: str) -> None:
    """The stages before STAGE, run to their end (the point lands in STAGE)."""
    for before in PIPELINE[:PIPELINE.index(stage)]:
        assert datagen(before, ctx.cfg).returncode == 0


def stage_killed(stage: str):
    """The injector: STAGE's whole process group SIGKILLed the moment its in-progress output appears."""

    def inject(ctx: Run) -> Dict[str, object]:
        run_up_to(ctx, stage)
        return dict(kill_stage_at(stage, ctx.cfg, kill_point(stage, ctx.work)), stage=stage)

    return inject


def restarted_unit_recovers(ctx: Run, kill: Dict[str, object]) -> Dict[str, int]:
    """The kill landed mid-stage; the unit restarted from the top redoes the stage and loses nothing; a second
    restart changes nothing."""
    stage = str(kill["stage"])
    assert kill["landed"], f"{stage} finished before its kill point (rc {kill['rc']}): {str(kill['stderr'])[-2000:]}"
    assert kill["rc"] == -signal.SIGKILL
    assert not stages.stage_done(stage, str(ctx.work), ROWS), f"{stage} finished before the kill landed"
    # the killed stage's output is not taken as done: the restart redoes it
    summaries = dict(zip(PIPELINE, run_unit(ctx.cfg)))
    assert summaries[stage].get("skipped") in (False, None), f"{stage}: the half-done output was taken as done"
    result = check_dataset(ctx.work)
    # and a second restart changes nothing
    again = dict(zip(PIPELINE, run_unit(ctx.cfg)))
    assert all(again[s].get("skipped") is True for s in ("prepare", "tokenize", "merge", "report"))
    assert again["generate"]["written"] == 0
    return {"rows_lost": result["lost"]}


def fills_up(stage: str, leave: int):
    """The injector: work_dir's filesystem filled to LEAVE bytes free, then STAGE run on it."""

    def inject(ctx: Run) -> Dict[str, object]:
        run_up_to(ctx, stage)
        ballast = fill(ctx.work, leave)
        return {"stage": stage, "ballast": ballast, "done": datagen(stage, ctx.cfg)}

    return inject


def disk_full_reported(ctx: Run, landed: Dict[str, object]) -> Dict[str, int]:
    """Exit 1 with one line naming the path and the space needed, nothing half-written taken as done; once the
    space is freed the run completes."""
    stage, work, p = str(landed["stage"]), ctx.work, landed["done"]
    assert isinstance(p, subprocess.CompletedProcess)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    line = [ln for ln in p.stderr.splitlines() if ln.startswith(f"datagen {stage}:")]
    assert line, p.stderr[-3000:]
    assert f"no space left on the filesystem of work_dir {work}" in line[-1]
    assert "this stage needs about" in line[-1] and "free" in line[-1]
    marker = done_marker(stage, work)
    assert marker is None or not marker.exists(), "a stage that ran out of space left its done marker"
    assert glob.glob(str(work / "*.tmp-*")) == [], "the failed build directory was left on the full disk"
    if stage == "generate":
        written = _lines(work / "generated.jsonl")
        assert 0 < written < ROWS, "the disk should fill mid-generation"
    Path(str(landed["ballast"])).unlink()
    summaries = dict(zip(PIPELINE, run_unit(ctx.cfg)))
    assert summaries[stage].get("skipped") in (False, None)
    return {"rows_lost": check_dataset(work)["lost"]}


# generate: room for a few rows, then full mid-stage; tokenize/merge: full before the first shard closes
FAULTS = [Fault("datagen stage SIGKILLed", stage, stage_killed(stage), restarted_unit_recovers) for stage in PIPELINE]
FAULTS += [Fault("work_dir full", stage, fills_up(stage, leave), disk_full_reported, at={"tmpfs": True})
           for stage, leave in (("generate", 64 * 1024), ("tokenize", 8 * 1024), ("merge", 8 * 1024))]


@pytest.mark.parametrize("row", faults.table(FAULTS))
def test_fault_then_unit_restarted(row, request, tmp_path, standin, figures):
    # a fault of the disk gets work_dir on a small filesystem of its own
    work = request.getfixturevalue("small_fs") if row.at.get("tmpfs") else tmp_path / "work"
    faults.run(figures, row, Run(make_config(tmp_path, work, standin), work))


def test_disk_full_message_names_the_space_needed(tmp_path):
    """The estimate for generate grows with the rows left: the message is not a fixed string."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "prompts.jsonl").write_text("".join(json.dumps({"id": str(i), "p": "x" * 200}) + "\n"
                                                for i in range(1000)))
    (work / "generated.jsonl").write_text("".join(json.dumps({"id": str(i), "r": "y" * 2000}) + "\n"
                                                  for i in range(100)))
    need = space.generate_needs(str(work))
    assert 900 * 2000 < need < 900 * 2100
    assert space.is_disk_full(OSError(28, "No space left on device"))
    assert space.is_disk_full(OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"))
    assert not space.is_disk_full(OSError(13, "Permission denied"))
    msg = space.message("generate", str(work), need)
    assert str(work) in msg and "MiB" in msg
