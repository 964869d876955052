"""Role sglang_datagen's request checks and parser choice, run for real by ansible-playbook on localhost.

Only the role's own task files run (``include_role: tasks_from``), with its defaults and vars; nothing is
installed or started: these tasks only compute and assert.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakegpu_harness import NVIDIA_SMI, FakeGpus

from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

BIN = Path(sys.executable).parent
# a model directory with the files the validation pass looks for (config, tokenizer, weights)
MODEL = str(ROOT / "tests" / "unit" / "sglang_datagen" / "fixtures" / "models" / "Qwen3-8B")


@pytest.fixture(autouse=True)
def gpu_node(tmp_path_factory, monkeypatch):
    """localhost as a GPU node for the validation pass's node check: the lab's fake nvidia-smi first on PATH,
    eight fake GPUs behind it (driver 580.95.05, CUDA 13.0, unless a test says otherwise)."""
    base = tmp_path_factory.mktemp("gpu-node")
    fake = FakeGpus(str(base), driver=False)
    (base / "bin").mkdir()
    (base / "bin" / "nvidia-smi").symlink_to(NVIDIA_SMI)
    monkeypatch.setenv("FAKEGPU_DIR", fake.dir)
    monkeypatch.setenv("PATH", "%s:%s" % (base / "bin", os.environ.get("PATH", "")))
    yield fake
    fake.close()


def run_tasks(tmp_path: Path, tasks_from: str, role_vars: dict, show: str = "") -> subprocess.CompletedProcess:
    play = [{"name": "role tasks", "hosts": "localhost", "gather_facts": False, "connection": "local",
             "tasks": [{"ansible.builtin.include_role": {"name": "gpuops.repurpose.sglang_datagen",
                                                         "tasks_from": tasks_from}, "vars": role_vars}]
             + ([{"ansible.builtin.debug": {"msg": "SHOW={{ " + show + " | to_json }}"}}] if show else [])}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(playbook)], capture_output=True,
                          text=True, timeout=120, cwd=str(ROOT), env=env, check=False)


def shown(done: subprocess.CompletedProcess):
    line = next(line for line in done.stdout.splitlines() if "SHOW=" in line)
    return json.loads(line.split("SHOW=", 1)[1].rstrip("'\""))


def fatal_message(done: subprocess.CompletedProcess) -> str:
    """The failed task's msg (the YAML callback folds it over several lines)."""
    return done.stdout[done.stdout.index("fatal:"):].split("    msg:", 1)[1].split("\n\n", 1)[0]


def test_extra_body_keys_the_router_drops_are_refused_up_front(tmp_path):
    done = run_tasks(tmp_path, "check_requests.yml",
                     {"sglang_datagen_config": {"generate": {"extra_body": {"return_token_ids": True, "top_k": 5,
                                                                            "rid": "x"}}}})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert "generate.extra_body has return_token_ids, rid: sglang-router 0.3.2 drops" in msg, msg
    assert "sglang_datagen_use_router=false" in msg
    # without the router the workers get every field: accepted
    ok = run_tasks(tmp_path, "check_requests.yml",
                   {"sglang_datagen_use_router": False,
                    "sglang_datagen_config": {"generate": {"extra_body": {"return_token_ids": True}}}})
    assert ok.returncode == 0, ok.stdout[-2000:]


def test_a_seed_is_refused_unless_the_workers_sample_deterministically(tmp_path):
    config = {"sampling": {"seed": 7, "temperature": 0.7}}
    done = run_tasks(tmp_path, "check_requests.yml", {"sglang_datagen_config": config})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert "sampling.seed is set, but SGLang 0.5.23 ignores" in msg and "--enable-deterministic-inference" in msg
    ok = run_tasks(tmp_path, "check_requests.yml", {"sglang_datagen_config": config,
                                                    "sglang_datagen_worker_extra_args":
                                                        ["--enable-deterministic-inference"]})
    assert ok.returncode == 0, ok.stdout[-2000:]


