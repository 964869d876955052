"""Stage 4, generate: the target model writes the responses, through SGLang's OpenAI-compatible API.

Input: ``prompts.jsonl`` rows ``{id, source, category, messages, tools?}``.
Output (``work_dir``):

- ``generated.jsonl``: one line per finished row, append-only: the input row
  with the generated assistant message appended to ``messages`` (a trailing
  assistant turn in the input is the one regenerated), plus ``finish_reason``,
  ``usage``, ``sampling``, ``server`` and ``model``. ``id`` is the first key.
- ``generate.errors.jsonl``: rows that failed after their retries, or could not
  be sent (bad input), with the reason; they are tried again on the next run.
- ``generate.progress.json``: done/total, tok/s, ETA, per-server counts,
  rewritten every ``progress_interval`` while a run is going.
- ``generate.lock``: held (flock) by the running process.

Re-running is resuming: rows whose id is in the output are skipped, a torn last
line is cut off first (kept in ``generated.jsonl.torn``). Line counts are never
trusted.

Public API, used by ``datagen.cli``: :func:`settings_from_config`,
:func:`run_generate`, :func:`read_status` (and :func:`format_status`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from typing import Any, Dict, Iterator, Optional

from .gen.client import Engine, GenerateError
from .gen.journal import AppendLog, DoneIndex, count_lines, iter_lines, parse_id, quarantine, repair_tail, scan_output
from .gen.progress import Progress, RunLock, lock_held, summary_line
from .gen.settings import ConfigError, GenerateSettings, settings_from_config
from .paths import GENERATE_ERRORS, GENERATED, PROMPTS
from .util import read_json, write_json

GENERATE_PROGRESS = "generate.progress.json"
GENERATE_LOCK = "generate.lock"

__all__ = [
    "ConfigError", "GenerateError", "GenerateSettings", "settings_from_config", "run_generate",
    "read_status", "format_status", "GENERATED", "GENERATE_ERRORS", "GENERATE_PROGRESS",
]

log = logging.getLogger("datagen.generate")


def _input_ids(prompts_path: str) -> Iterator[str]:
    for line in iter_lines(prompts_path):
        if line.strip():
            row_id = parse_id(line if line.endswith(b"\n") else line + b"\n")
            if row_id is not None:
                yield row_id


def _prepare_output(work_dir: str) -> Dict[str, Any]:
    """Repair a crash's leftovers; return the resume index and what was repaired."""
    out_path = os.path.join(work_dir, GENERATED)
    if os.path.exists(out_path) and not os.path.isfile(out_path):
        raise GenerateError(f"{out_path} is not a regular file: move it away, the output must be a plain file")
    torn = repair_tail(out_path)
    if torn:
        with open(out_path + ".torn", "ab") as side:
            side.write(torn + b"\n")
        log.warning("generate: cut a torn last line (%d bytes) off %s, kept in %s.torn", len(torn), out_path, out_path)
    repair_tail(os.path.join(work_dir, GENERATE_ERRORS))
    done, rows, bad = scan_output(out_path)
    if bad:
        log.warning("generate: %d unreadable lines in %s moved to %s.corrupt", len(bad), out_path, out_path)
        quarantine(out_path, bad, out_path + ".corrupt")
    return {"done": done, "rows": rows, "torn_bytes": len(torn), "corrupt_lines": len(bad)}


def run_generate(settings: GenerateSettings, prompts_path: str, work_dir: str) -> Dict[str, Any]:
    """Generate every row of ``prompts_path`` not yet in ``work_dir``'s output; return a summary.

    Raises :class:`GenerateError` when no server becomes ready, the model is not
    served, the prompts are missing, or another run holds the work directory.
    SIGTERM/SIGINT stop it cleanly: requests in flight get ``shutdown_grace``
    seconds, everything written is fsynced, and the next run picks up the rest.
    """
    if not os.path.isfile(prompts_path):
        raise GenerateError(f"no prompts at {prompts_path}: run `datagen prepare` first")
    if not logging.getLogger().handlers and not log.handlers:
        # nobody configured logging (the package CLI prints JSON at the end): the journal still
        # gets the readiness, stop and periodic progress lines on stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    os.makedirs(work_dir, exist_ok=True)
    lock = RunLock(os.path.join(work_dir, GENERATE_LOCK))
    if not lock.acquire():
        raise GenerateError(f"another generate run (pid {lock.holder()}) holds {lock.path}; "
                            "wait for it or stop it (`datagen status` shows its progress)")
    try:
        return _run_locked(settings, prompts_path, work_dir)
    finally:
        lock.release()


