# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Running one command on an SSH session channel: stdin fed and both output streams drained in one loop."""

from __future__ import annotations

import select
import time
import typing as t

from .errors import ExecResult

CHUNK = 1024 * 1024  # file transfer block: bounded memory for any file size


def connection_lost(chan: t.Any) -> bool:
    """The channel was torn down with its transport (not closed by the command ending)."""
    transport = chan.get_transport()
    return not (transport is not None and transport.is_active())


class _Feed:
    """The command's stdin: bytes given whole, or a local file streamed CHUNK by CHUNK."""

    def __init__(self, chan: t.Any, stdin: t.Optional[bytes], src: t.Optional[t.BinaryIO]) -> None:
        self.chan = chan
        self.pending = memoryview(stdin or b"")
        self.src = src
        self.active = bool(stdin) or src is not None
        if not self.active:
            chan.shutdown_write()  # no stdin (or an empty one): the command must see EOF, not wait

    def step(self) -> bool:
        """Send what the channel takes now; True when something was sent."""
        if not self.active or not self.chan.send_ready():
            return False
        if not self.pending and self.src is not None:
            self.pending = memoryview(self.src.read(CHUNK))
            if not self.pending:
                self.src = None
        sent = False
        if self.pending:
            try:
                n = self.chan.send(self.pending[:65536])
            except OSError:  # the command exited without reading all its input: its rc tells
                n, self.pending, self.src = 0, memoryview(b""), None
            self.pending = self.pending[n:]
            sent = True
        if not self.pending and self.src is None:
            if not self.chan.closed:
                self.chan.shutdown_write()
            self.active = False
        return sent


def _drain(chan: t.Any, out: t.List[bytes], err: t.List[bytes], sink: t.Optional[t.BinaryIO]) -> bool:
    """Take what stdout and stderr hold now; True when there was something."""
    progressed = False
    while chan.recv_ready():
        block = chan.recv(CHUNK)
        if sink is not None:
            sink.write(block)
        else:
            out.append(block)
        progressed = True
    while chan.recv_stderr_ready():
        err.append(chan.recv_stderr(CHUNK))
        progressed = True
    return progressed


def pump(
    chan: t.Any, stdin: t.Optional[bytes], src: t.Optional[t.BinaryIO], sink: t.Optional[t.BinaryIO], timeout: float
) -> t.Optional[ExecResult]:
    """Feed stdin and drain stdout+stderr together until exit or TIMEOUT; None when the connection died meanwhile.

    Reading both streams in one loop is what keeps a chatty stderr from
    stalling stdout (and the reverse); writing stdin in the same loop keeps a
    command that answers before it has read all its input from deadlocking.
    A transport that dies (closed by the host, or by the keepalive watchdog)
    closes the channel without an EOF: that is checked on every turn, so the
    wait ends within a second of it instead of at TIMEOUT.
    """
    deadline = time.monotonic() + timeout
    out: t.List[bytes] = []
    err: t.List[bytes] = []
    feed = _Feed(chan, stdin, src)
    fd = chan.fileno()
    while True:
        progressed = _drain(chan, out, err, sink)
        progressed = feed.step() or progressed
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            # data is complete; the exit status follows (or never comes if killed)
            chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), 5.0)))
            if not chan.exit_status_ready() and connection_lost(chan):
                return None
            break
        if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready() and connection_lost(chan):
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ExecResult(-1, b"".join(out), b"".join(err), timed_out=True)
        if not progressed:
            select.select([fd], [], [], min(remaining, 0.005 if feed.active else 1.0))
    rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
    return ExecResult(rc, b"".join(out), b"".join(err), signalled=rc == -1)