@pytest.mark.parametrize("model, extra, want", [
    ("Qwen/Qwen3-8B", [], ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen"]),
    ("/models/Qwen3-Coder-30B-A3B-Instruct", [], ["--tool-call-parser", "qwen3_coder"]),
    ("meta-llama/Llama-3.1-8B-Instruct", [], ["--tool-call-parser", "llama3"]),
    ("/srv/models/some-other-model", [], []),
    ("Qwen/Qwen3-8B", ["--tool-call-parser", "hermes"], ["--reasoning-parser", "qwen3"]),  # the user's flag wins
])
def test_parsers_follow_the_model_family(tmp_path, model, extra, want):
    done = run_tasks(tmp_path, "parsers.yml", {"sglang_datagen_model_path": model,
                                               "sglang_datagen_worker_extra_args": extra},
                     show="sglang_datagen__parser_args")
    assert done.returncode == 0, done.stdout[-2000:]
    assert shown(done) == want


def test_parsers_can_be_set_or_switched_off(tmp_path):
    done = run_tasks(tmp_path, "parsers.yml", {"sglang_datagen_model_path": "Qwen/Qwen3-8B",
                                               "sglang_datagen_reasoning_parser": "",
                                               "sglang_datagen_tool_call_parser": "hermes"},
                     show="sglang_datagen__parser_args")
    assert done.returncode == 0, done.stdout[-2000:]
    assert shown(done) == ["--tool-call-parser", "hermes"]


def test_python_older_than_3_11_is_refused_in_the_validation_pass(tmp_path):
    # Ubuntu 22.04's interpreter as the node check sees it (no 3.10 on this machine to run): it answers the
    # version probe with 3.10. The validation pass must stop there, before anything is created or stopped.
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 3.10.12\n")
    old.chmod(0o755)
    home = tmp_path / "datagen"
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_python": str(old), "sglang_datagen_home": str(home),
                                                "sglang_datagen_model_path": MODEL,
                                                "sglang_datagen_config": _pipeline_config(tmp_path)})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert "This node cannot run SGLang 0.5.23; nothing was stopped or installed:" in msg, msg
    assert f"{old} is Python 3.10; the wheels need Python >= 3.11" in msg, msg
    assert "Fix: point sglang_datagen_python at an interpreter in the range" in msg, msg
    assert "NVIDIA driver" not in msg and not home.exists()


def test_an_r570_driver_is_refused_naming_what_sglang_needs(tmp_path, gpu_node):
    gpu_node.config(driver_version="570.124.06", cuda_version="12.8")
    vars_ = {"sglang_datagen_model_path": MODEL, "sglang_datagen_config": _pipeline_config(tmp_path)}
    done = run_tasks(tmp_path, "validate.yml", vars_)
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert "NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds" in msg, msg
    assert "Fix: upgrade the NVIDIA driver on the PVE host" in msg and "sglang_datagen_sglang_version" in msg, msg
    # serving something else (no SGLang installed): the driver is not SGLang's concern
    ok = run_tasks(tmp_path, "validate.yml", dict(vars_, sglang_datagen_install_sglang=False))
    assert ok.returncode == 0, ok.stdout[-3000:]


