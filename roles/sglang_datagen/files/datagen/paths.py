"""File names inside ``work_dir``: the one place every stage agrees on them."""

from __future__ import annotations

import os

PROMPTS = "prompts.jsonl"
PREPARE_MANIFEST = "prepare.manifest.json"
PREPARE_SPOOL = "prepare.spool.jsonl"
GENERATED = "generated.jsonl"
GENERATE_ERRORS = "generate.errors.jsonl"
TOKENIZED_DIR = "tokenized"
MERGED_DIR = "merged"
REPORT_DIR = "report"
MANIFEST = "manifest.json"
READY = "pipeline.ready.json"  # how far the pipeline got past its start-up (the role polls it)


def in_work(work_dir: str, *parts: str) -> str:
    return os.path.join(work_dir, *parts)
