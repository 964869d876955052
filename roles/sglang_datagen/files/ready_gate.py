"""The readiness gate of role sglang_datagen: every worker ready, and the router routing to every one of them.

Run on the node with the venv's interpreter (standard library only)::

    ready_gate.py --timeout 1800 --delay 5 --router http://127.0.0.1:30000 \
        --worker http://127.0.0.1:31000 --worker http://127.0.0.1:31001 ...

Why not the router's own ``/health_generate``: sglang-router 0.3.2 answers it 200 ("At least one router has
healthy workers") as soon as ONE worker is registered, without asking the workers. And a worker that is not
healthy within the router's ``--worker-startup-timeout-secs`` is dropped from its list for good, while the
router stays up. So the gate asks every worker's own ``/health_generate`` (SGLang's
``srt/entrypoints/http_server.py``: 503 while the server is starting, 200 once a one-token generation came
back), reads the router's worker list (``GET /workers``) and registers a ready worker the router does not
know (``POST /workers {"url": ...}``, answered 202 and done in the background; the same URL twice is one
worker), until every worker is ready and listed healthy by the router, or the timeout. One JSON object on
stdout says how it ended; the exit status is 0 when ready, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Set, Tuple

PROBE_TIMEOUT = 60.0  # SGLang's own health check waits up to 20 s for its one-token generation
# Set from --api-key-file: sent as a bearer token on every request (workers and a router started with
# --api-key refuse everything but /health*, /ready* and /metrics without it).
HEADERS: Dict[str, str] = {"Content-Type": "application/json"}


def read_api_key(path: str) -> str:
    """The key from an environment file (``NAME=KEY``, the role's api-key.env) or a file holding only the key."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    if not text:
        return ""
    return text.split("=", 1)[1].strip() if "=" in text.splitlines()[0] else text


def http(method: str, url: str, body: Optional[Dict[str, Any]], timeout: float) -> Tuple[int, str]:
    """(status, body text); status 0 with the reason when there is no HTTP answer at all."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=dict(HEADERS))
    try:
        with urllib.request.urlopen(req, timeout=max(1.0, timeout)) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def worker_state(url: str, timeout: float) -> str:
    """'ready', or why not ('HTTP 503', 'no answer: Connection refused')."""
    status, text = http("GET", url + "/health_generate", None, min(PROBE_TIMEOUT, timeout))
    if status == 200:
        return "ready"
    return f"HTTP {status}" if status else f"no answer: {text}"


def router_workers(router: str, timeout: float) -> Optional[Dict[str, bool]]:
    """{worker url: healthy} from the router's ``GET /workers``; None when the router does not answer it."""
    status, text = http("GET", router + "/workers", None, min(PROBE_TIMEOUT, timeout))
    if status != 200:
        return None
    try:
        listed = json.loads(text).get("workers", [])
        return {str(w["url"]).rstrip("/"): bool(w.get("is_healthy", False)) for w in listed}
    except (ValueError, AttributeError, KeyError, TypeError):
        return None


def register(router: str, worker: str, timeout: float) -> bool:
    status, _text = http("POST", router + "/workers", {"url": worker}, min(PROBE_TIMEOUT, timeout))
    return status in (200, 201, 202)


def gate(workers: List[str], router: Optional[str], timeout: float, delay: float) -> Dict[str, Any]:
    """Poll until every worker is ready (and routed to), or ``timeout`` seconds; the outcome as a dict."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    registered: Set[str] = set()
    while True:
        remaining = deadline - time.monotonic()
        states = {w: worker_state(w, remaining) for w in workers}
        ready = [w for w in workers if states[w] == "ready"]
        listed: Optional[Dict[str, bool]] = None
        missing: List[str] = []
        unhealthy: List[str] = []
        if router is not None:
            listed = router_workers(router, deadline - time.monotonic())
            if listed is not None:
                missing = [w for w in workers if w not in listed]
                unhealthy = [w for w in workers if w in listed and not listed[w]]
                for w in missing:
                    if w in ready and register(router, w, deadline - time.monotonic()):
                        registered.add(w)
        router_knows_all = router is None or (listed is not None and not missing and not unhealthy)
        done = len(ready) == len(workers) and router_knows_all
        if done or time.monotonic() + delay > deadline:
            return {"ready": done, "elapsed": round(time.monotonic() - t0, 1), "workers": states,
                    "not_ready": [w for w in workers if states[w] != "ready"],
                    "router": router, "router_answered": listed is not None if router else None,
                    "router_missing": missing, "router_unhealthy": unhealthy, "registered": sorted(registered)}
        time.sleep(delay)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--worker", action="append", required=True, help="a worker's URL (repeat for each)")
    ap.add_argument("--router", help="the sglang-router URL whose worker list must hold every worker")
    ap.add_argument("--timeout", type=float, required=True, help="seconds to wait in all")
    ap.add_argument("--delay", type=float, default=5.0, help="seconds between rounds")
    ap.add_argument("--api-key-file", help="send the API key in this file (NAME=KEY or the key alone) as a bearer token")
    args = ap.parse_args(argv)
    if args.api_key_file:
        HEADERS["Authorization"] = "Bearer " + read_api_key(args.api_key_file)
    if args.timeout < 0 or args.delay <= 0:
        ap.error("--timeout must be >= 0 and --delay > 0")
    out = gate([w.rstrip("/") for w in args.worker], args.router.rstrip("/") if args.router else None,
               args.timeout, args.delay)
    print(json.dumps(out, sort_keys=True))
    return 0 if out["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
