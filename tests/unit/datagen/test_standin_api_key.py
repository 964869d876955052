"""``--api-key`` on the stand-in workers (as SGLang 0.5.23's ``srt/utils/auth.py`` decides it), on the REAL
sglang-router 0.3.2 (its clients need the key, and it sends the key to the workers): what a multi-node generation
job relies on (roles/sglang_datagen README "One job, many nodes"). The readiness gate with the key is tested with
the collection's module_utils (test__datagen_ready.py)."""

from __future__ import annotations

import pytest
from harness import RouterProcess, StandinProcess
from standin import auth_allowed

from tests.support.net import http

pytestmark = pytest.mark.processes

KEY = "k3y-" + "x" * 40
CHAT = {"model": "lab-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_auth_rule_is_sglangs():
    # sglang/srt/utils/auth.py decide_request_auth, normal endpoints
    assert auth_allowed("GET", "/v1/models", None, None)
    assert not auth_allowed("GET", "/v1/models", None, KEY)
    assert not auth_allowed("POST", "/v1/chat/completions", "Bearer nope", KEY)
    assert not auth_allowed("POST", "/v1/chat/completions", KEY, KEY)  # no scheme
    assert auth_allowed("POST", "/v1/chat/completions", "bearer " + KEY, KEY)  # scheme is case-insensitive
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert auth_allowed("GET", path, None, KEY), path
    assert auth_allowed("OPTIONS", "/v1/chat/completions", None, KEY)


def test_standin_refuses_requests_without_the_key():
    with StandinProcess(["--api-key", KEY]) as worker:
        assert http(worker.url + "/v1/models") == (401, '{"error": "Unauthorized"}')
        assert http(worker.url + "/v1/models", key="wrong")[0] == 401
        assert http(worker.url + "/v1/chat/completions", body=CHAT)[0] == 401
        assert http(worker.url + "/v1/models", key=KEY)[0] == 200
        assert http(worker.url + "/v1/chat/completions", key=KEY, body=CHAT)[0] == 200
        assert http(worker.url + "/health")[0] == 200 and http(worker.url + "/health_generate")[0] == 200
        metrics = worker.metrics()
        assert metrics["standin_unauthorized_total"] == 3 and metrics["standin_ok_total"] == 1


def test_real_router_requires_the_key_from_clients_and_sends_it_to_the_workers():
    with StandinProcess(["--api-key", KEY]) as w1, StandinProcess(["--api-key", KEY]) as w2:
        with RouterProcess([w1.url, w2.url], api_key=KEY) as router:
            assert http(router.url + "/v1/chat/completions", body=CHAT)[0] == 401
            assert http(router.url + "/v1/chat/completions", key="wrong", body=CHAT)[0] == 401
            for _request in range(4):
                status, text = http(router.url + "/v1/chat/completions", key=KEY, body=CHAT)
                assert status == 200, text
            served = w1.metrics()["standin_ok_total"] + w2.metrics()["standin_ok_total"]
            assert served == 4  # the workers took the router's requests: it sent them the key
            assert w1.metrics()["standin_unauthorized_total"] + w2.metrics()["standin_unauthorized_total"] == 0
            log = router._read_log()
        assert KEY not in log
