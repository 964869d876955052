"""tokenize: generated conversations -> ``input_ids`` + ``loss_mask`` Parquet shards.

Token-exact: a generated row carries the ids the server consumed and produced
(``prompt_token_ids``, ``response_token_ids``, see ``datagen.sglang_chat``), and its ``input_ids`` are
exactly those, prompt then response; the generated ids are supervised, all of them (the stop token the
model sampled included, so the drafter learns to stop), and nothing is re-rendered or re-tokenized for
them. A generated row without server ids is left out (``no_server_token_ids``).

The prompt is still rendered here, with the target model's tokenizer and chat template and the inputs
SGLang gives its template (tools as ``Tool.model_dump()``, tool-call arguments as objects, no tools with
``tool_choice: none``: ``sglang_chat.template_inputs``), for two things:

- the prompt check: the rendered prompt's ids must equal the server's ``prompt_token_ids``, which proves
  the tokenizer and template here are the server's. A row that differs is counted by reason
  (``prompt_check.reasons``: ``length_differs``, ``ids_differ``) and ``tokenize.prompt_check`` decides:
  ``warn`` keeps it with only its generated ids supervised, ``drop`` leaves it out, ``fail`` stops.
  ``prompt_check_tolerance`` lets a length difference of that many tokens through ``drop``/``fail`` (still
  counted); earlier turns are masked only on an exact match.
- ``supervise: all``: earlier assistant turns are supervised too, found by rendering prefixes (the text
  of ``messages[:i]`` with the generation prompt ends where assistant turn ``i`` starts, the text of
  ``messages[:i+1]`` ends where it stops). Both must be prefixes of the rendered prompt; a turn that a
  template renders differently once it is history (Qwen3 drops empty think blocks) stays unsupervised
  and the row is counted under ``earlier_turns_unsupervised``. A token is supervised when its first
  character lies in such a span, and only when the rendered prompt's ids are the server's.

Rows without server ids (an existing dataset's rows, tokenized by ``merge``) are rendered whole the same
way, the last assistant turn by the prefix rule too (``template_not_prefix_stable`` when it fails).

Rows whose mask has no two consecutive supervised tokens after truncation to ``max_length`` teach a
drafter nothing (it predicts token t+1 from t) and are counted and left out.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from datagen import __version__, paths
from datagen.gen.settings import DEFAULT_THINKING_SWITCH, chat_template_kwargs
from datagen.sglang_chat import template_inputs
from datagen.util import (
    DatagenError,
    bump,
    file_stamp,
    fingerprint,
    fresh_build_dir,
    hash64,
    iter_jsonl,
    peak_rss_mib,
    read_json,
    swap_dir,
    write_json,
)

SCHEMA_FIELDS = ("id", "source", "category", "input_ids", "loss_mask", "num_tokens", "num_supervised",
                 "truncated", "finish_reason")


class Skip(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def load_tokenizer(name: Optional[str]) -> Any:
    if not name:
        raise DatagenError("tokenizer: is required for tokenize (a local tokenizer dir or Hub model id)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DatagenError("tokenizer: the transformers package is missing (pip install -r requirements-datagen.txt)") \
            from None
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # transformers raises OSError, ValueError, HF errors...
        raise DatagenError(f"tokenizer: cannot load {name!r}: {exc}") from None
    if not getattr(tok, "is_fast", False):
        raise DatagenError(f"tokenizer: {name!r} has no fast tokenizer (tokenizer.json); offsets are needed")
    if not getattr(tok, "chat_template", None):
        raise DatagenError(f"tokenizer: {name!r} has no chat_template; use the target model's tokenizer")
    return tok


def template_kwargs(raw: Dict[str, Any]) -> Dict[str, Any]:
    """The chat template kwargs generate sends (``chat_template_kwargs`` of ``datagen.gen.settings``), read from a
    validated config that may lack what generate alone needs (``servers``: merge of an existing dataset)."""
    section = raw.get("generate") or {}
    return chat_template_kwargs(section.get("chat_template_kwargs") or {}, bool(section.get("thinking", False)),
                                section.get("thinking_switch", DEFAULT_THINKING_SWITCH))


def tool_choice(raw: Dict[str, Any]) -> Any:
    """The tool_choice generate sends (the server renders no tools with ``none``)."""
    return (raw.get("generate") or {}).get("tool_choice", "auto")


Spans = List[Tuple[int, int]]


class Renderer:
    """The chat template as the server applies it: SGLang's template inputs, the generate kwargs."""

    def __init__(self, tokenizer: Any, kwargs: Dict[str, Any], choice: Any = "auto") -> None:
        self.tok = tokenizer
        self.kwargs = kwargs
        self.tool_choice = choice

    def inputs(self, messages: List[Dict[str, Any]], tools: Any) -> Tuple[List[Dict[str, Any]], Any]:
        try:
            return template_inputs(messages, tools or None, self.tool_choice)
        except ValueError as exc:  # SGLang answers 400 to such a conversation: it was never served
            raise Skip("bad_tool_call_arguments") from exc

    def render(self, messages: List[Dict[str, Any]], tools: Any, gen_prompt: bool) -> str:
        """Render messages/tools already in SGLang's form (see ``inputs``)."""
        try:
            return self.tok.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=gen_prompt, **self.kwargs,
            )
        except Exception as exc:  # jinja raise_exception() in templates: unsupported role order etc.
            raise Skip("template_error") from exc

    def _turn_spans(self, messages: List[Dict[str, Any]], tools: Any, full: str, turns: List[int],
                    full_is_last: bool) -> Tuple[Spans, int]:
        """Character spans of assistant ``turns`` inside ``full`` and the number of turns whose rendering as
        history is not a prefix of ``full`` (left out)."""
        spans: Spans = []
        unstable = 0
        last = len(messages) - 1
        for i in turns:
            before = self.render(messages[:i], tools, True) if i else ""
            upto = full if (full_is_last and i == last) else self.render(messages[: i + 1], tools, False)
            if not (full.startswith(before) and full.startswith(upto)) or len(upto) < len(before):
                if full_is_last and i == last:
                    raise Skip("template_not_prefix_stable")
                unstable += 1
                continue
            spans.append((len(before), len(upto)))
        return spans, unstable

    def spans(self, messages: List[Dict[str, Any]], tools: Any, supervise: str) -> Tuple[str, Spans, int]:
        """A whole conversation without server ids: full text, assistant character spans, unstable turns.

        The last turn must pass the prefix rule (else ``template_not_prefix_stable``: it cannot be masked);
        earlier ones that fail it are left unsupervised and counted.
        """
        messages, tools = self.inputs(messages, tools)
        full = self.render(messages, tools, False)
        idx = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if supervise == "last":
            idx = idx[-1:]
        spans, unstable = self._turn_spans(messages, tools, full, idx, True)
        return full, spans, unstable

    def prompt_spans(self, messages: List[Dict[str, Any]], tools: Any, supervise: str) -> Tuple[str, Spans, int]:
        """A generated conversation: the rendered prompt (all but the generated last turn, with the generation
        prompt), the spans of its earlier assistant turns (``supervise: all``), unstable turns."""
        messages, tools = self.inputs(messages[:-1], tools)
        prompt = self.render(messages, tools, True)
        idx = [i for i, m in enumerate(messages) if m.get("role") == "assistant"] if supervise == "all" else []
        spans, unstable = self._turn_spans(messages, tools, prompt, idx, False)
        return prompt, spans, unstable


