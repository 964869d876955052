# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``sglang_ready_wait``'s gate: every SGLang worker ready, and the router routing to every one of them.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. It runs on targets: the standard library and ``ansible.module_utils.urls``, which AnsiballZ ships.

Why not the router's own ``/health_generate``: sglang-router 0.3.2 answers it 200 ("At least one router has
healthy workers") as soon as ONE worker is registered, without asking the workers. And a worker that is not
healthy within the router's ``--worker-startup-timeout-secs`` is dropped from its list for good, while the
router stays up. So the gate asks every worker's own ``/health_generate`` (SGLang's
``srt/entrypoints/http_server.py``: 503 while the server is starting, 200 once a one-token generation came
back), reads the router's worker list (``GET /workers``) and registers a ready worker the router does not
know (``POST /workers {"url": ...}``, answered 202 and done in the background; the same URL twice is one
worker), until every worker is ready and listed healthy by the router, or the timeout.
"""

from __future__ import annotations

import json
import time
import typing as t
import urllib.error

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

PROBE_TIMEOUT = 60.0  # SGLang's own health check waits up to 20 s for its one-token generation

# (method, url, JSON body or None, timeout) -> (status, body text); status 0 with the reason when no HTTP answer
Http = t.Callable[[str, str, t.Optional[t.Dict[str, t.Any]], float], t.Tuple[int, str]]


# ---------------------------------------------------------------- pure

def parse_api_key(text: str) -> str:
    """The key from an environment file (``NAME=KEY``, the role's api-key.env) or a file holding only the key."""
    text = text.strip()
    if not text:
        return ""
    return text.split("=", 1)[1].strip() if "=" in text.splitlines()[0] else text


def worker_state(status: int, text: str) -> str:
    """A worker's ``/health_generate`` answer in words: 'ready', or why not ('HTTP 503', 'no answer: ...')."""
    if status == 200:
        return "ready"
    return "HTTP %d" % status if status else "no answer: %s" % text


def parse_router_workers(status: int, text: str) -> t.Optional[t.Dict[str, bool]]:
    """{worker url: healthy} from the router's ``GET /workers``; None when the router did not answer it."""
    if status != 200:
        return None
    try:
        listed = json.loads(text).get("workers", [])
        return {str(w["url"]).rstrip("/"): bool(w.get("is_healthy", False)) for w in listed}
    except (ValueError, AttributeError, KeyError, TypeError):
        return None


def router_gaps(workers: t.Sequence[str], listed: t.Optional[t.Mapping[str, bool]]
                ) -> t.Tuple[t.List[str], t.List[str]]:
    """(the workers the router does not list, those it lists unhealthy); none when it did not answer."""
    if listed is None:
        return [], []
    return [w for w in workers if w not in listed], [w for w in workers if w in listed and not listed[w]]


def gate_done(states: t.Mapping[str, str], router: t.Optional[str], listed: t.Optional[t.Mapping[str, bool]],
              missing: t.Sequence[str], unhealthy: t.Sequence[str]) -> bool:
    """Every worker ready and, with a router, listed healthy by it."""
    router_knows_all = router is None or (listed is not None and not missing and not unhealthy)
    return all(state == "ready" for state in states.values()) and router_knows_all


# ---------------------------------------------------------------- the wire

def bearer_headers(api_key: str) -> t.Dict[str, str]:
    """The headers of every request: JSON, and the key as a bearer token when there is one (workers and a router
    started with ``--api-key`` refuse everything but ``/health*``, ``/ready*`` and ``/metrics`` without it)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    return headers


def urllib_http(headers: t.Mapping[str, str]) -> Http:
    """An :data:`Http` over Ansible's ``open_url`` (urllib underneath) sending HEADERS."""
    def call(method: str, url: str, body: t.Optional[t.Dict[str, t.Any]], timeout: float) -> t.Tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        try:
            with open_url(url, data=data, headers=dict(headers), method=method, timeout=max(1.0, timeout),
                          use_netrc=False) as resp:
                return resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode("utf-8", "replace")
        except (urllib.error.URLError, UrlsConnectionError, OSError) as exc:
            return 0, str(getattr(exc, "reason", exc))
    return call


# ---------------------------------------------------------------- the loop

def gate(http: Http, workers: t.Sequence[str], router: t.Optional[str], timeout: float, delay: float,
         register: bool = True, clock: t.Callable[[], float] = time.monotonic,
         sleep: t.Callable[[float], None] = time.sleep) -> t.Dict[str, t.Any]:
    """Poll until every worker is ready (and routed to), or TIMEOUT seconds; the outcome as a dict.

    A ready worker the router does not list is registered with it, unless REGISTER is false (check mode):
    then it is only named in ``would_register``."""
    t0 = clock()
    deadline = t0 + timeout
    registered: t.Set[str] = set()
    while True:
        states = {w: worker_state(*http("GET", w + "/health_generate", None, min(PROBE_TIMEOUT, deadline - clock())))
                  for w in workers}
        listed = None
        if router is not None:
            listed = parse_router_workers(*http("GET", router + "/workers", None, min(PROBE_TIMEOUT, deadline - clock())))
        missing, unhealthy = router_gaps(workers, listed)
        to_register = [w for w in missing if states[w] == "ready"]
        for w in to_register if register and router is not None else []:
            status, _text = http("POST", router + "/workers", {"url": w}, min(PROBE_TIMEOUT, deadline - clock()))
            if status in (200, 201, 202):
                registered.add(w)
        done = gate_done(states, router, listed, missing, unhealthy)
        if done or clock() + delay > deadline:
            not_ready = [w for w in workers if states[w] != "ready"]
            return {"ready": done, "elapsed": round(clock() - t0, 1), "workers": states,
                    "not_ready": not_ready, "stuck": list(dict.fromkeys(not_ready + missing + unhealthy)),
                    "router": router, "router_answered": listed is not None if router else None,
                    "router_missing": missing, "router_unhealthy": unhealthy, "registered": sorted(registered),
                    "would_register": [] if register else to_register}
        sleep(delay)


def read_key_file(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return parse_api_key(handle.read())


def wait_ready(p: t.Mapping[str, t.Any], check_mode: bool = False, http: t.Optional[Http] = None) -> t.Dict[str, t.Any]:
    """``sglang_ready_wait``'s runner: the gate's outcome as the module's result (``failed`` when not ready)."""
    if p["timeout"] < 0 or p["delay"] <= 0:
        return {"failed": True, "msg": "timeout must be >= 0 and delay > 0"}
    try:
        api_key = read_key_file(p["api_key_file"]) if p.get("api_key_file") else ""
    except OSError as exc:
        return {"failed": True, "msg": "cannot read api_key_file %s: %s" % (p["api_key_file"], exc)}
    workers = [w.rstrip("/") for w in p["workers"]]
    router = p["router"].rstrip("/") if p.get("router") else None
    out = gate(http or urllib_http(bearer_headers(api_key)), workers, router, p["timeout"], p["delay"],
               register=not check_mode)
    out["changed"] = bool(out["registered"] or out["would_register"])
    if not out["ready"]:
        out.update(failed=True, msg="%d of %d SGLang workers not ready after %s s: %s" % (
            len(out["stuck"]), len(workers), p["timeout"],
            ", ".join(out["stuck"]) or "the router did not answer GET /workers"))
    return out
