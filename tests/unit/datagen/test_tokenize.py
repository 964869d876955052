"""tokenize with a tiny local tokenizer + ChatML template: token-exact rows, exact loss masks, truncation,
prompt check, shards."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from datagen.config import load_config
from datagen.sources import adapt
from datagen.tokenize import load_tokenizer, mask_from_offsets, run_tokenize
from datagen.util import DatagenError
from tests.support import datagen_rows as fx

generated = fx.generated_row


def make(tmp_path, tiny_tokenizer, rows, torn=None, **top):
    top.setdefault("max_length", 1024)  # the tool conversations are longer than the default 256
    cfg_path = fx.write_config(tmp_path, fx.six_sources(tmp_path, 1), tokenizer=tiny_tokenizer, **top)
    cfg = load_config(cfg_path, check_inputs=False)
    os.makedirs(cfg.work_dir, exist_ok=True)
    with open(os.path.join(cfg.work_dir, "generated.jsonl"), "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
        if torn:
            fh.write(torn)  # a write cut by a crash: no newline
    return cfg


def shard_rows(res_dir):
    man = json.load(open(os.path.join(res_dir, "manifest.json")))
    out = []
    for s in man["shards"]:
        out.extend(pq.read_table(s).to_pylist())
    return man, out


def supervised_text(tok, row):
    return tok.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])


def hermes_prompt():
    from datagen.config import SourceSpec

    msgs, tools, _cat = adapt(SourceSpec(name="h", adapter="hermes_fc"), fx.hermes_row(4))
    return msgs, tools


def test_loss_mask_covers_exactly_the_assistant_tokens(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    msgs, tools = hermes_prompt()
    rows = [
        generated(tok, "a", [{"role": "user", "content": "Explain idea number 1 in plain words."}], "Idea 1 is simple."),
        generated(tok, "t", msgs, "It is 4 degrees.", tools=tools, category="tool_use"),
    ]
    cfg = make(tmp_path, tiny_tokenizer, rows)
    res = run_tokenize(cfg)
    assert res["rows_out"] == 2 and res["prompt_check"] == {"checked": 2, "matched": 2, "mismatched": 0}
    assert res["token_exact"] == 2
    man, out = shard_rows(res["dir"])
    by_id = {r["id"]: r for r in out}
    for row in rows:  # the training row is exactly the ids the server consumed and produced
        assert by_id[row["id"]]["input_ids"] == row["prompt_token_ids"] + row["response_token_ids"]
        assert by_id[row["id"]]["loss_mask"][len(row["prompt_token_ids"]):] == [1] * len(row["response_token_ids"])
    assert supervised_text(tok, by_id["a"]) == "Idea 1 is simple.<|im_end|>"
    # both assistant turns of the tool conversation: the source's tool call, as SGLang renders it (the
    # arguments as an object), and the generated answer
    call = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "C4"}}\n</tool_call><|im_end|>\n'
    assert supervised_text(tok, by_id["t"]) == call + "It is 4 degrees.<|im_end|>"
    # and nothing else: the unsupervised tokens decode to the server's prompt minus the earlier call
    rest = tok.decode([t for t, m in zip(by_id["t"]["input_ids"], by_id["t"]["loss_mask"]) if not m])
    assert rest == tok.decode(rows[1]["prompt_token_ids"]).replace(call, "", 1)
    assert "<tools>" in rest and '"defer_loading": null' in rest  # tools reached the template in SGLang's form
    r = by_id["t"]
    assert r["num_tokens"] == len(r["input_ids"]) and r["num_supervised"] == sum(r["loss_mask"])


def test_supervise_last_only(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    msgs, tools = hermes_prompt()
    cfg = make(tmp_path, tiny_tokenizer, [generated(tok, "t", msgs, "It is 4 degrees.", tools=tools)],
               tokenize={"supervise": "last"})
    _man, out = shard_rows(run_tokenize(cfg)["dir"])
    assert supervised_text(tok, out[0]) == "It is 4 degrees.<|im_end|>"


def test_tool_rows_render_as_sglang_does_so_none_is_dropped(tmp_path, tiny_tokenizer):
    """A plain re-render (tools as sent, arguments as strings) would differ from the server's prompt on every
    tool row; SGLang's normalisation here makes each one match, with tool_choice none (no tools) too."""
    tok = load_tokenizer(tiny_tokenizer)
    msgs, tools = hermes_prompt()
    bare = [{"type": "function", "function": {"name": "ping"}}]
    plain = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True,
                                    enable_thinking=False)
    rows = [generated(tok, "t", msgs, "It is 4 degrees.", tools=tools),
            generated(tok, "bare", [{"role": "user", "content": "ping it"}], "Pinged.", tools=bare)]
    assert tok.backend_tokenizer.encode(plain, add_special_tokens=False).ids != rows[0]["prompt_token_ids"]
    cfg = make(tmp_path, tiny_tokenizer, rows, tokenize={"prompt_check": "drop"})
    res = run_tokenize(cfg)
    assert res["rows_out"] == 2 and res["prompt_check"]["mismatched"] == 0 and res["skipped_rows"] == {}
    none_rows = [generated(tok, "n", msgs, "It is 4 degrees.", tools=tools, tool_choice="none")]
    cfg = make(tmp_path, tiny_tokenizer, none_rows, tokenize={"prompt_check": "fail"},
               generate={"tool_choice": "none"})
    man, out = shard_rows(run_tokenize(cfg, force=True)["dir"])
    assert man["prompt_check"]["matched"] == 1 and "<tools>" not in tok.decode(out[0]["input_ids"])


