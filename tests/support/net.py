"""Loopback networking for tests and benchmarks: one implementation, the lab's (tests/lab/sglang_standin/harness.py).

- :func:`http` and :class:`HttpReply`: every HTTP request a test or benchmark makes. A 4xx/5xx is a reply like a
  200; no HTTP answer at all (nothing listens, the connection dropped, it timed out) is ``status`` 0 with the
  reason in ``text``, never an exception. ``reply.json()`` parses the body, ``reply.expect(200)`` asserts the
  status (naming what came instead) and returns the reply.
- :func:`parse_metrics` / :func:`read_metrics`: Prometheus text (an SGLang worker's, the stand-in's) as
  ``{name: value}``, labels dropped.
- :func:`free_port` / :func:`free_ports`: ports below the ephemeral range, several at once, so a port handed to
  one server is not also handed out by the kernel to an outgoing connection meanwhile.

The harness holds them because its process classes (``StandinProcess.metrics``, ``RouterProcess.workers``) use
them too, and the lab's helpers do not import from tests/support.
"""

from __future__ import annotations

from harness import LAB_PORTS, HttpReply, free_port, free_ports, http, parse_metrics, read_metrics

__all__ = ["LAB_PORTS", "HttpReply", "free_port", "free_ports", "http", "parse_metrics", "read_metrics"]