def server_token_ids(row: Dict[str, Any]) -> Optional[Tuple[List[int], List[int]]]:
    """(prompt ids, response ids) that generate stored from the server, or None."""
    ids = []
    for key in ("prompt_token_ids", "response_token_ids"):
        value = row.get(key)
        if not isinstance(value, list) or not value or \
                not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
            return None
        ids.append(value)
    return ids[0], ids[1]


def prompt_difference(rendered: List[int], server: List[int]) -> Optional[Tuple[str, int]]:
    """None when the ids are equal, else (reason, first differing position)."""
    if rendered == server:
        return None
    first = next((i for i, (a, b) in enumerate(zip(rendered, server)) if a != b), min(len(rendered), len(server)))
    return ("length_differs" if len(rendered) != len(server) else "ids_differ"), first


def mask_from_offsets(offsets: List[Tuple[int, int]], spans: List[Tuple[int, int]]) -> List[int]:
    """1 for each token whose first character lies in a span; token starts never decrease, so bisect."""
    from bisect import bisect_left

    mask = [0] * len(offsets)
    starts = [o[0] for o in offsets]
    for a, b in spans:
        lo, hi = bisect_left(starts, a), bisect_left(starts, b)
        mask[lo:hi] = [1] * (hi - lo)
    return mask


def has_supervised_pair(mask: List[int]) -> bool:
    return any(a and b for a, b in zip(mask, mask[1:]))


