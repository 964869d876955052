"""Command line: one subcommand per stage; prints one JSON summary on stdout.

Exit status: 0 done (or skipped, unchanged), 2 bad config or arguments, 1 the stage failed
(the message on stderr says why and what to do).

``check-config`` runs every check the stages run on a config (the keys, the sources, the
``generate`` and ``sampling`` settings) without running anything; the role runs it before it
touches a host. While the stages run, ``pipeline.ready.json`` in the work directory says how far
the pipeline got past its start-up (the role waits for it after launching the unit).

``release`` runs after the last stage (the pipeline unit's last ``ExecStartPost=``): it stops the
serving units and proves the GPUs free (:mod:`datagen.release`); one line on stdout (``--json``: the
outcome as JSON), exit 1 when the GPUs are not free. ``status`` adds ``pipeline``: finished for this
config or not, and the GPUs' release (``released.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from datagen import __version__, paths, release, space
from datagen.config import ConfigError, declared_inputs, load_config, load_raw
from datagen.existing import categories_from_labels
from datagen.mix import mix_findings, source_categories
from datagen.util import DatagenError, read_json, write_json

STAGES = ("prepare", "generate", "tokenize", "merge", "report", "status")
PIPELINE = ("prepare", "generate", "tokenize", "merge", "report")
READY = paths.READY
_READY_POLL_S = 0.5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m datagen",
        description="The data-expansion pipeline: prepare -> generate -> tokenize -> merge -> report "
                    "(status while generate runs). Each stage prints a JSON summary and skips when unchanged.",
        epilog="exit status: 0 done or unchanged, 1 the stage failed, 2 bad config or arguments",
    )
    p.add_argument("--version", action="version", version=f"datagen {__version__}")
    sub = p.add_subparsers(dest="stage", required=True, metavar="SUBCOMMAND")
    helps = {
        "prepare": "read the sources, normalise, deduplicate, fill quotas; write prompts.jsonl",
        "generate": "generate responses with the SGLang servers (resumable)",
        "tokenize": "apply the target's chat template; write input_ids/loss_mask Parquet shards",
        "merge": "merge new shards with the existing dataset toward the target mix",
        "report": "composition table and PNG charts of the mix before/after and token lengths",
        "status": "progress of generation (also while it runs in another process)",
        "check-config": "check the config as every stage would (keys, sources, sampling, generate); run nothing",
    }
    for name in STAGES + ("check-config",):
        sp = sub.add_parser(name, help=helps[name])
        sp.add_argument("--config", "-c", required=True, help="path to datagen.yml")
        if name in ("prepare", "tokenize", "merge", "report"):
            sp.add_argument("--force", action="store_true", help="redo even when inputs and config are unchanged")
    check = sub.choices["check-config"]
    check.add_argument("--no-inputs", action="store_true",
                       help="do not open the input files (they live on another machine): list them in 'inputs'")
    check.add_argument("--base-dir", help="resolve relative input paths against this directory "
                                          "(where the config will live) instead of the config file's")
    mix_help = ("whether target_mix asks only for categories the sources or the existing set supply: "
                "{warnings: [...]}; errors exit 2")
    mix_cmd = sub.add_parser("check-mix", help=mix_help)
    mix_cmd.add_argument("--config", "-c", required=True, help="path to datagen.yml")
    mix_cmd.add_argument("--existing-labels", help="the existing set's labels as read where it lives: JSON "
                                                   "{read, values, unlabelled} (the role reads them with the "
                                                   "dataset_labels_info module)")
    rel = sub.add_parser("release", help="the pipeline finished: stop the serving units, prove the GPUs free "
                                         "(gpu_free_wait's runner), write released.json; exit 1 when not free")
    rel.add_argument("--config", "-c", required=True, help="path to datagen.yml")
    rel.add_argument("--gpus", type=_gpu_list, default=[], metavar="N,N,...",
                     help="the GPUs to prove free, indexes or UUIDs, comma separated (empty: every GPU)")
    rel.add_argument("--timeout", type=float, default=release.DEFAULT_TIMEOUT_S,
                     help="seconds to wait for the GPUs to be free (default %(default)s)")
    rel.add_argument("--router", action="store_true", help="this node runs the router unit: stop it too")
    rel.add_argument("--if-needed", action="store_true",
                     help="do nothing when released.json says the GPUs were released for this job and no "
                          "serving unit runs")
    rel.add_argument("--json", action="store_true", help="print the outcome as JSON instead of one line")
    rel.add_argument("--systemctl", type=_command, default=["systemctl"], metavar="CMD",
                     help="the systemctl to run (split like a shell would; tests give a stub)")
    rel.add_argument("--stop-timeout", type=float, default=release.STOP_TIMEOUT_S,
                     help="seconds systemctl stop may take (default %(default)s)")
    rel.add_argument("--nvidia-smi", default="nvidia-smi", help="gpu_free_wait's nvidia_smi_path")
    rel.add_argument("--backend", default="auto", choices=("auto", "nvml", "nvidia_smi"), help="gpu_free_wait's backend")
    rel.add_argument("--device-path", action="append", dest="device_paths", metavar="PATTERN",
                     help="gpu_free_wait's device_paths (repeat; default /dev/nvidia*)")
    return p


def _gpu_list(text: str) -> List[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _command(text: str) -> List[str]:
    words = shlex.split(text)
    if not words:
        raise argparse.ArgumentTypeError("an empty command")
    return words


def check_config(config_path: str, check_inputs: bool = True, base_dir: Optional[str] = None) -> Dict[str, Any]:
    """Every check the stages make on a config, all problems at once (``ConfigError``), nothing run.

    The core keys and the sources (``datagen.config``), then the ``servers``/``sampling``/``generate``
    settings only the generate stage reads (``datagen.gen.settings``, imported directly so the check
    needs no HTTP client). Each reports every problem it finds.
    """
    raw = load_raw(config_path)
    errors: List[str] = []
    try:
        load_config(config_path, check_inputs=check_inputs)
    except ConfigError as exc:
        errors += exc.errors
    from datagen.gen.settings import settings_from_config

    try:
        max_in_flight = settings_from_config(raw).max_in_flight
    except ConfigError as exc:
        errors += [line for line in exc.errors if line not in errors]
    if errors:
        raise ConfigError(errors)
    base = base_dir or os.path.dirname(os.path.abspath(config_path))
    return {
        "config": os.path.abspath(config_path),
        "valid": True,
        "inputs_checked": check_inputs,
        "inputs": [{"key": key, "path": path} for key, path in declared_inputs(raw, base)],
        "max_in_flight": max_in_flight,
    }


def mark_ready(work_dir: str, stage: str, why: str) -> None:
    """Say the pipeline got past its start-up up to ``stage`` (atomic: a reader never sees half a file)."""
    write_json(paths.in_work(work_dir, READY), {"stage": stage, "why": why, "pid": os.getpid(), "time": time.time()})


def _watch_first_answers(progress_path: str, on_ready: Callable[[], None], stop: threading.Event) -> None:
    """Call ``on_ready`` once the generate run's own progress file shows a response written this run."""
    while not stop.wait(_READY_POLL_S):
        try:
            with open(progress_path, encoding="utf-8") as fh:
                progress = json.load(fh)
        except (OSError, ValueError):
            continue
        if progress.get("pid") == os.getpid() and int(progress.get("written") or 0) > 0:
            on_ready()
            return


