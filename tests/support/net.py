"""Free loopback ports: the one implementation is the lab's (tests/lab/sglang_standin/harness.py).

It picks ports below the ephemeral range, several at once, so a port handed to one
server is not also handed out by the kernel to an outgoing connection meanwhile.
"""

from __future__ import annotations

from harness import free_port, free_ports

__all__ = ["free_port", "free_ports"]
