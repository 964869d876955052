# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Download one file over SFTP (version 3) with a bounded number of reads in flight.

Not paramiko's SFTPClient.getfo: its prefetch calls itself done whenever every read request sent so
far is answered, though its thread has more to send. A reader that catches up with a starved thread
(a loaded machine) then reads the rest one request at a time, while every answer to what the thread
still sends piles up unread: the whole file in memory (seen in CI: 264 MiB for 200 MiB). Reading in
windows of its public readv avoids that but was 2.6x slower, and paramiko offers no public call that
keeps N reads in flight. So this speaks the few SFTP messages a download needs (draft-ietf-secsh-
filexfer-02: INIT, OPEN, FSTAT, READ, CLOSE) itself, over a session channel running the sftp
subsystem: anything with ``sendall`` and ``recv`` (paramiko's public Channel, or a socket in tests).
It sends the reads from this thread, never more than GET_DEPTH ahead of the local writes.
"""

from __future__ import annotations

import collections
import struct
import typing as t

from .wire import recv_exact

SFTP_READ = 32768  # bytes one read asks for: what every server answers in full (paramiko's MAX_REQUEST_SIZE)
GET_DEPTH = 64  # a download's reads in flight: 2 MiB ahead of the local writes
VERSION = 3
FXP_INIT, FXP_VERSION, FXP_OPEN, FXP_CLOSE, FXP_READ, FXP_FSTAT = 1, 2, 3, 4, 5, 8
FXP_STATUS, FXP_HANDLE, FXP_DATA, FXP_ATTRS = 101, 102, 103, 105
FXF_READ = 0x1
FX_OK, FX_EOF = 0, 1
ATTR_SIZE = 0x1


class Peer(t.Protocol):
    def sendall(self, data: bytes) -> t.Any: ...

    def recv(self, size: int) -> bytes: ...


def read_requests(size: int, block: int = SFTP_READ) -> t.Iterator[t.Tuple[int, int]]:
    """(offset, length) of the reads that cover SIZE bytes in order, BLOCK bytes each (none for 0)."""
    return ((offset, min(block, size - offset)) for offset in range(0, size, block))


def string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def packet(kind: int, body: bytes) -> bytes:
    return struct.pack(">IB", len(body) + 1, kind) + body


def read_packet(peer: Peer) -> t.Tuple[int, bytes]:
    """(message type, body) of the next packet from PEER."""
    (length,) = struct.unpack(">I", recv_exact(peer, 4))
    raw = recv_exact(peer, length)
    return raw[0], raw[1:]


def take_string(body: bytes, at: int) -> t.Tuple[bytes, int]:
    """The SFTP string at offset AT of BODY, and the offset after it."""
    (n,) = struct.unpack_from(">I", body, at)
    return body[at + 4:at + 4 + n], at + 4 + n


def status_error(body: bytes) -> Exception:
    """The exception a STATUS body (after its request id) stands for: EOFError for end of file."""
    (code,) = struct.unpack_from(">I", body, 4)
    try:
        message = take_string(body, 8)[0].decode("utf-8", "replace")
    except struct.error:
        message = ""
    if code == FX_EOF:
        return EOFError(message or "end of file")
    return OSError(code, message or "SFTP status %d" % code)


class Reader:
    """One open file on an SFTP server, read by a caller that numbers and matches its own requests."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.last_id = 0
        self.handle = b""
        self.early: t.Dict[int, t.Tuple[int, bytes]] = {}  # answers read while waiting for an older one

    def send(self, kind: int, body: bytes) -> int:
        """Send a request; its id."""
        self.last_id = (self.last_id + 1) & 0xFFFFFFFF
        self.peer.sendall(packet(kind, struct.pack(">I", self.last_id) + body))
        return self.last_id

    def answer(self, request: int) -> t.Tuple[int, bytes]:
        """(message type, body) answering REQUEST; answers to others read meanwhile wait for their turn
        (a server may answer out of order; there are never more of them than reads in flight)."""
        while request not in self.early:
            kind, body = read_packet(self.peer)
            self.early[struct.unpack_from(">I", body)[0]] = (kind, body)
        return self.early.pop(request)

    def call(self, kind: int, body: bytes, expect: int) -> bytes:
        """One request and its answer of type EXPECT (body after the id); a STATUS answer raises."""
        got, answer = self.answer(self.send(kind, body))
        if got == FXP_STATUS:
            raise status_error(answer)
        if got != expect:
            raise OSError("the SFTP server answered with message type %d where %d was due" % (got, expect))
        return answer[4:]

    def open(self, path: str) -> int:
        """Start the SFTP session, open PATH for reading; its size in bytes."""
        self.peer.sendall(packet(FXP_INIT, struct.pack(">I", VERSION)))
        kind, dummy_body = read_packet(self.peer)
        if kind != FXP_VERSION:
            raise OSError("the SFTP server answered INIT with message type %d" % kind)
        self.handle = take_string(self.call(FXP_OPEN, string(path.encode("utf-8")) + struct.pack(">II", FXF_READ, 0), FXP_HANDLE), 0)[0]
        attrs = self.call(FXP_FSTAT, string(self.handle), FXP_ATTRS)
        (flags,) = struct.unpack_from(">I", attrs)
        if not flags & ATTR_SIZE:
            raise OSError("the SFTP server did not say the size of %s" % path)
        return struct.unpack_from(">Q", attrs, 4)[0]

    def close(self) -> None:
        kind, answer = self.answer(self.send(FXP_CLOSE, string(self.handle)))
        if kind != FXP_STATUS:
            raise OSError("the SFTP server answered CLOSE with message type %d" % kind)
        if struct.unpack_from(">I", answer, 4)[0] != FX_OK:
            raise status_error(answer)

    def read_into(self, size: int, dst: t.BinaryIO, depth: int = GET_DEPTH) -> int:
        """Read SIZE bytes into DST with DEPTH reads in flight; the bytes written.

        A short answer (allowed, though OpenSSH never sends one) is asked again for the rest; an
        end of file before SIZE raises EOFError (the file shrank after it was sized).
        """
        todo = read_requests(size)
        retry: t.Deque[t.Tuple[int, int]] = collections.deque()  # what a short answer left out
        in_flight: t.Deque[t.Tuple[int, int, int]] = collections.deque()  # (request, offset, length), oldest first
        written = position = 0
        while True:
            while len(in_flight) < depth:
                nxt = retry.popleft() if retry else next(todo, None)
                if nxt is None:
                    break
                in_flight.append((self.send(FXP_READ, string(self.handle) + struct.pack(">QI", nxt[0], nxt[1])),) + nxt)
            if not in_flight:
                return written
            request, offset, length = in_flight.popleft()
            data = self.data(request, offset)
            if offset != position:  # only after a short answer: a seek flushes DST's buffer
                dst.seek(offset)
            dst.write(data)
            position = offset + len(data)
            written += len(data)
            if len(data) < length:  # a server may answer short: ask again for the rest
                retry.append((offset + len(data), length - len(data)))

    def data(self, request: int, offset: int) -> bytes:
        """The bytes answering read REQUEST at OFFSET; EOFError or OSError for anything else."""
        kind, body = self.answer(request)
        if kind == FXP_STATUS:
            raise status_error(body)
        if kind != FXP_DATA:
            raise OSError("the SFTP server answered a read with message type %d" % kind)
        data = take_string(body, 4)[0]
        if not data:
            raise OSError("the SFTP server answered a read at offset %d with no data" % offset)
        return data
