# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The control socket's frames: a length-prefixed JSON header naming the sizes of the byte blobs after it."""

from __future__ import annotations

import json
import socket
import struct
import typing as t

from .command import CHUNK

Frame = t.Tuple[t.Dict[str, t.Any], t.List[bytes]]  # a header and the blobs it names


def send(sock: socket.socket, header: t.Dict[str, t.Any], *blobs: bytes) -> None:
    header = dict(header, blobs=[len(b) for b in blobs])
    raw = json.dumps(header).encode("utf-8")
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    for b in blobs:
        # an empty blob is already complete in the header: writing it anyway races the peer, which may have
        # read the whole frame, answered and closed, and the empty write then fails (EPIPE) after the fact
        if b:
            sock.sendall(b)


def recv_exact(sock: t.Any, n: int) -> bytes:
    """N bytes from SOCK (a socket or an SSH channel); EOFError when it closes first."""
    parts = []
    while n:
        block = sock.recv(min(n, CHUNK))
        if not block:
            raise EOFError("peer closed the socket")
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def recv(sock: socket.socket) -> Frame:
    (n,) = struct.unpack(">I", recv_exact(sock, 4))
    header = json.loads(recv_exact(sock, n).decode("utf-8"))
    return header, [recv_exact(sock, size) for size in header.get("blobs", [])]