def _pipeline_config(tmp_path: Path) -> dict:
    """A config the pipeline's own validator accepts, its input files present on localhost."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "src.jsonl").write_text("")
    return {"tokenizer": str(tmp_path / "tok"), "target_total": 100, "target_mix": {"general": 1.0},
            "sources": [{"name": "lab", "adapter": "messages", "category": "general", "path": str(tmp_path / "src.jsonl")}]}


@pytest.mark.parametrize("concurrency, generate", [
    ("auto", {"concurrency": "auto"}),  # the default: the pipeline follows the workers' load
    (64, {"concurrency": 512}),  # fixed per worker: the router stands for all eight workers
])
def test_concurrency_goes_into_the_pipeline_config(tmp_path, concurrency, generate):
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL,
                                                "sglang_datagen_concurrency": concurrency,
                                                "sglang_datagen_config": _pipeline_config(tmp_path)},
                     show="sglang_datagen__config.generate | dict2items | rejectattr('key', 'eq', 'workers') "
                          "| items2dict")  # the workers: the test below (one line, or it is folded)
    assert done.returncode == 0, done.stdout[-3000:]
    # with the switch the Qwen3 family's chat template reads for generate.thinking
    assert shown(done) == dict(generate, thinking_switch="enable_thinking")


@pytest.mark.parametrize("role_vars, workers", [
    ({}, ["http://127.0.0.1:31000", "http://127.0.0.1:31007"]),  # the first and the eighth (one line, not folded)
    ({"sglang_datagen_use_router": False}, None),  # `servers` lists the workers themselves: nothing to watch
])
def test_behind_the_router_the_pipeline_config_lists_every_worker(tmp_path, role_vars, workers):
    # generate checks that the router routes to each of them, and registers a ready one it dropped (gen/fleet.py)
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL, **role_vars,
                                                "sglang_datagen_config": _pipeline_config(tmp_path)},
                     show="((sglang_datagen__config.generate.workers | default([]) | batch(7) | map('first') | list)"
                          " or None)")
    assert done.returncode == 0, done.stdout[-3000:]
    assert shown(done) == workers


def test_a_bad_concurrency_is_refused_with_the_fix(tmp_path):
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL,
                                                "sglang_datagen_concurrency": "fast"})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert 'sglang_datagen_concurrency="fast": set auto' in msg and "a whole number >= 1" in msg, msg


@pytest.mark.parametrize("ports, named", [
    ({"sglang_datagen_router_metrics_port": 29000}, "sglang_datagen_router_metrics_port=29000"),  # sglang-router's own
    ({"sglang_datagen_router_port": 22000}, "sglang_datagen_router_port=22000"),
    ({"sglang_datagen_worker_base_port": 29990}, "sglang_datagen_worker_base_port=29990-29997"),  # 8 workers
])
def test_a_serving_port_in_sglangs_nccl_range_is_refused(tmp_path, ports, named):
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL, **ports,
                                                "sglang_datagen_config": _pipeline_config(tmp_path)})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert named + ": in 22000-29999" in msg and "from 30000 to 32767" in msg, msg


def test_the_default_ports_and_a_router_less_metrics_port_pass_the_nccl_check(tmp_path):
    config = _pipeline_config(tmp_path)
    for extra in ({}, {"sglang_datagen_use_router": False, "sglang_datagen_router_metrics_port": 29000}):
        done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL, **extra,
                                                    "sglang_datagen_config": config})
        assert done.returncode == 0, done.stdout[-3000:]


def test_uv_gets_prereleases_and_the_indexes_pip_is_configured_with(tmp_path, monkeypatch):
    """A node with uv and a pip mirror (PIP_INDEX_URL): the role installs with uv, which reads neither pip.conf nor
    PIP_*, so the mirror and SGLang's --prerelease=allow must be on uv's command line. A recording uv stands in
    for the real one (the install itself is the resolver test's); the venv, pip and its config are real."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "uv-calls.jsonl"
    (bin_dir / "uv").write_text(
        "#!%s\nimport json, os, sys\nwith open(%r, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'cert': os.environ.get('SSL_CERT_FILE')}) + '\\n')\n"
        "print('Installed 1 package', file=sys.stderr)\n" % (sys.executable, str(calls)))
    (bin_dir / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.example.internal/simple")
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/corp.pem")
    home = tmp_path / "datagen"
    done = run_tasks(tmp_path, "install.yml", {"sglang_datagen_python": sys.executable, "sglang_datagen_home": str(home)})
    assert done.returncode == 0, done.stdout[-3000:]
    installs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(installs) == 1, installs
    argv = installs[0]["argv"]
    assert argv[:4] == ["pip", "install", "--python", f"{home}/venv/bin/python"], argv
    assert "--prerelease=allow" in argv
    assert argv[argv.index("--index-url") + 1] == "https://pypi.example.internal/simple", argv
    assert argv[-3:] == ["sglang-router==0.3.2", "-r", f"{home}/requirements-datagen.txt"], argv
    assert installs[0]["cert"] == "/etc/ssl/corp.pem"


def test_a_gpu_the_node_does_not_have_is_refused_before_anything(tmp_path):
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": MODEL,
                                                "sglang_datagen_gpus": list(range(10)),
                                                "sglang_datagen_config": _pipeline_config(tmp_path)})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert "names GPU(s) 8, 9, which this node does not have (nvidia-smi lists 0, 1, 2, 3, 4, 5, 6, 7)" in msg, msg