def test_generated_rows_without_server_ids_are_counted_not_rendered(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    old = generated(tok, "old", [{"role": "user", "content": "hi"}], "Idea is simple.")
    del old["prompt_token_ids"], old["response_token_ids"]
    cut = generated(tok, "bad", [{"role": "user", "content": "hi"}], "Idea is simple.", response_token_ids="x")
    cfg = make(tmp_path, tiny_tokenizer, [old, cut, generated(tok, "ok", [{"role": "user", "content": "hi"}], "Fine.")])
    res = run_tokenize(cfg)
    assert res["rows_out"] == 1 and res["skipped_rows"] == {"no_server_token_ids": 2}


def test_truncation_and_rows_without_a_supervised_pair(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    long_user = "Explain idea number in plain words. " * 20
    rows = [
        generated(tok, "short", [{"role": "user", "content": "hi"}], "Idea is simple and it is degrees."),
        generated(tok, "cut", [{"role": "user", "content": long_user}], "Idea."),  # answer past max_length
        generated(tok, "empty", [{"role": "user", "content": "hi"}], " "),
    ]
    cfg = make(tmp_path, tiny_tokenizer, rows, max_length=40)
    res = run_tokenize(cfg)
    man, out = shard_rows(res["dir"])
    assert [r["id"] for r in out] == ["short"]
    assert man["skipped"] == {"no_supervised_pair": 1, "empty_response": 1} and man["truncated"] == 1
    assert all(len(r["input_ids"]) <= 40 for r in out)


def test_prompt_check_counts_by_reason_and_never_remasks(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    msgs, tools = hermes_prompt()
    user = [{"role": "user", "content": "Explain idea number 2 in plain words."}]

    def swap_one(ids):
        ids[3] = ids[3] + 1
        return ids

    rows = [generated(tok, "ok", user, "Fine answer here."),
            generated(tok, "longer", user[:], "Another fine answer.", edit_prompt=lambda ids: ids + [5, 5, 5]),
            generated(tok, "swapped", msgs, "It is 4 degrees.", tools=tools, edit_prompt=swap_one)]
    cfg = make(tmp_path, tiny_tokenizer, rows)
    res = run_tokenize(cfg)
    assert res["rows_out"] == 3 and res["prompt_check"] == {"checked": 3, "matched": 1, "mismatched": 2}
    man, out = shard_rows(res["dir"])
    pc = man["prompt_check"]
    assert pc["reasons"] == {"length_differs": 1, "ids_differ": 1} and pc["max_abs_diff"] == 3
    assert {e["id"]: (e["reason"], e["first_difference"]) for e in pc["examples"]} == {
        "longer": ("length_differs", len(rows[1]["prompt_token_ids"]) - 3), "swapped": ("ids_differ", 3)}
    by_id = {r["id"]: r for r in out}
    for row in rows[1:]:  # kept (warn) with the server's ids, only the generated ids supervised
        got = by_id[row["id"]]
        assert got["input_ids"] == row["prompt_token_ids"] + row["response_token_ids"]
        assert got["loss_mask"] == [0] * len(row["prompt_token_ids"]) + [1] * len(row["response_token_ids"])
    assert man["earlier_turns_unsupervised"] == 1  # the swapped row's earlier tool call
    cfg.tokenize.prompt_check = "drop"
    res = run_tokenize(cfg, force=True)
    assert res["rows_out"] == 1 and res["skipped_rows"] == {"prompt_token_mismatch": 2}
    cfg.tokenize.prompt_check_tolerance = 3  # a length difference within it gets through drop, still counted
    res = run_tokenize(cfg, force=True)
    assert res["rows_out"] == 2 and res["skipped_rows"] == {"prompt_token_mismatch": 1}
    assert res["prompt_check"]["mismatched"] == 2
    cfg.tokenize.prompt_check, cfg.tokenize.prompt_check_tolerance = "fail", 0
    with pytest.raises(DatagenError, match="tokenize.prompt_check: row longer: .* from position"):
        run_tokenize(cfg, force=True)
    # a failed run leaves the previous shards in place
    assert shard_rows(res["dir"])[0]["rows_out"] == 2


def test_bad_rows_torn_tail_duplicates_and_shards(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    rows = [generated(tok, f"r{i}", [{"role": "user", "content": f"Explain idea number {i}."}], "It is simple.")
            for i in range(5)]
    rows.append(dict(rows[0]))  # duplicate id
    rows.append({"id": "noans", "messages": [{"role": "user", "content": "x"}]})
    rows.append({"no": "id"})
    cfg = make(tmp_path, tiny_tokenizer, rows, torn='{"id": "torn", "messa', tokenize={"shard_rows": 2})
    res = run_tokenize(cfg)
    man, out = shard_rows(res["dir"])
    assert [r["id"] for r in out] == [f"r{i}" for i in range(5)]
    assert len(man["shards"]) == 3
    assert man["skipped"] == {"duplicate_id": 1, "no_assistant_turn": 1, "malformed_row": 1}
    assert run_tokenize(cfg)["skipped"] is True


def test_tokenizer_errors(tmp_path, tiny_tokenizer):
    cfg = make(tmp_path, tiny_tokenizer, [])
    cfg.tokenizer = str(tmp_path / "nope")
    with pytest.raises(DatagenError, match="tokenizer: cannot load"):
        run_tokenize(cfg)
    cfg.tokenizer = None
    with pytest.raises(DatagenError, match="tokenizer: is required"):
        run_tokenize(cfg)
    os.unlink(os.path.join(cfg.work_dir, "generated.jsonl"))
    cfg.tokenizer = tiny_tokenizer
    with pytest.raises(DatagenError, match="run `python -m datagen generate` first"):
        run_tokenize(cfg)


def test_mask_from_offsets_boundaries():
    offsets = [(0, 2), (2, 5), (5, 6), (6, 9), (9, 9)]
    assert mask_from_offsets(offsets, [(2, 6)]) == [0, 1, 1, 0, 0]
    assert mask_from_offsets(offsets, [(0, 2), (6, 10)]) == [1, 0, 0, 1, 1]
    assert mask_from_offsets(offsets, []) == [0] * 5


QWEN3_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_history_rendered_differently_leaves_earlier_turns_unsupervised(tmp_path, tiny_tokenizer):
    """A Qwen3-like template drops the empty think block from earlier turns: only the last turn is masked."""
    tok = load_tokenizer(tiny_tokenizer)
    tok.chat_template = QWEN3_LIKE
    qdir = str(tmp_path / "qwen3like")
    tok.save_pretrained(qdir)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "earlier answer"},
            {"role": "user", "content": "and now?"}]
    cfg = make(tmp_path, qdir, [generated(tok, "m", msgs, "It is simple.")])
    res = run_tokenize(cfg)
    man, out = shard_rows(res["dir"])
    assert res["rows_out"] == 1 and man["earlier_turns_unsupervised"] == 1
    assert supervised_text(tok, out[0]) == "It is simple.<|im_end|>"
    assert man["prompt_check"]["matched"] == 1  # the generation prompt carries the think block, as the server's


def test_rows_of_prompts_dropped_by_a_later_prepare_are_left_out(tmp_path, tiny_tokenizer):
    tok = load_tokenizer(tiny_tokenizer)
    rows = [generated(tok, f"r{i}", [{"role": "user", "content": f"Explain idea number {i}."}], "It is simple.")
            for i in range(4)]
    cfg = make(tmp_path, tiny_tokenizer, rows)
    with open(os.path.join(cfg.work_dir, "prompts.jsonl"), "w") as fh:
        for r in rows[:3]:
            fh.write(json.dumps({"id": r["id"], "messages": r["messages"][:1]}) + "\n")
    man, out = shard_rows(run_tokenize(cfg)["dir"])
    assert [r["id"] for r in out] == ["r0", "r1", "r2"] and man["skipped"] == {"not_in_prompts": 1}
