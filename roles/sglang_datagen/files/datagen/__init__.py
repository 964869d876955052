"""datagen: the data-expansion pipeline for a speculative-decoding drafter.

Run on the GPU node from the role's venv::

    python -m datagen {prepare,generate,tokenize,merge,report,status,release} --config datagen.yml [--force]

Stages and files (all under ``work_dir``; names in :mod:`datagen.paths`):

=========  ==========================================  =============================================
stage      reads                                       writes
=========  ==========================================  =============================================
prepare    sources, existing_dataset                   prompts.jsonl, prepare.manifest.json
generate   prompts.jsonl, servers                      generated.jsonl, generate.errors.jsonl,
                                                       generate.progress.json (owned by generate.py)
tokenize   generated.jsonl, tokenizer                  tokenized/shard-NNNNN.parquet + manifest.json
merge      tokenized/, existing_dataset                merged/shard-NNNNN.parquet + manifest.json
report     prepare/tokenized/merged manifests          report/composition.md, mix.png, lengths.png
status     generate.progress.json (while it runs)      -
release    pipeline.done, the GPUs (after the stages)  released.json (datagen/release.py)
=========  ==========================================  =============================================

Every stage is idempotent: it records a fingerprint of its inputs (file path, size, mtime) and
config in its manifest and skips when nothing changed; ``--force`` redoes it.

Interface between the core (config, prepare, tokenize, merge, report, CLI) and the generation
side (``datagen/generate.py``), fixed here:

- Config top-level keys: ``work_dir``, ``model`` (str, or mapping with ``name``; unset: the first model the
  servers list), ``tokenizer``,
  ``existing_dataset``, ``target_total``, ``target_mix``, ``sources``, ``servers`` (list of base URLs),
  ``sampling``, ``max_length``, ``seed``, ``generate`` (validated by generate.py), plus the core's
  optional ``prepare``, ``tokenize``, ``merge`` sections. :mod:`datagen.config` validates everything
  but ``servers``, ``model``, ``sampling`` and ``generate``, which :mod:`datagen.gen.settings` judges.
- ``datagen.generate`` exposes ``settings_from_config(raw: dict) -> GenerateSettings`` (raises
  :class:`datagen.config.ConfigError`), ``run_generate(settings, prompts_path, work_dir) -> dict``
  and ``read_status(work_dir) -> dict``; the CLI calls exactly these for ``generate`` and ``status``.
- Prompt rows (prompts.jsonl): ``{id, source, category, messages, tools?}``; ``messages`` are OpenAI
  chat messages ending in a user or tool turn, ``tools`` OpenAI function specs, ``id`` a stable hash
  of source name and canonical prompt.
- Generated rows (generated.jsonl): the prompt row with the generated assistant message appended to
  ``messages``, plus ``finish_reason``, ``usage`` {prompt_tokens, completion_tokens}, ``sampling``,
  ``server`` (and ``model``), and the server's ``prompt_token_ids`` and ``response_token_ids``.
- Tokenized rows: ``id, source, category, input_ids, loss_mask, num_tokens, num_supervised``; a
  generated row's ``input_ids`` are its ``prompt_token_ids + response_token_ids``.
"""

from __future__ import annotations

__version__ = "1.1.0"  # 1.1: token-exact rows (tokenize output differs)
