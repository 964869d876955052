"""The stand-in's capacity model: SGLang's running cap, waiting queue, queue limit, token pool and gauges.

Real processes on loopback; the requests are slow enough (many decode steps) that the state read in the
middle of them is the steady one, and every wait is bounded.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest
from harness import STANDIN, StandinProcess

from tests.support.net import http
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes

# every request samples 40 tokens + the stop token, one decode step (0.03 s here) each: over a second in the batch
SLOW = ["--min-tokens", "40", "--max-natural-tokens", "40", "--token-latency", "0.03"]


def chat(url, content, max_tokens=64, results=None):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    reply = http(url + "/v1/chat/completions", body=body, timeout=60)
    out = (reply.status, reply.json())
    if results is not None:
        results.append(out)
    return out


def fire(url, n, **kwargs):
    """``n`` requests in the background; (threads, results)."""
    results = []
    threads = [threading.Thread(target=chat, args=(url, f"question {i}"), kwargs=dict(kwargs, results=results))
               for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def metrics_when(server, predicate, timeout=10.0):
    """The stand-in's metrics once PREDICATE holds for them (bounded)."""
    def matching():
        metrics = server.metrics()
        return metrics if predicate(metrics) else None
    return wait_for(matching, timeout, "the stand-in's metrics to match", interval=0.02)


def in_model(m):
    return m["sglang:num_running_reqs"] + m["sglang:num_queue_reqs"]


def test_running_is_capped_and_the_rest_queue_then_all_finish():
    with StandinProcess(["--max-running-requests", "4", "--max-total-tokens", "4000", *SLOW], model="m") as s:
        threads, results = fire(s.url, 10)
        # requests join the batch between decode steps (scheduler.py): once the batch is full, the rest wait
        m = metrics_when(s, lambda m: in_model(m) == 10 and m["sglang:num_running_reqs"] >= 4)
        assert (m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"]) == (4, 6)
        assert 0 < m["sglang:token_usage"] < 1 and m["sglang:num_used_tokens"] > 0
        # continuous batching: as the first four finish, the next four join from the queue
        m = metrics_when(s, lambda m: m["sglang:num_queue_reqs"] == 2)
        assert m["sglang:num_running_reqs"] == 4
        for t in threads:
            t.join(timeout=30)
        assert [status for status, _body in results] == [200] * 10
        m = s.metrics()
        assert (m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"], m["sglang:num_used_tokens"]) == (0, 0, 0)


def test_a_full_queue_refuses_with_sglangs_503():
    with StandinProcess(["--max-running-requests", "1", "--max-queued-requests", "2", *SLOW], model="m") as s:
        # one at a time: a burst that arrives within one step is refused beyond the queue limit as well
        threads, results = fire(s.url, 1)
        metrics_when(s, lambda m: m["sglang:num_running_reqs"] == 1)
        more, results2 = fire(s.url, 2)
        threads += more
        metrics_when(s, lambda m: (m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"]) == (1, 2))
        status, body = chat(s.url, "one too many")
        assert status == 503 and body["message"] == "The request queue is full.", body
        for t in threads:
            t.join(timeout=30)
        assert sorted(status for status, _body in results + results2) == [200, 200, 200]


def test_the_token_pool_admits_only_what_fits():
    # each request reserves its prompt plus max_tokens (100): a pool of 150 tokens runs one at a time
    with StandinProcess(["--max-total-tokens", "150", *SLOW], model="m") as s:
        threads, _results = fire(s.url, 3, max_tokens=100)
        m = metrics_when(s, lambda m: in_model(m) == 3 and m["sglang:num_running_reqs"] >= 1)
        assert (m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"]) == (1, 2)
        assert m["sglang:max_total_num_tokens"] == 150
        for t in threads:
            t.join(timeout=30)


def test_without_a_capacity_every_request_runs_at_once():
    with StandinProcess(SLOW, model="m") as s:
        threads, _results = fire(s.url, 5)
        m = metrics_when(s, lambda m: m["sglang:num_running_reqs"] == 5)
        assert m["sglang:num_queue_reqs"] == 0
        for t in threads:
            t.join(timeout=30)


def test_metrics_carry_sglangs_names_types_and_labels():
    with StandinProcess(["--max-running-requests", "8"], model="m") as s:
        chat(s.url, "hello")
        text = http(s.url + "/metrics", timeout=5).expect(200).text
    # observability/metrics_collector.py: SchedulerMetricsCollector gauges and TokenizerMetricsCollector counters
    sched = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "num_used_tokens", "max_total_num_tokens"):
        assert f"# TYPE sglang:{name} gauge" in text
        assert re.search(rf"^sglang:{name}\{{{re.escape(sched)}\}} \d+\.\d+(e[-+]\d+)?$", text, re.M), name
    for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
        assert f"# TYPE sglang:{name} counter" in text
        assert re.search(rf'^sglang:{name}\{{model_name="m",engine_type="unified"\}} [1-9]', text, re.M), name


@pytest.mark.parametrize("flag, value", [("--max-running-requests", "0"), ("--max-queued-requests", "0"),
                                         ("--max-total-tokens", "0"), ("--batch-token-latency", "-1")])
def test_bad_capacity_flags_are_refused_by_name(flag, value):
    proc = subprocess.run([sys.executable, STANDIN, flag, value], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and flag in proc.stderr, proc.stderr