def _prompt_ids(path: str) -> Optional[set]:
    """Hashed ids of the current prompts.jsonl (None when absent): generated rows of prompts that a
    later prepare run dropped must not reach the training data."""
    if not os.path.exists(path):
        return None
    ids = set()
    for _line_no, row in iter_jsonl(path):
        if isinstance(row, dict) and row.get("id"):
            ids.add(hash64(str(row["id"])))
    return ids


def _rows(path: str, stats: Dict[str, Any], wanted: Optional[set] = None) -> Iterator[Dict[str, Any]]:
    seen: set = set()
    for _line_no, row in iter_jsonl(path):
        stats["rows_in"] += 1
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row.get("id"):
            bump(stats["skipped"], "malformed_row")
            continue
        key = hash64(str(row["id"]))
        if key in seen:
            bump(stats["skipped"], "duplicate_id")
            continue
        if wanted is not None and key not in wanted:
            bump(stats["skipped"], "not_in_prompts")
            continue
        seen.add(key)
        yield row


class ShardWriter:
    """Parquet shards of at most ``shard_rows`` rows, written in row groups (bounded memory)."""

    ROW_GROUP = 4096
    GROUP_TOKENS = 16 * 1024 * 1024

    def __init__(self, out_dir: str, shard_rows: int, with_origin: bool = False) -> None:
        import pyarrow as pa

        self.pa = pa
        self.out_dir = out_dir
        self.shard_rows = shard_rows
        fields = [
            ("id", pa.string()), ("source", pa.string()), ("category", pa.string()),
            ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
            ("num_tokens", pa.int32()), ("num_supervised", pa.int32()), ("truncated", pa.bool_()),
            ("finish_reason", pa.string()),
        ]
        if with_origin:  # merged shards say whether a row is new or came from the existing set
            fields.append(("origin", pa.string()))
        self.schema = pa.schema(fields)
        self.writer = None
        self.in_shard = 0
        self.shards: List[str] = []
        self.buffer: List[Any] = []
        self.buffered_rows = 0
        self.buffered_tokens = 0

    def write(self, rows: List[Dict[str, Any]]) -> None:
        """Convert to Arrow at once (4-5 bytes a token instead of ~36 as Python ints) and buffer; a row group
        goes out per ``ROW_GROUP`` rows or ``GROUP_TOKENS`` tokens, whichever comes first."""
        if not rows:
            return
        table = self.pa.Table.from_pylist(rows, schema=self.schema)
        self.buffer.append(table)
        self.buffered_rows += table.num_rows
        self.buffered_tokens += sum(r["num_tokens"] for r in rows)
        if self.buffered_rows >= self.ROW_GROUP or self.buffered_tokens >= self.GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self.buffer:
            return
        table = self.pa.concat_tables(self.buffer)
        self.buffer, self.buffered_rows, self.buffered_tokens = [], 0, 0
        offset = 0
        while offset < table.num_rows:
            if self.writer is None or self.in_shard >= self.shard_rows:
                self._close_writer()
                path = os.path.join(self.out_dir, f"shard-{len(self.shards):05d}.parquet")
                self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")
                self.shards.append(path)
                self.in_shard = 0
            n = min(self.shard_rows - self.in_shard, table.num_rows - offset)
            self.writer.write_table(table.slice(offset, n))
            self.in_shard += n
            offset += n

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> None:
        """Write what is buffered and close the last shard."""
        self._flush()
        self._close_writer()

    def abort(self) -> None:
        self.buffer = []
        self._close_writer()


class ShardBuild:
    """A stage's next set of shards, built in a private sibling of ``out_dir`` and put in its place whole.

    ``with build as writer:`` writes the shards (closing the last one on the way out); ``build.publish(manifest)``
    then writes the manifest next to them and swaps the directory in. An error in the block (a full disk
    included, named by datagen.space further up) drops the writer and the build directory and goes on as
    raised: the previous output stays as it was.
    """

    def __init__(self, out_dir: str, shard_rows: int, with_origin: bool = False) -> None:
        self.out_dir = out_dir
        self.tmp_dir = fresh_build_dir(out_dir)
        self.writer = ShardWriter(self.tmp_dir, shard_rows, with_origin=with_origin)

    def __enter__(self) -> ShardWriter:
        return self.writer

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                self.writer.close()
                return
            except BaseException:
                self._discard()
                raise
        self._discard()

    def _discard(self) -> None:
        self.writer.abort()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    @property
    def shards(self) -> List[str]:
        """The shards' paths once published (in ``out_dir``)."""
        return [os.path.join(self.out_dir, os.path.basename(s)) for s in self.writer.shards]

    def publish(self, manifest: Dict[str, Any]) -> None:
        write_json(os.path.join(self.tmp_dir, paths.MANIFEST), manifest)
        swap_dir(self.tmp_dir, self.out_dir)


