"""The stand-in follows the released SGLang 0.5.23 worker where the pipeline meets it (README "Fidelity").

Each test names the upstream file (in the sglang 0.5.23 wheel) whose behaviour it checks; all of them talk
HTTP to a real stand-in process on 127.0.0.1. The pipeline client (``datagen.gen.client``) is run against the
stand-in for the two answers it must classify: a full queue (503, retried) and a request longer than the
context (400, a row error sent once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Tuple

import pytest
from harness import STANDIN, StandinProcess
from standin import QUEUE_FULL, build_parser, merge_config

from datagen.generate import run_generate, settings_from_config
from tests.support.net import http
from tests.support.paths import DATAGEN_FILES
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes

ERROR_KEYS = {"object", "message", "type", "param", "code"}  # entrypoints/openai/protocol.py ErrorResponse
# 40 tokens + the stop token, 0.05 s each: two seconds in the model
SLOW = ["--min-tokens", "40", "--max-natural-tokens", "40", "--token-latency", "0.05"]


def chat_body(content: str = "hello there", **extra: Any) -> Dict[str, Any]:
    return dict({"model": "m", "messages": [{"role": "user", "content": content}]}, **extra)


def post(url: str, body: Dict[str, Any], timeout: float = 20.0) -> Tuple[int, Dict[str, str], Any]:
    """(status, headers, parsed body) of a POST: the headers too, which :func:`http` does not return."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def timed_get(url: str) -> Tuple[int, float]:
    t0 = time.monotonic()
    status = http(url, timeout=30).status
    return status, time.monotonic() - t0


@pytest.fixture(scope="module")
def worker():
    with StandinProcess(["--context-length", "200"], model="m") as s:
        yield s


# ---------------------------------------------------------------- 1. health (http_server.py health_generate)

def test_health_runs_a_generation_on_both_paths():
    with StandinProcess(["--health-generate-latency", "0.3"], model="m") as s:
        for path in ("/health", "/health_generate"):  # one handler for both: both generate
            status, took = timed_get(s.url + path)
            assert status == 200 and took >= 0.3, (path, took)
        assert s.metrics()["standin_health_generate_total"] == 2


def test_health_is_503_while_draining_after_sigterm_and_the_request_in_flight_finishes():
    with StandinProcess(SLOW, model="m") as s:
        results: List[Tuple[int, Any]] = []
        t = threading.Thread(target=lambda: results.append(post(s.url + "/v1/chat/completions",
                                                                chat_body(max_tokens=64))[::2]))
        t.start()
        wait_for(lambda: s.metrics()["sglang:num_running_reqs"] >= 1, 10, "the request in the model", interval=0.02)
        s.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: http(s.url + "/health", timeout=5).status == 503, 10, "503 after SIGTERM", interval=0.02)
        assert http(s.url + "/health_generate", timeout=5).status == 503
        assert http(s.url + "/ready", timeout=5).status == 503
        t.join(timeout=20)
        assert results and results[0][0] == 200  # drained: the request in flight got its answer
        assert s.proc.wait(timeout=10) == 0  # then it exits
        with open(s.log_path, encoding="utf-8") as fh:
            assert "Draining requests" in fh.read()


def test_a_hung_worker_fails_its_health_check_and_recovers(tmp_path):
    hang = tmp_path / "hang"
    with StandinProcess(["--hang-while", str(hang), "--health-check-timeout", "0.5"], model="m") as s:
        assert http(s.url + "/health", timeout=5).status == 200
        hang.touch()
        status, took = timed_get(s.url + "/health")
        assert status == 503 and took >= 0.5  # no token within SGLANG_HEALTH_CHECK_TIMEOUT
        assert http(s.url + "/ready", timeout=5).status == 503  # UnHealthy
        hang.unlink()
        assert http(s.url + "/health", timeout=5).status == 200  # a check that succeeds sets it Up again
        assert http(s.url + "/ready", timeout=5).status == 200


# ---------------------------------------------------------------- 4. starting: only health is gated

def test_while_starting_only_health_is_503():
    with StandinProcess(["--not-ready-for", "60"], model="m") as s:
        for path in ("/health", "/health_generate", "/ready"):
            assert http(s.url + path, timeout=5).status == 503, path
        status, _headers, body = post(s.url + "/v1/chat/completions", chat_body())
        assert status == 200 and body["choices"][0]["message"]["content"]  # http_server.py: chat is not gated
        assert http(s.url + "/v1/models", timeout=5).status == 200
        assert s.metrics()["standin_requests_while_not_ready_total"] == 1