@pytest.mark.parametrize("extra, named", [
    (["--config", "/etc/sglang.yaml"], "--config"),
    (["--mem-fraction-static", "0.8", "--api-key=abc"], "--api-key"),
])
def test_a_workers_own_key_flag_is_refused_when_the_role_keys_them(tmp_path, extra, named):
    """Workers other nodes reach take the role's key from their own 0600 SGLang config file: a --config or
    --api-key of the user's would clash with it or put a key in every process listing."""
    role_vars = {"sglang_datagen_model_path": MODEL, "sglang_datagen_worker_extra_args": extra,
                 "sglang_datagen_config": _pipeline_config(tmp_path)}
    done = run_tasks(tmp_path, "validate.yml", {**role_vars, "sglang_datagen_host": "gpu1.example.internal"})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert f"sglang_datagen_worker_extra_args has {named}, which the role sets itself" in msg, msg
    assert "sglang_datagen_api_key" in msg
    # on loopback the workers take no key: their own flags are theirs
    ok = run_tasks(tmp_path, "validate.yml", role_vars)
    assert ok.returncode == 0, ok.stdout[-3000:]


@pytest.mark.parametrize("model, generate, says", [
    # DeepSeek-V3.1's template reads `thinking`: the family's switch goes to the pipeline, which sends it
    ("deepseek-ai/DeepSeek-V3.1-Terminus", {"thinking": True}, {"thinking": True, "thinking_switch": "thinking"}),
    # the user's own switch wins over the family's
    ("deepseek-ai/DeepSeek-V3.1", {"thinking_switch": "enable_thinking"}, {"thinking_switch": "enable_thinking"}),
    # a family without a switch gets none: generate sends nothing for it
    ("meta-llama/Llama-3.1-8B-Instruct", {}, {"thinking_switch": "none"}),
    # an unknown one keeps the pipeline's default (enable_thinking: false, which other templates ignore)
    ("acme/some-other-model", {}, {}),
])
def test_the_familys_thinking_switch_reaches_the_pipeline_config(tmp_path, model, generate, says):
    config = dict(_pipeline_config(tmp_path), generate=generate)
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": model, "sglang_datagen_config": config},
                     show="sglang_datagen__config.generate | dict2items | rejectattr('key', 'eq', 'workers') "
                          "| items2dict")
    assert done.returncode == 0, done.stdout[-3000:]  # the pipeline's own check-config passed it too
    got = shown(done)
    assert {k: got[k] for k in ("thinking", "thinking_switch") if k in got} == says, got


def test_thinking_with_an_unknown_template_switch_is_refused_in_the_validation_pass(tmp_path):
    config = dict(_pipeline_config(tmp_path), generate={"thinking": True})
    done = run_tasks(tmp_path, "validate.yml", {"sglang_datagen_model_path": "acme/drafter-target",
                                                "sglang_datagen_config": config})
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert ("sglang_datagen_config.generate.thinking is true, but sglang_datagen_parser_families does not say which "
            "kwarg switches thinking in the chat template of drafter-target (no entry matches it)") in msg, msg
    assert "Give the entry for this model thinking:" in msg and "sglang_datagen_config.generate.thinking_switch" in msg
    # refused by the role, before the pipeline's own check (whose message names no role variable)
    assert "check-config" not in msg


@pytest.mark.parametrize("model, generate, says", [
    ("Qwen/Qwen3-8B", {"thinking": True}, None),
    ("acme/my-model", {"thinking": True}, 'its entry "my-model" has no thinking'),  # an entry without a switch
    ("Qwen/Qwen2.5-7B-Instruct", {"thinking": True}, "the chat template of qwen2.5-7b-instruct has no thinking switch"),
    ("deepseek-ai/DeepSeek-R1-0528", {}, "the chat template of deepseek-r1-0528 always thinks"),
    ("deepseek-ai/DeepSeek-R1-0528", {"thinking": True}, None),
    ("acme/my-model", {"thinking": True, "thinking_switch": "reasoning"}, None),  # the fix without a table entry
])
def test_the_thinking_check_follows_the_familys_switch(tmp_path, model, generate, says):
    role_vars = {"sglang_datagen_model_path": model, "sglang_datagen_config": {"generate": generate}}
    if "my-model" in model:
        role_vars["sglang_datagen_parser_families"] = [{"match": "my-model", "reasoning": "", "tool_call": ""}]
    done = run_tasks(tmp_path, "check_requests.yml", role_vars)
    if says is None:
        assert done.returncode == 0, done.stdout[-2000:]
        return
    assert done.returncode != 0
    msg = " ".join(fatal_message(done).split())
    assert says in msg, msg