def tokenize_fingerprint(cfg: Any, src: str) -> str:
    tok_stamp: Any = cfg.tokenizer
    if cfg.tokenizer and os.path.isdir(cfg.tokenizer):
        tok_stamp = [file_stamp(os.path.join(cfg.tokenizer, f)) for f in sorted(os.listdir(cfg.tokenizer))
                     if os.path.isfile(os.path.join(cfg.tokenizer, f))]
    prompts = paths.in_work(cfg.work_dir, paths.PROMPTS)
    return fingerprint(["tokenize", __version__, file_stamp(src), tok_stamp, cfg.max_length, cfg.tokenize.__dict__,
                        template_kwargs(cfg.raw), tool_choice(cfg.raw), file_stamp(prompts) if os.path.exists(prompts) else None])


def tokenize_rows(
    rows: List[Dict[str, Any]], renderer: Renderer, max_length: int, supervise: str,
    stats: Dict[str, Any], prompt_check: str = "warn", tolerance: int = 0, token_exact: bool = False,
) -> List[Dict[str, Any]]:
    """One batch: render, tokenize (batched, with offsets), mask, truncate, check. Updates ``stats``.

    ``token_exact`` (generated rows): the ids are the server's, the rendering only checks the prompt and
    finds earlier assistant turns; a row without server ids is skipped. Otherwise (an existing dataset's
    rows) the whole conversation is rendered here.
    """
    texts: List[str] = []
    metas: List[Tuple[Dict[str, Any], Spans, int, Optional[Tuple[List[int], List[int]]]]] = []
    for row in rows:
        msgs = row["messages"]
        if not msgs or msgs[-1].get("role") != "assistant":
            bump(stats["skipped"], "no_assistant_turn")
            continue
        last = msgs[-1]
        if not (last.get("content") or "").strip() and not last.get("tool_calls") \
                and not last.get("reasoning_content"):
            bump(stats["skipped"], "empty_response")
            continue
        ids = server_token_ids(row) if token_exact else None
        if token_exact and ids is None:
            bump(stats["skipped"], "no_server_token_ids")
            continue
        try:
            if ids is None:
                text, spans, unstable = renderer.spans(msgs, row.get("tools"), supervise)
            else:
                text, spans, unstable = renderer.prompt_spans(msgs, row.get("tools"), supervise)
        except Skip as s:
            bump(stats["skipped"], s.reason)
            continue
        texts.append(text)
        metas.append((row, spans, unstable, ids))
    if not texts:
        return []
    # the Rust tokenizer directly: batched, parallel, without transformers' per-row conversions
    enc = renderer.tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    out: List[Dict[str, Any]] = []
    for e, (row, spans, unstable, ids) in zip(enc, metas):
        if ids is None:
            input_ids, mask = e.ids, mask_from_offsets(e.offsets, spans)
        else:
            prompt, response = ids
            verdict = check_prompt(row, e.ids, prompt, stats, prompt_check, tolerance)
            if verdict is None:
                continue
            if verdict == "exact":  # the rendering is the server's: its offsets place the earlier turns
                prompt_mask = mask_from_offsets(e.offsets, spans)
            else:
                prompt_mask = [0] * len(prompt)
                unstable += len(spans)  # earlier turns cannot be placed in ids that differ: unsupervised
            stats["token_exact"] += 1
            input_ids, mask = prompt + response, prompt_mask + [1] * len(response)
        if unstable:
            stats["earlier_turns_unsupervised"] += 1
        truncated = len(input_ids) > max_length
        if truncated:
            input_ids, mask = input_ids[:max_length], mask[:max_length]
            stats["truncated"] += 1
        if not has_supervised_pair(mask):
            bump(stats["skipped"], "no_supervised_pair")
            continue
        bump(stats["finish_reason"], str(row.get("finish_reason")))
        bump(stats["per_category"], str(row.get("category")))
        stats["tokens"] += len(input_ids)
        stats["supervised_tokens"] += sum(mask)
        out.append({
            "id": str(row["id"]), "source": str(row.get("source", "")), "category": str(row.get("category", "")),
            "input_ids": input_ids, "loss_mask": mask, "num_tokens": len(input_ids), "num_supervised": sum(mask),
            "truncated": truncated, "finish_reason": None if row.get("finish_reason") is None
            else str(row["finish_reason"]),
        })
    return out


