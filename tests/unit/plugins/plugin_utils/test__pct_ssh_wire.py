# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The control socket's frames arrive whole whenever the peer closes, with real unix sockets.

A frame is written in several writes (the header, then each blob). On a loaded host the writer
can lose the CPU between two writes for longer than the peer needs to read the whole frame,
answer and close: a control master that ran ``id -un`` in those milliseconds. The writer here is
made to lose it after every write (``YieldingSocket``), so what happens by chance under load
happens every time.
"""

from __future__ import annotations

import socket
import threading
import typing as t

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._pct_ssh import wire

PEER_BOUND_S = 5.0  # the peer's own reads are bounded: a test that goes wrong fails, never hangs
YIELD_S = 0.3  # how long the writer stays off the CPU after a write, unless the peer closed before


class YieldingSocket:
    """SOCK, whose owner is descheduled after every write until the peer has acted on it (or YIELD_S passed)."""

    def __init__(self, sock: socket.socket, peer_closed: threading.Event) -> None:
        self.sock = sock
        self.peer_closed = peer_closed

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)
        self.peer_closed.wait(YIELD_S)

    def __getattr__(self, name: str) -> t.Any:
        return getattr(self.sock, name)


def peer(sock: socket.socket, act: t.Callable[[socket.socket], None], closed: threading.Event) -> threading.Thread:
    """A thread that does ACT on SOCK, closes it and says so in CLOSED."""

    def run() -> None:
        sock.settimeout(PEER_BOUND_S)
        try:
            act(sock)
        finally:
            sock.close()
            closed.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_request_without_stdin_gets_its_reply_when_the_master_answers_before_the_last_write():
    """The worker's exec with no stdin (an empty blob): the master reads it, answers and closes while the
    worker is off the CPU. The worker gets the answer, not "the control master went away (Broken pipe)"."""
    worker_end, master_end = socket.socketpair()
    closed = threading.Event()

    def master(conn: socket.socket) -> None:
        header, blobs = wire.recv(conn)
        assert header["op"] == "exec" and blobs == [b""]
        wire.send(conn, {"rc": 0, "timed_out": False, "signalled": None}, b"root\n", b"")

    master_thread = peer(master_end, master, closed)
    client = _pct_ssh.MasterClient("/nonexistent/unused.sock")
    request = {"op": "exec", "command": "id -un", "has_stdin": False, "timeout": 30, "pty": False}
    try:
        reply, data = client._exchange(YieldingSocket(worker_end, closed), request, (b"",), timeout=30)
    finally:
        worker_end.close()
    master_thread.join(PEER_BOUND_S)
    assert closed.is_set(), "the master side never finished"
    assert reply["rc"] == 0 and data == [b"root\n", b""]


def test_a_reply_with_an_empty_blob_is_sent_whole_when_the_worker_closes_at_once():
    """The master's answer with an empty stderr: the worker has the whole frame after the stdout blob and
    closes; the master's send returns normally (before, its last empty write failed with EPIPE)."""
    master_end, worker_end = socket.socketpair()
    closed = threading.Event()
    got: t.List[wire.Frame] = []
    worker_thread = peer(worker_end, lambda conn: got.append(wire.recv(conn)), closed)
    try:
        wire.send(YieldingSocket(master_end, closed), {"rc": 0}, b"out", b"")
    finally:
        master_end.close()
    worker_thread.join(PEER_BOUND_S)
    assert got and got[0][1] == [b"out", b""]


def test_every_blob_reaches_the_peer_in_order():
    """Non-empty blobs are still all written, in order, around the empty ones."""
    a, b = socket.socketpair()
    blobs = (b"", b"x" * 300_000, b"", b"tail")
    sender = threading.Thread(target=wire.send, args=(a, {"op": "put"}, *blobs), daemon=True)
    sender.start()
    b.settimeout(PEER_BOUND_S)
    header, data = wire.recv(b)
    sender.join(PEER_BOUND_S)
    a.close()
    b.close()
    assert header["op"] == "put" and header["blobs"] == [0, 300_000, 0, 4]
    assert data == list(blobs)
