"""A worker restarted behind the real sglang-router (the pinned wheel): what the router does, and the role's setting.

sglang-router 0.3.2 keeps a worker that went down in its list: the health checker marks it unhealthy and then
healthy again. What keeps a restarted worker idle is the router's per-worker circuit breaker, opened by the requests
that failed while it was down: nothing goes to it for ``--cb-timeout-duration-secs`` (60 s upstream), then it is
tried again. The role passes ``sglang_datagen_router_cb_timeout`` there (roles/sglang_datagen/tasks/serve.yml).
"""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import pytest
import yaml
from harness import RouterProcess, StandinProcess

from tests.support.net import http
from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

DEFAULTS = ROOT / "roles" / "sglang_datagen" / "defaults" / "main.yml"


def ask(router_url: str) -> bool:
    """One chat request through the router (a new prompt each time); True when it was answered."""
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
    return http(router_url + "/v1/chat/completions", body=body, timeout=30).status == 200


def breaker_state(router: RouterProcess, worker_url: str) -> Optional[float]:
    """The router's ``smg_worker_cb_state`` for one worker (0 closed, 1 open, 2 half-open); None before any."""
    text = http(router.metrics_url, timeout=5).expect(200).text
    found = re.search(r'^smg_worker_cb_state\{worker="' + re.escape(worker_url) + r'"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def until(what: str, check, timeout: float, pool: ThreadPoolExecutor, router: RouterProcess) -> float:
    """Send rounds of 4 requests through the router until ``check()``; bounded; the seconds it took."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout}s"
        list(pool.map(lambda _i: ask(router.url), range(4)))
    return time.monotonic() - t0


def test_router_keeps_a_restarted_worker_and_routes_to_it_after_the_breaker_timeout():
    cb_timeout = int(yaml.safe_load(DEFAULTS.read_text())["sglang_datagen_router_cb_timeout"])
    assert 1 <= cb_timeout < 60  # shorter than sglang-router's own 60 s
    with StandinProcess([], model="m") as steady, StandinProcess([], model="m") as restarted, \
            ThreadPoolExecutor(4) as pool:
        port = restarted.port
        args = ["--cb-timeout-duration-secs", str(cb_timeout), "--health-check-interval-secs", "1"]
        with RouterProcess([steady.url, restarted.url], policy="round_robin", args=args) as router:
            assert all(pool.map(lambda _i: ask(router.url), range(8)))
            assert restarted.metrics()["standin_ok_total"] > 0
            restarted.stop()
            # the requests it cannot take are retried on the other worker (none is lost) until its breaker opens
            until("breaker open", lambda: breaker_state(router, restarted.url) == 1, 30, pool, router)
            opened = time.monotonic()
            # the health checker marks it unhealthy, and keeps it in the list
            until("marked unhealthy", lambda: router.workers().get(restarted.url) is False, 30, pool, router)
            assert set(router.workers()) == {steady.url, restarted.url}
            answered_before = steady.metrics()["standin_ok_total"]
            back = StandinProcess([], model="m", port=port).start()
            try:
                until("healthy again", lambda: router.workers().get(restarted.url) is True, 30, pool, router)
                # routed to again by itself, but only once the breaker's timeout has passed since it opened
                until("routed to again", lambda: back.metrics()["standin_ok_total"] > 0, cb_timeout + 30, pool,
                      router)
                assert time.monotonic() - opened >= cb_timeout - 1
                assert steady.metrics()["standin_ok_total"] > answered_before  # the other one served meanwhile
            finally:
                back.stop()