def _generate_api():
    try:
        from datagen import generate as gen
    except ImportError as exc:
        raise DatagenError(f"the generate stage is not installed in this package: {exc}") from None
    return gen


def run(stage: str, config_path: str, force: bool = False) -> Dict[str, Any]:
    if stage == "prepare":
        from datagen.prepare import run_prepare

        return run_prepare(load_config(config_path), force=force)
    cfg = load_config(config_path, check_inputs=stage in ("merge",))
    if stage == "generate":
        gen = _generate_api()
        settings = gen.settings_from_config(cfg.raw)
        # The servers answered: the first response is on disk (the progress file says so).
        stop = threading.Event()
        watcher = threading.Thread(
            target=_watch_first_answers, daemon=True,
            args=(os.path.join(cfg.work_dir, gen.GENERATE_PROGRESS),
                  lambda: mark_ready(cfg.work_dir, "generate", "first responses written"), stop))
        watcher.start()
        try:
            return gen.run_generate(settings, paths.in_work(cfg.work_dir, paths.PROMPTS), cfg.work_dir)
        finally:
            stop.set()
    if stage == "status":
        status = _generate_api().read_status(cfg.work_dir)
        status["pipeline"] = release.pipeline_status(config_path, cfg.work_dir)
        return status
    if stage == "tokenize":
        from datagen.tokenize import run_tokenize

        return run_tokenize(cfg, force=force)
    if stage == "merge":
        from datagen.merge import run_merge

        return run_merge(cfg, force=force)
    if stage == "report":
        from datagen.report import run_report

        return run_report(cfg, force=force)
    raise DatagenError(f"unknown stage {stage}")