def _with_existing(tmp_path: Path, mix: dict, rows: list, extra_files: bool) -> dict:
    """The pipeline config with an existing set (ROWS, JSON Lines): on "the node" (localhost) or, with EXTRA_FILES,
    brought by sglang_datagen_extra_files from "the controller" (both localhost here, different paths)."""
    config = _pipeline_config(tmp_path)
    existing = tmp_path / ("controller-existing.jsonl" if extra_files else "existing.jsonl")
    existing.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config.update(target_mix=mix, existing_dataset={"path": str(tmp_path / "existing.jsonl")})
    role_vars = {"sglang_datagen_model_path": MODEL, "sglang_datagen_config": config}
    if extra_files:
        role_vars["sglang_datagen_extra_files"] = [{"src": str(existing), "dest": str(tmp_path / "existing.jsonl")}]
    return role_vars


EXISTING = [{"category": "coding", "messages": []}] * 3 + [{"category": "general", "messages": []}]


@pytest.mark.parametrize("extra_files", [False, True], ids=["on-the-node", "brought-by-extra-files"])
def test_a_target_mix_category_nothing_supplies_is_refused_naming_the_closest(tmp_path, extra_files):
    """"codng" is a typo of the existing set's "coding": it would be planned for and get 0 rows, and coding would
    have no target. Refused in the validation pass, naming the category the existing set has."""
    role_vars = _with_existing(tmp_path, {"codng": 0.4, "general": 0.6}, EXISTING, extra_files)
    done = run_tasks(tmp_path, "validate.yml", role_vars)
    assert done.returncode != 0, done.stdout[-3000:]
    msg = " ".join(fatal_message(done).split())
    assert "sglang_datagen_config.target_mix asks for what the run cannot supply" in msg, msg
    assert ("target_mix.codng: no source supplies it and the existing set does not have it (categories there "
            "are: coding, general) (did you mean coding?)") in msg, msg


def test_an_existing_category_target_mix_leaves_out_is_a_warning(tmp_path):
    """Rows of a category the mix does not name pass through the merge untouched: allowed, and said."""
    done = run_tasks(tmp_path, "validate.yml", _with_existing(tmp_path, {"general": 1.0}, EXISTING, False))
    assert done.returncode == 0, done.stdout[-3000:]
    out = " ".join(done.stdout.split())
    assert "WARNING: sglang_datagen_config:" in out
    assert "target_mix leaves out coding, a category of the existing set: its rows pass through the merge" in out, \
        out[-2000:]


def test_unlabelled_existing_rows_supply_the_guessed_categories(tmp_path):
    """Rows without a label get the pipeline's keyword guess (coding, math or general): a mix of those passes."""
    rows = [{"messages": [{"role": "user", "content": "solve the equation"}]}]
    done = run_tasks(tmp_path, "validate.yml", _with_existing(tmp_path, {"math": 0.5, "general": 0.5}, rows, False))
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_role_serves_on_free_gpus_and_refuses_busy_ones(tmp_path, gpu_node):
    """tasks/gpus_free.yml against the fake nvidia-smi: eight free GPUs pass (nothing is said); GPU 2 held stops
    the role, naming the GPU and its holder, before anything is installed. (On a machine running the lab, the lab
    containers' trainers hold device files too and are named as well: this machine sees their processes.)"""
    free = run_tasks(tmp_path, "gpus_free.yml", {})
    assert free.returncode == 0, free.stdout[-3000:]
    assert "are in use" not in free.stdout
    holder = gpu_node.hold([2], mib=40000)
    try:
        done = run_tasks(tmp_path, "gpus_free.yml", {})
    finally:
        gpu_node.kill(holder)
    assert done.returncode != 0, done.stdout[-3000:]
    msg = " ".join(fatal_message(done).split())
    assert "sglang_datagen_gpus=[0, 1, 2, 3, 4, 5, 6, 7] are in use (GPU 2, held by pid " in msg, msg
    # its argv from the start, cut at 100 characters (how much of fakegpu.py's path fits depends on the checkout's)
    assert f"pid {holder.pid} python [{' '.join(holder.args)[:100]}]" in msg, msg
    assert "Stop that job first" in msg and msg.endswith("Nothing was installed or started.")