# ---------------------------------------------------------------- 2. the model name (serving_base.py)

def test_a_wrong_model_name_is_served_and_echoed(worker):
    status, _headers, body = post(worker.url + "/v1/chat/completions", chat_body(model="not-this-one"))
    assert status == 200 and body["model"] == "not-this-one"
    status, _headers, body = post(worker.url + "/v1/chat/completions", {"messages": chat_body()["messages"]})
    assert status == 200 and body["model"] == "default"  # protocol.py DEFAULT_MODEL_NAME
    # "base:adapter" names a LoRA adapter: refused without --enable-lora (tokenizer_manager.py)
    status, _headers, body = post(worker.url + "/v1/chat/completions", chat_body(model="m:adapter"))
    assert status == 400 and "LoRA adapter 'adapter' was requested" in body["message"]
    # /v1/models/{model:path} still 404s another name (http_server.py retrieve_model)
    missing = http(worker.url + "/v1/models/org/other", timeout=5)
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert http(worker.url + "/v1/models/m", timeout=5).expect(200).json()["id"] == "m"


# ---------------------------------------------------------------- 3. context length (tokenizer_manager.py)

@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_prompt_plus_max_tokens_beyond_the_context_is_400(worker, field):
    status, headers, body = post(worker.url + "/v1/chat/completions", chat_body(**{field: 199}))
    assert status == 400 and set(body) == ERROR_KEYS and "Retry-After" not in headers
    assert body["message"].startswith("Requested token count exceeds the model's maximum context length of "
                                      "200 tokens. You requested a total of ")
    assert (body["type"], body["code"], body["param"]) == ("BadRequestError", 400, None)
    assert post(worker.url + "/v1/chat/completions", chat_body(**{field: 150}))[0] == 200


def test_a_prompt_as_long_as_the_context_is_400(worker):
    status, _headers, body = post(worker.url + "/v1/chat/completions", chat_body("word " * 400))
    assert status == 400
    assert body["message"].startswith("The input (") and body["message"].endswith(
        "tokens) is longer than the model's context length (200 tokens).")
    gen = http(worker.url + "/generate", body={"input_ids": [1] * 150, "sampling_params": {"max_new_tokens": 60}})
    assert gen.status == 400 and "Requested token count exceeds" in gen.json()["error"]["message"]


# ---------------------------------------------------------------- 5. error bodies, no Retry-After

def test_errors_have_upstreams_shape_and_no_retry_after(worker):
    status, headers, body = post(worker.url + "/v1/chat/completions", {"model": "m", "messages": []})
    assert status == 400 and body == {"object": "error", "message": "Messages cannot be empty.",
                                      "type": "BadRequestError", "param": None, "code": 400}
    assert "Retry-After" not in headers
    status, headers, body = post(worker.url + "/v1/chat/completions", {"model": "m"})
    assert status == 400 and set(body) == ERROR_KEYS and body["type"] == "Bad Request"  # validation


def test_a_full_queue_is_503_with_upstreams_body():
    queue_full = {"object": "error", "message": QUEUE_FULL, "type": "503", "param": None, "code": 503}
    with StandinProcess(["--max-running-requests", "1", "--max-queued-requests", "1", *SLOW], model="m") as s:
        replies: List[Tuple[int, Dict[str, str], Any]] = []
        threads = [threading.Thread(target=lambda i=i: replies.append(
            post(s.url + "/v1/chat/completions", chat_body(f"q{i}", max_tokens=64)))) for i in range(4)]
        for t in threads:
            t.start()
            time.sleep(0.1)  # in order: one runs, one waits, the rest find the queue full
        for t in threads:
            t.join(timeout=30)
    refused = [r for r in replies if r[0] == 503]
    assert len(refused) == 2 and all(body == queue_full and "Retry-After" not in headers
                                     for _status, headers, body in refused)
    with StandinProcess(["--fail-rate", "1"], model="m") as s:  # the injected 503 is the same answer
        status, headers, body = post(s.url + "/v1/chat/completions", chat_body())
    assert status == 503 and body == queue_full and "Retry-After" not in headers


# ---------------------------------------------------------------- 6. reasoning only with --reasoning-parser

def test_thinking_stays_in_content_without_a_reasoning_parser(worker):
    body = chat_body(chat_template_kwargs={"enable_thinking": True}, max_tokens=100)
    message = post(worker.url + "/v1/chat/completions", body)[2]["choices"][0]["message"]
    assert message["content"].startswith("<think>\n") and "</think>" in message["content"]
    assert message["reasoning_content"] is None
    with StandinProcess(["--reasoning-parser", "qwen3"], model="m") as s:
        parsed = post(s.url + "/v1/chat/completions", body)[2]["choices"][0]["message"]
    assert parsed["reasoning_content"].startswith("Let me think.") and "<think>" not in parsed["content"]
    assert message["content"].endswith(parsed["content"])


