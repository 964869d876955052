"""Fixture rows in the real Hugging Face schemas, and small file writers, for the datagen tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.paths import DATAGEN_FILES

FILES = str(DATAGEN_FILES)


def run_cli(*args, timeout=120):
    """``python -m datagen ARGS`` in a real subprocess, as the role runs it (the package from the role's files)."""
    env = dict(os.environ, PYTHONPATH=FILES)
    return subprocess.run([sys.executable, "-m", "datagen", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd="/", check=False)


def write_jsonl(path, rows, raw_lines=()):
    """Rows as JSON lines, then ``raw_lines`` verbatim (malformed input)."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
        for line in raw_lines:
            fh.write(line + "\n")
    return str(path)


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


# ------------------------------------------------------------ rows in the real Hub schemas

def infinity_row(i, text=None, lang="en", cate=("natural language processing and understanding",)):
    return {
        "id": f"ii-{i}",
        "conversations": [
            {"from": "human", "value": text or f"Explain idea number {i} in plain words."},
            {"from": "gpt", "value": f"Idea {i} is simple."},
        ],
        "label": {"ability_en": ["explanation"], "ability_zh": ["解释"], "cate_ability_en": list(cate),
                  "cate_ability_zh": ["自然语言处理与理解"]},
        "langdetect": lang,
        "source": "Subjective",
    }


def webinstruct_row(i):
    return {"orig_question": f"q{i}", "orig_answer": "a", "question": f"Why does ice float on water? ({i})",
            "answer": "Density.", "source": "socratic", "index": i}


def codefeedback_row(i):
    return {"query": f"Write a Python function that returns {i} squared.", "answer": "def f(): ...",
            "resource": "wizardcoder", "lang": "python"}


def metamath_row(i):
    return {"type": "GSM_Rephrased", "query": f"What is {i} plus {i}?", "original_question": "x",
            "response": f"The answer is: {2 * i}"}


HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> "
    "XML tags.\n<tools>\n[{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Weather.', "
    "'parameters': {'type': 'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']}}}]\n"
    "</tools>\nFor each function call return a json object ... <tool_call>\n{'arguments': <args-dict>, "
    "'name': <function-name>}\n</tool_call>\n"
)


def hermes_row(i, with_tools_column=False, multi_turn=True):
    conv = [
        {"from": "system", "value": HERMES_SYSTEM},
        {"from": "human", "value": f"What is the weather in city {i}?"},
        {"from": "gpt", "value": f"<tool_call>\n{{'arguments': {{'city': 'C{i}'}}, 'name': 'get_weather'}}\n</tool_call>\n"},
    ]
    if multi_turn:
        conv += [
            {"from": "tool", "value": f'<tool_response>\n{{"name": "get_weather", "content": {{"temp": {i}}}}}\n</tool_response>\n'},
            {"from": "gpt", "value": f"It is {i} degrees."},
        ]
    row = {"id": f"h-{i}", "conversations": conv, "category": "Weather", "subcategory": "API", "task": "Weather"}
    if with_tools_column:
        row["tools"] = json.dumps([{"type": "function", "function": {"name": "get_weather", "description": "W",
                                                                     "parameters": {"type": "object"}}}])
    return row


def orca_row(i):
    return {"messages": json.dumps([
        {"role": "system", "content": ""},
        {"role": "user", "content": f"Plan the steps to rename file {i} in a repository."},
        {"role": "assistant", "content": "1. git mv ..."},
    ])}


def agentinstruct_row(i):
    return {"id": f"os_{i}", "conversations": [
        {"from": "human", "value": f"You are an agent in a Linux shell. Task {i}: count files.", "loss": None},
        {"from": "gpt", "value": "Think: use ls.\nAct: bash\n```bash\nls | wc -l\n```", "loss": True},
        {"from": "human", "value": f"The output of the OS:\n{i}", "loss": None},
        {"from": "gpt", "value": f"Act: answer({i})", "loss": True},
    ]}


MIX = {"coding": 0.4, "math": 0.2, "science": 0.1, "general": 0.1, "tool_use": 0.1, "agent": 0.1}


# (source name, adapter, file, row maker): one local file per adapter, Parquet for two of them
SIX = (
    ("infinity", "infinity_instruct", "ii.parquet", infinity_row),
    ("webinstruct", "webinstruct", "wi.jsonl", webinstruct_row),
    ("codefeedback", "codefeedback", "cf.jsonl", codefeedback_row),
    ("metamath", "metamath", "mm.parquet", metamath_row),
    ("hermes", "hermes_fc", "h.jsonl", hermes_row),
    ("orca_agent", "orca_agentinstruct", "oa.jsonl", orca_row),
)


def six_sources(tmp_path, n=20):
    """One local file per adapter, in the real schemas, n rows each (Parquet for two of them)."""
    d = tmp_path / "src"
    d.mkdir(exist_ok=True)
    return [{"name": name, "adapter": adapter,
             "path": (write_parquet if file.endswith(".parquet") else write_jsonl)(d / file, [row(i) for i in range(n)])}
            for name, adapter, file, row in SIX]


def write_config(tmp_path, sources, **top):
    import yaml

    cfg = {"work_dir": str(tmp_path / "work"), "model": "target-model", "target_total": 60, "target_mix": MIX,
           "sources": sources, "servers": ["http://127.0.0.1:30000"], "seed": 7, "max_length": 256}
    cfg.update(top)
    path = tmp_path / "datagen.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return str(path)


def build_tiny_tokenizer(out_dir):
    """A byte-level BPE tokenizer with a ChatML chat template (tools aware), built locally: no Hub.

    The builder lives in tests/lab/tokenizer/build_tokenizer.py, shared with the lab (the same
    tokenizer is deployed into CT200 and used by the SGLang stand-in to count prompt tokens).
    """
    from build_tokenizer import build_tokenizer

    return build_tokenizer(str(out_dir))


# ------------------------------------------------------------ generated rows, as an SGLang server makes them

def server_prompt_ids(tok, messages, tools=None, tool_choice="auto", **kwargs):
    """The prompt ids an SGLang server makes of this request (the stand-in's normalisation, checked against
    fixtures recorded from sglang's classes in test_sglang_chat.py)."""
    body = {"messages": messages, "tool_choice": tool_choice}
    if tools:
        body["tools"] = tools
    from standin import sglang_template_inputs  # the stand-in's own reading of SGLang's normalisation

    msgs, tls = sglang_template_inputs(body)
    text = tok.apply_chat_template(msgs, tools=tls, tokenize=False, add_generation_prompt=True,
                                   **dict({"enable_thinking": False}, **kwargs))
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def generated_row(tok, rid, messages, answer, tools=None, category="general", edit_prompt=None, tool_choice="auto",
                  **extra):
    """A row as generate writes it: the server's prompt ids (``edit_prompt`` changes them) and the ids it
    sampled for ``answer``, its stop token last."""
    prompt_ids = server_prompt_ids(tok, messages, tools, tool_choice)
    if edit_prompt is not None:
        prompt_ids = edit_prompt(list(prompt_ids))
    response_ids = tok.backend_tokenizer.encode(answer, add_special_tokens=False).ids + [IM_END(tok)]
    row = {"id": rid, "source": "s", "category": category, "messages": messages + [{"role": "assistant",
                                                                                    "content": answer}],
           "finish_reason": "stop", "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(response_ids)},
           "sampling": {"temperature": 0.7}, "server": "http://127.0.0.1:30000",
           "prompt_token_ids": prompt_ids, "response_token_ids": response_ids}
    if tools:
        row["tools"] = tools
    row.update(extra)
    return row


def IM_END(tok):  # noqa: N802
    return tok.convert_tokens_to_ids("<|im_end|>")
