"""Start and stop the SGLang stand-in from tests and benchmarks (a real process on loopback)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import IO, Any, Dict, List, NamedTuple, Optional

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin.py")
# one Prometheus sample line: the name, its labels (dropped), the value
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? (\S+)$")


class HttpReply(NamedTuple):
    """One HTTP exchange as a test sees it: ``status`` is 0 when no HTTP answer came at all (nothing listens,
    the connection dropped, it timed out), and ``text`` then says why; otherwise the answer's body."""

    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)

    def expect(self, status: int = 200) -> HttpReply:
        """This reply when its status is ``status``; an AssertionError naming what came instead otherwise."""
        assert self.status == status, f"HTTP {self.status} (expected {status}): {self.text[:2000]}"
        return self


def http(url: str, *, key: Optional[str] = None, body: Any = None, method: Optional[str] = None,
         timeout: float = 20.0) -> HttpReply:
    """GET ``url`` (POST with a JSON ``body``; ``method`` overrides), ``Authorization: Bearer KEY`` with ``key``.

    Every answer is a reply, 4xx/5xx included; no answer at all is status 0 (see :class:`HttpReply`), never an
    exception, so a test can assert on a server that is not (or no longer) there.
    """
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return HttpReply(resp.status, resp.read().decode())
    except urllib.error.HTTPError as exc:
        return HttpReply(exc.code, exc.read().decode())
    except urllib.error.URLError as exc:  # refused, unreachable, or timed out while connecting
        return HttpReply(0, str(exc.reason))
    except OSError as exc:  # reset or timed out after connecting
        return HttpReply(0, str(exc) or type(exc).__name__)


def parse_metrics(text: str) -> Dict[str, float]:
    """Prometheus text as {name: value}, labels dropped (the last sample of a name wins)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def read_metrics(metrics_url: str, timeout: float = 5.0) -> Dict[str, float]:
    """The parsed metrics at ``metrics_url`` (``.../metrics``), which must answer 200 (AssertionError otherwise)."""
    reply = http(metrics_url, timeout=timeout)
    assert reply.status == 200, f"{metrics_url}: HTTP {reply.status} {reply.text[:500]}"
    return parse_metrics(reply.text)


def stop_process(proc: Optional[subprocess.Popen], log: Optional[IO[bytes]], grace: float) -> None:
    """SIGTERM the process this harness started (only it), SIGKILL after ``grace`` seconds; close its log."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if log is not None:
        log.close()