# ---------------------------------------------------------------- 7. stop strings (schedule_batch.py)

def test_stop_strings_cut_the_answer(worker):
    natural = post(worker.url + "/v1/chat/completions", chat_body(max_tokens=100))[2]
    content = natural["choices"][0]["message"]["content"]
    word = content.split()[4]
    cut = post(worker.url + "/v1/chat/completions", chat_body(max_tokens=100, stop=["never-there", word]))[2]
    choice = cut["choices"][0]
    assert choice["message"]["content"] == content[:content.find(word)]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", word)
    assert cut["usage"]["completion_tokens"] < natural["usage"]["completion_tokens"]
    kept = post(worker.url + "/v1/chat/completions", chat_body(max_tokens=100, stop=word, no_stop_trim=True))[2]
    assert kept["choices"][0]["message"]["content"] == content[:content.find(word) + len(word)]
    # a stop string the budget never reaches: max_tokens ends it
    late = post(worker.url + "/v1/chat/completions", chat_body(max_tokens=3, stop=[content.split()[-1]]))[2]
    assert late["choices"][0]["finish_reason"] == "length" and late["choices"][0]["matched_stop"] is None


def test_a_tool_call_finishes_with_tool_calls_and_no_matched_stop(worker):
    parameters = {"type": "object", "properties": {"x": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    choice = post(worker.url + "/v1/chat/completions", chat_body(tools=[tool], max_tokens=100))[2]["choices"][0]
    # serving_chat.py _process_tool_calls: finish "stop" becomes "tool_calls", matched dropped
    assert (choice["finish_reason"], choice["matched_stop"]) == ("tool_calls", None)
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "f" and choice["message"]["content"] == ""


# ---------------------------------------------------------------- 8. --config (server_args_config_parser.py)

def test_config_merge_places_the_file_first():
    ap = build_parser()
    merged_from = {"api-key": "K", "enable-deterministic-inference": True, "skip-server-warmup": True,
                   "return-input-ids": False, "context-length": 100, "chat-template-kwargs": {"a": 1},
                   "lora-paths": ["x", "y"], "empty": []}
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"standin-merge-{os.getpid()}.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(merged_from, fh)  # JSON is YAML
    try:
        argv = merge_config(ap, ["--port", "1", "--config", path, "--context-length", "300"])
    finally:
        os.unlink(path)
    # store_true flags the stand-in knows are bare (or left out when false); other booleans "--KEY true"
    assert argv == ["--api-key", "K", "--enable-deterministic-inference", "--skip-server-warmup", "true",
                    "--context-length", "100", "--chat-template-kwargs", '{"a": 1}', "--lora-paths", "x", "y",
                    "--port", "1", "--context-length", "300"]
    assert ap.parse_known_args(argv)[0].context_length == 300  # the command line wins


def test_config_file_sets_the_api_key_and_the_key_is_logged_in_clear(tmp_path):
    key = "cfg-" + "k" * 40
    cfg = tmp_path / "sglang-secrets.yaml"
    cfg.write_text(f"api-key: {json.dumps(key)}\nenable-deterministic-inference: true\ncontext-length: 100\n"
                   "port: 1\nwatermark-key: wm-secret\n")
    with StandinProcess(["--config", str(cfg), "--context-length", "300"], model="m") as s:
        assert http(s.url + "/v1/models", timeout=5).status == 401
        info = http(s.url + "/server_info", key=key, timeout=5).expect(200).json()
        assert info["context_length"] == 300 and info["enable_deterministic_inference"] is True
        assert http(s.url + "/health", timeout=5).status == 200  # /health needs no key (auth.py)
        with open(s.log_path, encoding="utf-8") as fh:
            log = fh.read()
    line = next(x for x in log.splitlines() if "server_args={" in x)
    # engine.py logs api_key in clear and redacts only the watermark secrets: the role's launcher redacts it
    assert f"'api_key': '{key}'" in line and "'watermark_key': '<redacted>'" in line and "wm-secret" not in line


def run_standin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, STANDIN, "--port", "0", *args], capture_output=True, text=True,
                          timeout=30, check=False)