def check_mix(config_path: str, labels_path: Optional[str]) -> Dict[str, Any]:
    """``datagen.mix`` on a config whose existing set lives elsewhere: its labels come from LABELS_PATH (not read,
    or no file: only what the sources supply is known)."""
    cfg = load_config(config_path, check_inputs=False)
    labels = read_json(labels_path) if labels_path else None
    if cfg.existing is None:
        existing: Optional[set] = set()
    elif isinstance(labels, dict) and labels.get("read"):
        existing = categories_from_labels(cfg.existing, labels.get("values") or [], bool(labels.get("unlabelled")))
    else:
        existing = None
    errors, warnings = mix_findings(cfg.target_mix, source_categories(cfg.sources), existing)
    if errors:
        raise ConfigError(errors)
    if existing is None:
        why = labels.get("reason") if isinstance(labels, dict) else "no labels were given"
        warnings.append(f"target_mix: not checked against the existing set, which could not be read ({why}); "
                        f"prepare checks it when it reads the set")
    return {"warnings": warnings, "existing_categories": sorted(existing) if existing is not None else None}


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.stage == "check-config":
            result = check_config(args.config, not args.no_inputs, args.base_dir)
        elif args.stage == "check-mix":
            result = check_mix(args.config, args.existing_labels)
        elif args.stage == "release":
            return _release(args)
        else:
            result = run(args.stage, args.config, getattr(args, "force", False))
            if args.stage in PIPELINE:
                _mark_stage_done(args.config, args.stage)
    except ConfigError as exc:
        print(f"datagen {args.stage}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a full disk reads the same from every writer of every stage
        if not space.is_disk_full(exc):
            return _report_failure(args.stage, exc)
        print(f"datagen {_disk_full_line(args.stage, args.config)}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
    return 0


def _release(args: argparse.Namespace) -> int:
    """``release``: one line (or JSON) on stdout, exit 1 when the GPUs are not free."""
    outcome = release.run_cli(args.config, load_config(args.config, check_inputs=False).work_dir, args.gpus,
                              timeout=args.timeout, router=args.router, if_needed=args.if_needed,
                              systemctl=args.systemctl, stop_timeout=args.stop_timeout, nvidia_smi=args.nvidia_smi,
                              backend=args.backend, device_paths=args.device_paths)
    if args.json:
        json.dump(outcome, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(outcome["line"], flush=True)
    return 0 if outcome["free"] else 1


def _disk_full_line(stage: str, config_path: str) -> str:
    try:
        cfg = load_config(config_path, check_inputs=False)
    except Exception:  # noqa: BLE001 - the config loaded before the stage ran; this is only the message
        return f"{stage}: no space left on device under the work_dir of {config_path}; free space and run again"
    return space.disk_full_message(stage, cfg)


def _report_failure(stage: str, exc: Exception) -> int:
    """Exit status 1 and the message for a stage that failed; anything else is a bug (traceback)."""
    # every stage's own failure (GenerateError among them) is a DatagenError: its message, no traceback
    if isinstance(exc, DatagenError):
        print(f"datagen {stage}: {exc}", file=sys.stderr)
        return 1
    raise exc


def _mark_stage_done(config_path: str, stage: str) -> None:
    """A finished stage is past its start-up too (generate with nothing left to ask, or a later stage)."""
    mark_ready(load_config(config_path, check_inputs=False).work_dir, stage, "stage finished")