class StandinProcess:
    """``with StandinProcess(["--fail-rate", "0.2"]) as s: s.url``; stops only the process it started."""

    def __init__(self, args: Optional[List[str]] = None, model: str = "lab-model", port: int = 0,
                 python: str = sys.executable, wait_listen: bool = True) -> None:
        self.args = list(args or [])
        self.model = model
        self.port = port
        self.python = python
        self.wait_listen = wait_listen
        self.proc: Optional[subprocess.Popen] = None
        self._dir = tempfile.mkdtemp(prefix="standin-")
        self.port_file = os.path.join(self._dir, "port")
        self.log_path = os.path.join(self._dir, "standin.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> StandinProcess:
        cmd = [self.python, STANDIN, "--port", str(self.port), "--port-file", self.port_file,
               "--model", self.model, *self.args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        if self.wait_listen:
            deadline = time.monotonic() + timeout
            while not os.path.exists(self.port_file):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"stand-in did not start: {open(self.log_path).read()}")
                time.sleep(0.02)
            with open(self.port_file, encoding="ascii") as fh:
                self.port = int(fh.read())
        return self

    def metrics(self) -> Dict[str, float]:
        return read_metrics(self.url + "/metrics")

    def stop(self) -> None:
        stop_process(self.proc, getattr(self, "_log", None), grace=10.0)

    def __enter__(self) -> StandinProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


LAB_PORTS = (30000, 32000)  # [first, end) of the CT200 lab's serving ports, see free_ports


def free_ports(count: int = 1) -> List[int]:
    """``count`` distinct loopback ports, free right now, from below the kernel's ephemeral range.

    The router needs its ports up front (it has no --port-file). A port the kernel hands out for ``bind(0)``
    lies in the ephemeral range, where any outgoing connection (the router's own health checks of its
    workers) may take it before the router binds it; the ports stay bound together until all are chosen,
    so two calls cannot return the same one.
    """
    low = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            high = min(int(fh.read().split()[0]), 65536) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    # Never the lab's own serving ports (the sglang_datagen role's defaults: router metrics 30100, router
    # 30000, workers from 31000): a host test holding one while systemd restarts a CT200 worker (CT200
    # shares this machine's network) would make that worker fail to bind.
    candidates = [port for port in range(low, high + 1) if not LAB_PORTS[0] <= port < LAB_PORTS[1]]
    held: List[socket.socket] = []
    try:
        for port in random.sample(candidates, min(200, len(candidates))):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            if len(held) == count:
                return [s.getsockname()[1] for s in held]
        raise RuntimeError(f"no {count} free loopback ports in {low}-{high}")
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    """One free loopback port (see ``free_ports``)."""
    return free_ports(1)[0]


class RouterProcess:
    """The real sglang-router (``python -m sglang_router.launch_router``, the pinned wheel) on loopback.

    ``with RouterProcess([w.url for w in workers], expect=2) as r: r.url``; its Prometheus port is bound to
    127.0.0.1 too (``r.metrics_url``). ``expect``: wait (bounded) until that many workers are registered.
    """

    def __init__(self, worker_urls: List[str], args: Optional[List[str]] = None, policy: str = "round_robin",
                 expect: Optional[int] = None, python: str = sys.executable, api_key: Optional[str] = None) -> None:
        self.worker_urls = list(worker_urls)
        # with an API key the router asks its clients for it (its own /workers too) and sends it to the workers
        self.api_key = api_key
        self.args = list(args or []) + (["--api-key", api_key] if api_key is not None else [])
        self.policy = policy
        self.expect = len(self.worker_urls) if expect is None else expect
        self.python = python
        self.port, self.metrics_port = free_ports(2)
        self.proc: Optional[subprocess.Popen] = None
        self._dir = tempfile.mkdtemp(prefix="router-")
        self.log_path = os.path.join(self._dir, "router.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def workers(self) -> Dict[str, bool]:
        """{url: is_healthy} from the router's GET /workers; OSError while it does not answer that with 200."""
        reply = http(self.url + "/workers", key=self.api_key, timeout=5)
        if reply.status != 200:
            raise OSError(f"sglang-router GET /workers: HTTP {reply.status} {reply.text[:200]}")
        return {w["url"]: w["is_healthy"] for w in reply.json()["workers"]}

    def wait_workers(self, n: int, timeout: float = 30.0) -> Dict[str, bool]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                listed = self.workers()
                if sum(listed.values()) >= n:
                    return listed
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited: {self._read_log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not list {n} healthy workers in {timeout}s")
            time.sleep(0.1)

    def start(self, timeout: float = 30.0, attempts: int = 3) -> RouterProcess:
        for attempt in range(1, attempts + 1):
            cmd = [self.python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                   "--policy", self.policy, "--worker-startup-check-interval", "1", "--log-level", "warn",
                   *self.args, "--worker-urls", *self.worker_urls]
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
            try:
                self.wait_workers(self.expect, timeout)
                return self
            except RuntimeError:
                # a port taken between choosing and binding is the test rig's race, not the router's behaviour
                if attempt == attempts or "Address already in use" not in self._read_log():
                    raise
                self.stop()
                self.port, self.metrics_port = free_ports(2)
        return self

    def _read_log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait (bounded) until the router's log has TEXT: how a test knows the router did something it never
        reports over HTTP, such as giving up on a worker (``Failed job: type=AddWorker, worker=URL``)."""
        deadline = time.monotonic() + timeout
        while text not in self._read_log():
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not log {text!r} in {timeout}s: {self._read_log()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc, getattr(self, "_log", None), grace=15.0)

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