@pytest.mark.parametrize("content, suffix, code, message", [
    ("api_key: K\n", ".yaml", 2, "unrecognized arguments: --api_key"),  # upstream emits the key as written
    ("api-key: K\n", ".json", 1, "Config file must be YAML format, got: .json"),
    ("- api-key\n", ".yml", 1, "Config file must contain a dictionary at root level"),
])
def test_config_files_upstream_refuses_are_refused(tmp_path, content, suffix, code, message):
    cfg = tmp_path / f"c{suffix}"
    cfg.write_text(content)
    done = run_standin("--config", str(cfg))
    assert done.returncode == code and message in done.stderr, done.stderr


# ---------------------------------------------------------------- the pipeline client against it

MODEL = "lab-model"


def client_config(work, url: str, **generate: Any) -> Dict[str, Any]:
    gen = {"concurrency": 8, "backoff_base": 0.01, "backoff_max": 0.05, "ready_interval": 0.05,
           "ready_timeout": 10, "fsync_interval": 0.05, "progress_interval": 0.05}
    gen.update(generate)
    return {"work_dir": str(work), "model": MODEL, "servers": [url],
            "sampling": {"max_tokens": 48, "temperature": 0.7, "seed": 1}, "generate": gen}


def write_prompts(path, contents: List[str]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i, content in enumerate(contents):
            fh.write(json.dumps({"id": f"{i:024x}", "source": "src", "category": "chat",
                                 "messages": [{"role": "user", "content": content}]}) + "\n")


def errors_file(work) -> List[Dict[str, Any]]:
    path = os.path.join(str(work), "generate.errors.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def run(work, url: str, contents: List[str], **generate: Any) -> Dict[str, Any]:
    write_prompts(work / "prompts.jsonl", contents)
    return run_generate(settings_from_config(client_config(work, url, **generate)), str(work / "prompts.jsonl"),
                        str(work))


def test_client_retries_a_full_queue_without_retry_after(tmp_path):
    args = ["--max-running-requests", "1", "--max-queued-requests", "1", "--min-tokens", "4",
            "--max-natural-tokens", "8", "--token-latency", "0.005"]
    with StandinProcess(args, model=MODEL) as s:
        result = run(tmp_path, s.url, [f"question {i}" for i in range(12)], concurrency=6, retries=50)
        m = s.metrics()
    assert result["written"] == 12 and result["errors"] == 0 and errors_file(tmp_path) == []
    assert result["retries"] > 0  # the 503s came (and carried no Retry-After: test_a_full_queue_is_503...)
    assert m["sglang:num_requests_total"] == 12 + result["retries"]


def test_client_records_a_context_length_400_once_and_goes_on(tmp_path):
    with StandinProcess(["--context-length", "60"], model=MODEL) as s:
        result = run(tmp_path, s.url, ["short one", "word " * 200, "short two"], retries=5)
        requests = s.metrics()["sglang:num_requests_total"]
    assert result["written"] == 2 and result["errors"] == 1 and result["retries"] == 0
    assert requests == 3  # the long row was sent exactly once: a 400 is never retried
    (err,) = errors_file(tmp_path)
    assert err["status"] == 400 and err["attempts"] == 1 and "longer than the model's context length" in err["error"]


def test_the_roles_launcher_redacts_the_key_the_worker_logs(tmp_path):
    """The role's worker unit: serve_keyed.py starts the worker with ``--config sglang-secrets.yaml``; the worker
    logs its server_args with the key in clear (engine.py), and the launcher's output must not show it."""
    key = "cfg-" + "s" * 40
    (tmp_path / "api-key.env").write_text(f"SGLANG_DATAGEN_API_KEY={key}\n")
    (tmp_path / "api-key.env").chmod(0o600)
    (tmp_path / "sglang-secrets.yaml").write_text(f"api-key: {json.dumps(key)}\n")  # as tasks/api_key.yml writes it
    port_file = tmp_path / "port"
    launcher = str(DATAGEN_FILES / "serve_keyed.py")
    proc = subprocess.Popen([sys.executable, launcher, "--key-file", str(tmp_path / "api-key.env"), "--",
                             sys.executable, STANDIN, "--model", "m", "--config", str(tmp_path / "sglang-secrets.yaml"),
                             "--port", "0", "--port-file", str(port_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(port_file.exists, 10, "the worker listening", interval=0.02)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        assert http(url + "/v1/models", timeout=5).status == 401
        assert http(url + "/v1/chat/completions", key=key, body=chat_body(), timeout=10).status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _err = proc.communicate(timeout=20)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "server_args={" in text and "'api_key': '<redacted>'" in text and key not in text
