# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Build the lab's tiny tokenizer: byte-level BPE with a ChatML chat template, no Hub access.

The one builder for every tiny tokenizer the project uses: the datagen unit tests
(``tests/unit/datagen``, fixture ``tiny_tokenizer``) and the lab, where the role
ships the committed copy in ``lab-tokenizer/`` into CT200 (``sglang_datagen_extra_files``),
the pipeline's ``tokenize``/``merge`` stages load it and the SGLang stand-in counts
``prompt_tokens`` with it (``standin.py --tokenizer DIR``), so tokenize's prompt check
compares two real renderings of the same template.

Writes ``tokenizer.json`` and ``tokenizer_config.json``; the chat template lives in
``tokenizer_config.json`` (as on most Hub models), not in a separate ``chat_template.jinja``.
It handles system, user, assistant (content and ``tool_calls``) and tool turns, and a
``tools`` list. The output is deterministic: the same versions of ``tokenizers`` and
``transformers`` write byte-identical files, which ``--check`` verifies against a directory::

    python tests/lab/tokenizer/build_tokenizer.py OUT_DIR           # build
    python tests/lab/tokenizer/build_tokenizer.py --check lab-tokenizer  # exit 1 if it drifted

Needs ``tokenizers`` and ``transformers`` (both in the controller's venv and the role's venv).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import sys
import tempfile
from typing import List, Optional

FILES = ("tokenizer.json", "tokenizer_config.json")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Training text: the roles' words, the tool-call markup and a little prose, so common
# pieces get merged tokens; everything else falls back to bytes (byte-level BPE).
CORPUS = [
    "user assistant system tool Explain idea number in plain words. What is the weather in city?",
    "It is degrees. def f(): return x squared Python function plan the steps rename file repository",
    "<tools> </tools> <tool_call> </tool_call> get_weather arguments name city {\"type\": \"function\"}",
] * 20

# ChatML like Qwen's; literal newlines go through {{ }} so whitespace control cannot eat them.
CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for t in tools %}{{ '\\n' + (t | tojson) }}{%- endfor %}{{ '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in (m.tool_calls or []) %}{{ '\\n<tool_call>\\n' + (c.function | tojson) + '\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer(out_dir: str, vocab_size: int = 600) -> str:
    """Write the tokenizer into ``out_dir`` (created if missing) and return its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir = str(out_dir)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    # transformers >= 4.5x writes the template to chat_template.jinja; keep it in
    # tokenizer_config.json instead, where every version looks for it
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(cfg_path, "w", encoding="utf-8") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")
    for extra in ("chat_template.jinja", "special_tokens_map.json"):
        path = os.path.join(out_dir, extra)
        if os.path.exists(path):
            os.unlink(path)
    return out_dir


def drifted(directory: str) -> List[str]:
    """The files of ``directory`` that differ from a fresh build (empty: up to date)."""
    with tempfile.TemporaryDirectory(prefix="lab-tokenizer-") as tmp:
        build_tokenizer(tmp)
        return [name for name in FILES
                if not os.path.exists(os.path.join(directory, name))
                or not filecmp.cmp(os.path.join(tmp, name), os.path.join(directory, name), shallow=False)]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("out_dir", help="directory to write (or, with --check, to compare)")
    ap.add_argument("--check", action="store_true", help="compare a fresh build with OUT_DIR; exit 1 on drift")
    args = ap.parse_args(argv)
    if args.check:
        bad = drifted(args.out_dir)
        if bad:
            print(f"{args.out_dir}: {', '.join(bad)} differ from a fresh build; rebuild with: "
                  f"python {sys.argv[0]} {args.out_dir}", file=sys.stderr)
            return 1
        print(f"{args.out_dir}: up to date")
        return 0
    print(build_tokenizer(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