def check_prompt(row: Dict[str, Any], rendered: List[int], server: List[int], stats: Dict[str, Any],
                 prompt_check: str, tolerance: int) -> Optional[str]:
    """Compare the rendered prompt's ids with the server's; count the outcome.

    Returns ``"exact"`` (earlier turns may be masked), ``"differs"`` for a difference the row survives
    (``warn``, or within ``tolerance``), None when the row is dropped; raises for ``fail``.
    """
    pc = stats["prompt_check"]
    pc["checked"] += 1
    diff = prompt_difference(rendered, server)
    if diff is None:
        pc["matched"] += 1
        return "exact"
    reason, first = diff
    pc["mismatched"] += 1
    bump(pc["reasons"], reason)
    length_diff = abs(len(rendered) - len(server))
    pc["max_abs_diff"] = max(pc["max_abs_diff"], length_diff)
    if len(pc["examples"]) < 10:
        pc["examples"].append({"id": row["id"], "reason": reason, "first_difference": first,
                               "rendered": len(rendered), "server": len(server)})
    if reason == "length_differs" and length_diff <= tolerance or prompt_check == "warn":
        return "differs"
    if prompt_check == "fail":
        raise DatagenError(
            f"tokenize.prompt_check: row {row['id']}: the rendered prompt ({len(rendered)} tokens) differs from the "
            f"server's prompt_token_ids ({len(server)} tokens) from position {first} ({reason}); the tokenizer or "
            "chat template here is not the server's (set tokenizer to the served model's, or prompt_check: warn)")
    bump(stats["skipped"], "prompt_token_mismatch")
    return None


def new_stats() -> Dict[str, Any]:
    return {"rows_in": 0, "rows_out": 0, "skipped": {}, "truncated": 0, "tokens": 0, "supervised_tokens": 0,
            "earlier_turns_unsupervised": 0, "token_exact": 0,
            "finish_reason": {}, "per_category": {},
            "prompt_check": {"checked": 0, "matched": 0, "mismatched": 0, "reasons": {}, "max_abs_diff": 0,
                             "examples": []}}


def run_tokenize(cfg: Any, force: bool = False, src: Optional[str] = None) -> Dict[str, Any]:
    t0 = time.monotonic()
    src = src or paths.in_work(cfg.work_dir, paths.GENERATED)
    if not os.path.exists(src):
        raise DatagenError(f"tokenize: {src} not found; run `python -m datagen generate` first")
    out_dir = paths.in_work(cfg.work_dir, paths.TOKENIZED_DIR)
    man_path = os.path.join(out_dir, paths.MANIFEST)
    fp = tokenize_fingerprint(cfg, src)
    old = read_json(man_path)
    if not force and old and old.get("fingerprint") == fp and all(os.path.exists(s) for s in old.get("shards", [])):
        return {"stage": "tokenize", "skipped": True, "reason": "inputs and config unchanged",
                "rows_out": old["rows_out"], "dir": out_dir}
    renderer = Renderer(load_tokenizer(cfg.tokenizer), template_kwargs(cfg.raw), tool_choice(cfg.raw))
    stats = new_stats()
    build = ShardBuild(out_dir, cfg.tokenize.shard_rows)
    opts = cfg.tokenize
    with build as writer:
        batch: List[Dict[str, Any]] = []
        wanted = _prompt_ids(paths.in_work(cfg.work_dir, paths.PROMPTS))
        for row in _rows(src, stats, wanted):
            batch.append(row)
            if len(batch) >= opts.batch_size:
                done = tokenize_rows(batch, renderer, cfg.max_length, opts.supervise, stats, opts.prompt_check,
                                     opts.prompt_check_tolerance, token_exact=True)
                stats["rows_out"] += len(done)
                writer.write(done)
                batch = []
        done = tokenize_rows(batch, renderer, cfg.max_length, opts.supervise, stats, opts.prompt_check,
                             opts.prompt_check_tolerance, token_exact=True)
        stats["rows_out"] += len(done)
        writer.write(done)
    manifest = dict(stats, stage="tokenize", fingerprint=fp, version=__version__, source=src,
                    tokenizer=cfg.tokenizer, max_length=cfg.max_length, supervise=opts.supervise,
                    shards=build.shards, seconds=round(time.monotonic() - t0, 3), peak_rss_mib=round(peak_rss_mib(), 1))
    build.publish(manifest)
    pc = stats["prompt_check"]
    return {"stage": "tokenize", "skipped": False, "rows_in": stats["rows_in"], "rows_out": stats["rows_out"],
            "skipped_rows": stats["skipped"], "token_exact": stats["token_exact"],
            "prompt_check": {k: pc[k] for k in ("checked", "matched", "mismatched")},
            "dir": out_dir}
