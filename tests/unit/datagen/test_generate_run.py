"""generate end to end: a real stand-in server process, real files, real ``kill -9``.

Nothing here is mocked: the client talks HTTP to ``tests/lab/sglang_standin``
over loopback, and the crash tests kill a real ``python -m datagen.generate``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from harness import StandinProcess

from datagen.generate import GenerateError, read_status, run_generate, settings_from_config
from tests.support.net import free_port
from tests.support.paths import DATAGEN_FILES, DATAGEN_FIXTURES
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes

FILES = str(DATAGEN_FILES)

MODEL = "lab-model"
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}


@pytest.fixture
def standin():
    started = []

    def start(*args, model=MODEL):
        s = StandinProcess(list(args), model=model).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def make_prompts(path, n, tools_every=0, agent_every=0):
    rows = []
    for i in range(n):
        row = {"id": f"{i:024x}", "source": "src", "category": "chat",
               "messages": [{"role": "user", "content": f"Question number {i}: " + "why? " * (i % 7)}]}
        if tools_every and i % tools_every == 1:
            row["category"] = "tool"
            row["tools"] = [WEATHER_TOOL]
        if agent_every and i % agent_every == 2:
            row["category"] = "agent"
            row["tools"] = [WEATHER_TOOL]
            row["messages"] = [
                {"role": "system", "content": "You are an agent."},
                {"role": "user", "content": f"Weather in city {i}?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps({"city": f"C{i}"})}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": i})},
                {"role": "assistant", "content": "the source's old answer"},
            ]
        rows.append(row)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return rows


def config(work, servers, **generate):
    gen = {"concurrency": 16, "backoff_base": 0.01, "backoff_max": 0.05, "ready_interval": 0.05,
           "ready_timeout": 10, "fsync_interval": 0.05, "progress_interval": 0.05}
    gen.update(generate)
    return {"work_dir": str(work), "model": MODEL, "servers": servers,
            "sampling": {"max_tokens": 48, "temperature": 0.7, "seed": 1}, "generate": gen}


def write_config(work, raw):
    path = os.path.join(str(work), "datagen.yml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(raw, fh)
    return path


def start_cli(cfg_path, work):
    env = dict(os.environ, PYTHONPATH=FILES)
    return subprocess.Popen([sys.executable, "-m", "datagen.generate", "--config", cfg_path,
                             "--prompts", os.path.join(str(work), "prompts.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=str(work))


def output_rows(work):
    """Every line of the output, parsed strictly: garbage fails the test."""
    path = os.path.join(str(work), "generated.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        data = fh.read()
    assert not data or data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def count_rows(work):
    try:
        with open(os.path.join(str(work), "generated.jsonl"), "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def test_rows_carry_response_usage_sampling_server_and_explicit_thinking(tmp_path, standin):
    server = standin("--record-requests", str(tmp_path / "requests.jsonl"))
    rows = make_prompts(tmp_path / "prompts.jsonl", 60, tools_every=5, agent_every=5)
    result = run_generate(settings_from_config(config(tmp_path, [server.url])), str(tmp_path / "prompts.jsonl"),
                          str(tmp_path))
    assert result["state"] == "finished"
    assert (result["total"], result["done"], result["written"], result["errors"]) == (60, 60, 60, 0)
    out = {r["id"]: r for r in output_rows(tmp_path)}
    assert set(out) == {r["id"] for r in rows}
    for src in rows:
        got = out[src["id"]]
        assert list(got)[0] == "id"
        assert got["sampling"] == {"max_tokens": 48, "temperature": 0.7, "seed": 1}
        assert got["server"] == server.url and got["model"] == MODEL
        assert got["usage"]["completion_tokens"] > 0 and got["usage"]["prompt_tokens"] > 0
        assert got["finish_reason"] in ("stop", "length", "tool_calls")
        # the server's ids, as it counted them
        assert len(got["prompt_token_ids"]) == got["usage"]["prompt_tokens"]
        assert len(got["response_token_ids"]) == got["usage"]["completion_tokens"]
        assert (got["source"], got["category"]) == (src["source"], src["category"])
        assert got["messages"][-1]["role"] == "assistant"
        if src["category"] == "tool":  # tools passed, the model's tool call kept
            assert got["tools"] == [WEATHER_TOOL]
            assert got["finish_reason"] == "tool_calls"
            assert got["messages"][-1]["tool_calls"][0]["function"]["name"] == "get_weather"
        elif src["category"] == "agent":  # source tool results kept, the old final answer regenerated
            assert got["messages"][:4] == src["messages"][:4]
            assert len(got["messages"]) == 5
            assert got["messages"][-1]["content"] not in (None, "", "the source's old answer")
        else:
            assert got["messages"][:-1] == src["messages"]
    assert any(r["finish_reason"] == "length" for r in out.values())
    with open(tmp_path / "requests.jsonl", encoding="utf-8") as fh:
        sent = [json.loads(line) for line in fh]
    assert len(sent) == 60
    assert all(req["chat_template_kwargs"] == {"enable_thinking": False} for req in sent)
    assert all(req["model"] == MODEL and req["max_tokens"] == 48 and req["stream"] is False for req in sent)
    assert all(req["return_prompt_token_ids"] is True and req["return_token_ids"] is True for req in sent)
    with_tools = [req for req in sent if "tools" in req]
    assert len(with_tools) == 24 and all(req["tool_choice"] == "auto" for req in with_tools)
    assert sum(req["messages"][-1]["role"] == "tool" for req in sent) == 12
    # a second run has nothing to do and talks to no server
    again = run_generate(settings_from_config(config(tmp_path, ["http://127.0.0.1:9"])),
                         str(tmp_path / "prompts.jsonl"), str(tmp_path))
    assert (again["state"], again["written"], again["done"]) == ("finished", 0, 60)


def test_thinking_mode_on_keeps_reasoning(tmp_path, standin):
    server = standin("--reasoning-parser", "qwen3")  # the role passes one; without it the thinking stays in content
    make_prompts(tmp_path / "prompts.jsonl", 5)
    raw = config(tmp_path, [server.url], thinking=True)
    run_generate(settings_from_config(raw), str(tmp_path / "prompts.jsonl"), str(tmp_path))
    assert all(r["messages"][-1]["reasoning_content"] for r in output_rows(tmp_path))


def test_flaky_server_503s_and_dropped_connections_still_complete(tmp_path, standin):
    server = standin("--fail-rate", "0.2", "--drop-rate", "0.1", "--seed", "3")
    rows = make_prompts(tmp_path / "prompts.jsonl", 300, tools_every=10)
    result = run_generate(settings_from_config(config(tmp_path, [server.url], concurrency=32, retries=20)),
                          str(tmp_path / "prompts.jsonl"), str(tmp_path))
    ids = [r["id"] for r in output_rows(tmp_path)]
    assert sorted(ids) == sorted(r["id"] for r in rows)  # every id, exactly once
    assert result["errors"] == 0 and result["retries"] > 30 and result["written"] == len(ids)
    m = server.metrics()
    assert m["standin_injected_503_total"] > 20 and m["standin_dropped_total"] > 10
    assert not os.path.exists(tmp_path / "generate.errors.jsonl") or os.path.getsize(tmp_path / "generate.errors.jsonl") == 0


def test_kill_9_at_several_points_leaves_every_id_exactly_once(tmp_path, standin):
    server = standin("--latency", "0.04", "--fail-rate", "0.05")
    rows = make_prompts(tmp_path / "prompts.jsonl", 400, tools_every=9, agent_every=9)
    cfg_path = write_config(tmp_path, config(tmp_path, [server.url], concurrency=8))
    out_path = tmp_path / "generated.jsonl"
    for kill_at in (0, 30, 120, 260):
        proc = start_cli(cfg_path, tmp_path)
        try:
            if kill_at == 0:  # before the first row lands: during start-up and the readiness gate
                wait_for(lambda: os.path.exists(tmp_path / "generate.progress.json"), 30.0, "the run to start", interval=0.01)
            else:
                wait_for(lambda n=kill_at: count_rows(tmp_path) >= n, 30.0, f"{kill_at} rows", interval=0.01)
                status = read_status(str(tmp_path))  # seen from this process while the other one runs
                assert status["running"] is True and status["total"] == 400
                assert status["state"] in ("running", "waiting_for_servers")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        after = read_status(str(tmp_path))
        assert after["running"] is False
        if kill_at:
            assert after["state"] == "interrupted"
        # what a crash mid-write leaves: half a row, no newline
        with open(out_path, "ab") as fh:
            fh.write(b'{"id":"%024x","source":"src","messa' % (399 - kill_at))
    proc = start_cli(cfg_path, tmp_path)
    stdout = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, stdout.decode()
    ids = [r["id"] for r in output_rows(tmp_path)]
    assert len(ids) == len(set(ids)) == 400
    assert set(ids) == {r["id"] for r in rows}
    assert (tmp_path / "generated.jsonl.torn").exists()
    status = read_status(str(tmp_path))
    assert (status["state"], status["done"], status["total"], status["running"]) == ("finished", 400, 400, False)


def test_status_while_running_in_another_process_shows_rate_and_eta(tmp_path, standin):
    server = standin("--latency", "0.05")
    make_prompts(tmp_path / "prompts.jsonl", 2000)
    cfg_path = write_config(tmp_path, config(tmp_path, [server.url], concurrency=4))
    proc = start_cli(cfg_path, tmp_path)
    try:
        wait_for(lambda: (read_status(str(tmp_path)).get("tok_s") or 0) > 0 and count_rows(tmp_path) > 20,
                 30.0, "a rate in the progress file", interval=0.01)
        status = read_status(str(tmp_path))
        assert status["running"] and status["state"] == "running"
        assert 0 < status["done"] < status["total"] == 2000
        assert status["eta_s"] > 0 and status["req_s"] > 0 and status["in_flight"] <= 4
        proc.send_signal(signal.SIGTERM)  # systemd's stop: finish in flight, fsync, exit 0
        stdout = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout.decode()
    status = read_status(str(tmp_path))
    assert status["state"] == "stopped" and not status["running"]
    assert status["done"] == len(output_rows(tmp_path)) < 2000


def test_second_run_on_the_same_work_dir_is_refused(tmp_path, standin):
    server = standin("--latency", "0.05")
    make_prompts(tmp_path / "prompts.jsonl", 500)
    raw = config(tmp_path, [server.url], concurrency=2)
    proc = start_cli(write_config(tmp_path, raw), tmp_path)
    try:
        wait_for(lambda: count_rows(tmp_path) > 0, 30.0, "the first run", interval=0.01)
        with pytest.raises(GenerateError, match="another generate run"):
            run_generate(settings_from_config(raw), str(tmp_path / "prompts.jsonl"), str(tmp_path))
    finally:
        proc.kill()
        proc.wait()


def test_readiness_gate_waits_for_health_generate(tmp_path, standin):
    server = standin("--not-ready-for", "1.0")
    make_prompts(tmp_path / "prompts.jsonl", 20)
    result = run_generate(settings_from_config(config(tmp_path, [server.url])), str(tmp_path / "prompts.jsonl"),
                          str(tmp_path))
    assert result["written"] == 20 and result["retries"] == 0
    m = server.metrics()
    assert m["standin_health_generate_total"] > 2  # it polled
    assert m["standin_requests_while_not_ready_total"] == 0  # and sent nothing before


@pytest.mark.parametrize("args", [("--not-ready-for", "100000"), None])
def test_readiness_gate_is_bounded(tmp_path, standin, args):
    url = standin(*args).url if args else f"http://127.0.0.1:{free_port()}"  # never ready / nothing listening
    make_prompts(tmp_path / "prompts.jsonl", 5)
    with pytest.raises(GenerateError, match=r"no server became ready within generate.ready_timeout=0.5s") as err:
        run_generate(settings_from_config(config(tmp_path, [url], ready_timeout=0.5)),
                     str(tmp_path / "prompts.jsonl"), str(tmp_path))
    assert url in str(err.value)
    status = read_status(str(tmp_path))
    assert status["state"] == "failed" and "ready_timeout" in status["message"]


def test_wrong_model_name_fails_with_the_fix(tmp_path, standin):
    server = standin(model="other-model")
    make_prompts(tmp_path / "prompts.jsonl", 5)
    with pytest.raises(GenerateError, match="served model name"):
        run_generate(settings_from_config(config(tmp_path, [server.url])), str(tmp_path / "prompts.jsonl"),
                     str(tmp_path))
    assert output_rows(tmp_path) == []


def test_dead_server_in_the_list_does_not_stop_the_run(tmp_path, standin):
    live = standin()
    dead = f"http://127.0.0.1:{free_port()}"
    make_prompts(tmp_path / "prompts.jsonl", 50)
    result = run_generate(settings_from_config(config(tmp_path, [dead, live.url], ready_timeout=0.3)),
                          str(tmp_path / "prompts.jsonl"), str(tmp_path))
    assert result["written"] == 50
    assert {r["server"] for r in output_rows(tmp_path)} == {live.url}
    assert result["servers"][dead]["ready"] is False and result["servers"][dead]["last_error"]


def test_permanent_errors_and_bad_input_go_to_the_errors_file(tmp_path, standin):
    # SGLang refuses a prompt whose tokens plus max_tokens (48) exceed the context: 11 + 48 fits, so the rows
    # with i % 7 >= 3 (12 prompt tokens and more) are too long
    server = standin("--context-length", str(11 + 48))
    make_prompts(tmp_path / "prompts.jsonl", 14)
    with open(tmp_path / "prompts.jsonl", "a", encoding="utf-8") as fh:
        fh.write("not json\n" + json.dumps({"id": "no-messages", "messages": []}) + "\n")
    result = run_generate(settings_from_config(config(tmp_path, [server.url])), str(tmp_path / "prompts.jsonl"),
                          str(tmp_path))
    with open(tmp_path / "generate.errors.jsonl", encoding="utf-8") as fh:
        errors = [json.loads(line) for line in fh]
    too_long = [e for e in errors if e["status"] == 400]
    assert len(too_long) == 8 and all(e["attempts"] == 1 and "context" in e["error"] for e in too_long)
    assert {e["error"] for e in errors if e["status"] is None} == {"bad input: input line is not JSON",
                                                                   "bad input: row has no messages"}
    assert result["written"] == 6 and result["errors"] == 10 and result["retries"] == 0


def _small_file_limit():
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000))


def test_a_write_failure_stops_the_run_with_the_reason_and_the_next_run_completes(tmp_path, standin):
    server = standin()
    rows = make_prompts(tmp_path / "prompts.jsonl", 600)
    cfg_path = write_config(tmp_path, config(tmp_path, [server.url], shutdown_grace=1))
    env = dict(os.environ, PYTHONPATH=FILES)
    done = subprocess.run([sys.executable, "-m", "datagen.generate", "--config", cfg_path], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120, preexec_fn=_small_file_limit, check=False)
    assert done.returncode != 0
    assert "error: cannot write" in done.stderr and "File too large" in done.stderr, done.stderr
    status = read_status(str(tmp_path))
    assert status["state"] == "failed" and "File too large" in status["message"]
    proc = start_cli(cfg_path, tmp_path)  # the disk has room again: resume, repair, finish
    stdout = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, stdout.decode()
    ids = [r["id"] for r in output_rows(tmp_path)]
    assert sorted(ids) == sorted(r["id"] for r in rows)


def test_output_that_is_not_a_plain_file_is_refused(tmp_path):
    make_prompts(tmp_path / "prompts.jsonl", 3)
    os.symlink("/dev/zero", tmp_path / "generated.jsonl")
    with pytest.raises(GenerateError, match="not a regular file"):
        run_generate(settings_from_config(config(tmp_path, ["http://127.0.0.1:9"])), str(tmp_path / "prompts.jsonl"),
                     str(tmp_path))


def test_a_dead_fleet_stops_the_run_instead_of_failing_every_row(tmp_path, standin):
    server = standin("--fail-rate", "1.0")
    make_prompts(tmp_path / "prompts.jsonl", 500)
    raw = config(tmp_path, [server.url], retries=1, max_consecutive_failures=20, shutdown_grace=1)
    with pytest.raises(GenerateError, match="20 rows failed one after the other .*HTTP 503"):
        run_generate(settings_from_config(raw), str(tmp_path / "prompts.jsonl"), str(tmp_path))
    with open(tmp_path / "generate.errors.jsonl", encoding="utf-8") as fh:
        failed = sum(1 for _line in fh)
    assert 20 <= failed < 100  # stopped early: the remaining prompts wait for the next run
    assert read_status(str(tmp_path))["state"] == "failed"


def test_through_the_package_cli_generate_and_status(tmp_path, standin):
    """``python -m datagen generate|status``: the core CLI calls this stage's API (the contract between the two)."""
    server = standin()
    make_prompts(tmp_path / "prompts.jsonl", 30, tools_every=4)
    (tmp_path / "src.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    raw = config(tmp_path, [server.url])
    raw.update({"target_total": 30, "target_mix": {"general": 1.0}, "max_length": 1024, "seed": 1,
                "sources": [{"name": "lab", "adapter": "messages", "category": "general", "path": str(tmp_path / "src.jsonl")}]})
    cfg_path = write_config(tmp_path, raw)
    env = dict(os.environ, PYTHONPATH=FILES)
    run = [sys.executable, "-m", "datagen"]
    done = subprocess.run(run + ["generate", "--config", cfg_path], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == 30
    status = subprocess.run(run + ["status", "--config", cfg_path], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert json.loads(status.stdout)["state"] == "finished"
    raw["generate"]["thinking"] = "maybe"
    bad = subprocess.run(run + ["generate", "--config", write_config(tmp_path, raw)], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "generate.thinking" in bad.stderr


SGLANG = json.loads((DATAGEN_FIXTURES / "sglang_chat.json").read_text(encoding="utf-8"))


@pytest.fixture
def fixed_server():
    """A loopback server answering every chat request with one body recorded from sglang's own classes."""
    import threading

    from aiohttp import web

    state = {}

    def start(body):
        import asyncio

        loop = asyncio.new_event_loop()
        app = web.Application()
        raw = json.dumps(dict(body, model=MODEL)).encode()

        async def chat(_request):
            return web.Response(body=raw, content_type="application/json")

        async def health(_request):
            return web.Response()

        async def models(_request):
            return web.json_response({"data": [{"id": MODEL}]})

        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/health_generate", health)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        state.update(loop=loop, runner=runner, thread=thread)
        return f"http://127.0.0.1:{port}"

    yield start
    if state:
        loop = state["loop"]
        import asyncio

        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        state["thread"].join(10)


def test_ids_from_the_response_level_sglext_are_kept(tmp_path, fixed_server):
    """Workers started with --return-input-ids --return-output-ids: the route through sglang-router."""
    url = fixed_server(SGLANG["responses"]["sglext_ids"])
    make_prompts(tmp_path / "prompts.jsonl", 3)
    result = run_generate(settings_from_config(config(tmp_path, [url])), str(tmp_path / "prompts.jsonl"),
                          str(tmp_path))
    assert result["written"] == 3
    assert all((r["prompt_token_ids"], r["response_token_ids"]) == ([11, 12, 13], [21, 7])
               for r in output_rows(tmp_path))


def test_a_route_without_token_ids_stops_the_run_naming_the_fix(tmp_path, fixed_server):
    """sglang-router drops return_token_ids: every answer would lack the ids, so nothing is written."""
    url = fixed_server(SGLANG["responses"]["no_ids"])
    make_prompts(tmp_path / "prompts.jsonl", 20)
    with pytest.raises(GenerateError, match="without token ids.*--return-input-ids --return-output-ids"):
        run_generate(settings_from_config(config(tmp_path, [url])), str(tmp_path / "prompts.jsonl"), str(tmp_path))
    assert output_rows(tmp_path) == []
    assert not os.path.exists(tmp_path / "generate.errors.jsonl") or \
        os.path.getsize(tmp_path / "generate.errors.jsonl") == 0  # not the rows' fault: tried again next run