def _run_locked(settings: GenerateSettings, prompts_path: str, work_dir: str) -> Dict[str, Any]:
    t0 = time.monotonic()
    repaired = _prepare_output(work_dir)
    done: DoneIndex = repaired["done"]
    if len(done):
        # exact done/total on resume: only ids that are still in the prompts count
        total = done_at_start = 0
        for row_id in _input_ids(prompts_path):
            total += 1
            done_at_start += row_id in done
    else:
        total, done_at_start = count_lines(prompts_path), 0
    progress = Progress(total, done_at_start, settings.servers)
    progress_path = os.path.join(work_dir, GENERATE_PROGRESS)
    output = AppendLog(os.path.join(work_dir, GENERATED), flush_bytes=0)
    errors = AppendLog(os.path.join(work_dir, GENERATE_ERRORS), flush_bytes=1)
    engine: Optional[Engine] = None
    try:
        with open(prompts_path, "rb") as rows:
            engine = Engine(settings, iter(rows), done, output, errors, progress, progress_path, log.info)
            if done_at_start >= total:
                progress.state = "finished"
                progress.message = "nothing to do: every prompt has its response"
                engine._exhausted = True
            else:
                log.info("generate: %d of %d rows done, %d servers, concurrency %s", done_at_start, total,
                         len(settings.servers),
                         f"{settings.concurrency} each" if settings.concurrency else
                         f"auto ({settings.concurrency_min}-{settings.concurrency_max} per worker, "
                         f"{settings.queue_target} queued)")
                try:
                    asyncio.run(engine.run())
                except GenerateError as exc:
                    progress.message = str(exc)
                    raise
    except BaseException:
        for f in (output, errors):
            try:
                f.close()
            except OSError:
                pass  # the first error is the one to report
        progress.state = "failed"
        _write_progress_quietly(progress_path, progress)
        raise
    try:
        output.close()  # the last rows and the final fsync
        errors.close()
    except OSError as exc:
        progress.state = "failed"
        progress.message = f"cannot write {output.path}: {exc}"
        _write_progress_quietly(progress_path, progress)
        raise GenerateError(progress.message) from exc
    _write_progress_quietly(progress_path, progress)
    snap = progress.snapshot()
    elapsed = time.monotonic() - t0
    return {
        "state": snap["state"],
        "message": snap["message"],
        "total": snap["total"],
        "done": snap["done"],
        "done_at_start": done_at_start,
        "written": progress.written,
        "errors": progress.errors,
        "invalid_input_rows": engine.skipped_invalid if engine else 0,
        "retries": progress.retries,
        "prompt_tokens": progress.prompt_tokens,
        "completion_tokens": progress.completion_tokens,
        "finish_reasons": snap["finish_reasons"],
        "elapsed_s": round(elapsed, 3),
        "req_s": round(progress.written / elapsed, 2) if elapsed > 0 else 0.0,
        "tok_s": round(progress.completion_tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "model": engine.model if engine else settings.model,
        "servers": snap["servers"],
        "torn_bytes_repaired": repaired["torn_bytes"],
        "corrupt_lines_quarantined": repaired["corrupt_lines"],
        "output": os.path.join(work_dir, GENERATED),
        "errors_file": os.path.join(work_dir, GENERATE_ERRORS),
    }


def _write_progress_quietly(path: str, progress: Progress) -> None:
    try:
        write_json(path, progress.snapshot(), durable=False)
    except OSError as exc:  # advisory; the run's own error (if any) is the one that matters
        log.warning("generate: cannot write %s: %s", path, exc)


def read_status(work_dir: str) -> Dict[str, Any]:
    """Progress of the generate stage in ``work_dir``, also while another process runs it.

    ``running`` comes from the run lock (a crashed run holds none, whatever its
    progress file says); ``state`` is ``interrupted`` when a run died mid-way.
    """
    lock_path = os.path.join(work_dir, GENERATE_LOCK)
    running = lock_held(lock_path)
    found = read_json(os.path.join(work_dir, GENERATE_PROGRESS))
    status: Dict[str, Any] = found if isinstance(found, dict) else {}
    output_rows = count_lines(os.path.join(work_dir, GENERATED))
    if not status:
        prompts = os.path.join(work_dir, PROMPTS)
        status = {"state": "running" if running else ("not_started" if not output_rows else "unknown"),
                  "total": count_lines(prompts) if os.path.isfile(prompts) else None,
                  "done": output_rows, "tok_s": None, "req_s": None, "eta_s": None, "errors": None}
    elif not running and status.get("state") in ("starting", "waiting_for_servers", "running"):
        status["state"] = "interrupted"
        status["eta_s"] = None
    if not running:
        status["in_flight"] = 0
    status["running"] = running
    status["output_rows"] = output_rows
    if status.get("updated_at"):
        status["age_s"] = round(time.time() - status["updated_at"], 1)
    return status


def format_status(status: Dict[str, Any]) -> str:
    """One line for humans: ``generate: running 1200/200000 (0.6%) 5312 tok/s 41.3 req/s ETA 1h20m``."""
    return summary_line(status)


def main(argv: Optional[list] = None) -> int:
    """``python -m datagen.generate``: the stage on its own (the package CLI is ``python -m datagen generate``)."""
    import yaml

    ap = argparse.ArgumentParser(prog="python -m datagen.generate", description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("command", choices=("generate", "status"), nargs="?", default="generate")
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompts", help="default: WORK_DIR/prompts.jsonl")
    ap.add_argument("--work-dir", help="default: the config's work_dir")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        with open(args.config, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
        work_dir = args.work_dir or raw.get("work_dir")
        if not work_dir:
            raise ConfigError("work_dir: missing; set the pipeline's work directory")
        if args.command == "status":
            print(format_status(read_status(work_dir)))
            return 0
        settings = settings_from_config(raw)
        result = run_generate(settings, args.prompts or os.path.join(work_dir, PROMPTS), work_dir)
    except (ConfigError, GenerateError, OSError) as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    print(format_status(read_status(work_dir)))
    return 0 if result["state"] in ("finished", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main())
