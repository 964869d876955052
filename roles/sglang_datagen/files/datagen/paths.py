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
DONE = "pipeline.done"  # "SHA1  CONFIG": the pipeline finished for the config with that checksum (the unit writes it)
RELEASED = "released.json"  # the GPUs released after the pipeline finished (datagen release)


def in_work(work_dir: str, *parts: str) -> str:
    return os.path.join(work_dir, *parts)
