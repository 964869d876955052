"""Command line: one subcommand per stage; prints one JSON summary on stdout.

Exit status: 0 done (or skipped, unchanged), 2 bad config or arguments, 1 the stage failed
(the message on stderr says why and what to do).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

from datagen import __version__, paths
from datagen.config import ConfigError, load_config
from datagen.util import DatagenError

STAGES = ("prepare", "generate", "tokenize", "merge", "report", "status")


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
    }
    for name in STAGES:
        sp = sub.add_parser(name, help=helps[name])
        sp.add_argument("--config", "-c", required=True, help="path to datagen.yml")
        if name in ("prepare", "tokenize", "merge", "report"):
            sp.add_argument("--force", action="store_true", help="redo even when inputs and config are unchanged")
    return p


def _generate_api():
    try:
        from datagen import generate as gen
    except ImportError as exc:
        raise DatagenError(f"the generate stage is not installed in this package: {exc}") from None
    for name in ("settings_from_config", "run_generate", "read_status"):
        if not hasattr(gen, name):
            raise DatagenError(f"datagen.generate lacks {name}(); the package is incomplete")
    return gen


def run(stage: str, config_path: str, force: bool = False) -> Dict[str, Any]:
    if stage == "prepare":
        from datagen.prepare import run_prepare

        return run_prepare(load_config(config_path), force=force)
    cfg = load_config(config_path, check_inputs=stage in ("merge",))
    if stage == "generate":
        gen = _generate_api()
        settings = gen.settings_from_config(cfg.raw)
        return gen.run_generate(settings, paths.in_work(cfg.work_dir, paths.PROMPTS), cfg.work_dir)
    if stage == "status":
        return _generate_api().read_status(cfg.work_dir)
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


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = run(args.stage, args.config, getattr(args, "force", False))
    except ConfigError as exc:
        print(f"datagen {args.stage}: {exc}", file=sys.stderr)
        return 2
    except DatagenError as exc:
        print(f"datagen {args.stage}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the generate side raises its own GenerateError; keep its message, no traceback
        if type(exc).__name__ == "GenerateError":
            print(f"datagen {args.stage}: {exc}", file=sys.stderr)
            return 1
        raise
    json.dump(result, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")
    return 0
