"""The generate stage's durable output and resume index (private).

The output is append-only JSONL. A crash (``kill -9``, OOM, power loss) can leave
at most the last line torn, or after power loss a tail of NUL bytes; both are cut
off and kept in a ``.torn`` side file instead of being parsed as garbage. Resume
is keyed by row ``id``: the ids already written go into a sorted array of 64-bit
digests (8 bytes a row, so 1M finished rows cost 8 MB, not the ~100 MB of a set of
strings), never by line count.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from bisect import bisect_left
from typing import Iterable, Iterator, List, Optional, Tuple

from ..util import AtomicWriter

_CHUNK = 1 << 16


def digest(row_id: str) -> int:
    """64-bit key of an id; a collision would only skip a row, never duplicate one."""
    return int.from_bytes(hashlib.blake2b(row_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class DoneIndex:
    """An immutable set of ids, held as sorted 64-bit digests."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[int] = ()) -> None:
        # duplicates are harmless for bisect; no set: it would cost ~60 bytes a row at build time
        self._keys = array("Q", sorted(keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, row_id: object) -> bool:
        if not isinstance(row_id, str):
            return False
        key = digest(row_id)
        i = bisect_left(self._keys, key)
        return i < len(self._keys) and self._keys[i] == key


def repair_tail(path: str) -> bytes:
    """Cut everything after the last newline (a torn write) and return the cut bytes.

    NUL padding left by a power cut after the last newline goes with it: no
    newline was ever written after it, so the row it belongs to was never whole.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return b""
    try:
        size = os.fstat(fd).st_size
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - _CHUNK)
            nl = os.pread(fd, end - start, start).rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            end = start
        if keep == size:
            return b""
        torn = os.pread(fd, size - keep, keep)
        os.ftruncate(fd, keep)
        os.fsync(fd)
        return torn
    finally:
        os.close(fd)


def _fast_id(line: bytes) -> Optional[str]:
    """The id of a line this stage wrote (``{"id":"..."`` first, hex ids), without a full parse."""
    if line.startswith(b'{"id":"') and line.endswith(b"}\n") and b"\x00" not in line:
        end = line.find(b'"', 7)
        if end > 7:
            raw = line[7:end]
            if b"\\" not in raw:
                return raw.decode("utf-8", "surrogateescape")
    return None


def parse_id(line: bytes) -> Optional[str]:
    """The ``id`` of one output line, or None when the line is not a whole row."""
    found = _fast_id(line)
    if found is not None:
        return found
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"]:
        return obj["id"]
    return None


def iter_lines(path: str) -> Iterator[bytes]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        yield from fh


def scan_output(path: str) -> Tuple[DoneIndex, int, List[bytes]]:
    """(index of finished ids, number of rows, bad lines) of an output file after :func:`repair_tail`."""
    keys = array("Q")  # 8 bytes a row while scanning, not a list of int objects
    bad: List[bytes] = []
    rows = 0
    for line in iter_lines(path):
        if not line.strip(b" \t\r\n\x00"):
            continue
        row_id = parse_id(line)
        if row_id is None:
            bad.append(line)
            continue
        rows += 1
        keys.append(digest(row_id))
    return DoneIndex(keys), rows, bad


def quarantine(path: str, bad: List[bytes], side_path: str) -> None:
    """Move unparseable lines out of the output (kept in ``side_path``) with an atomic rewrite."""
    if not bad:
        return
    drop = set(bad)
    with open(side_path, "ab") as side:
        side.writelines(b if b.endswith(b"\n") else b + b"\n" for b in bad)
        side.flush()
        os.fsync(side.fileno())
    with AtomicWriter(path, "wb") as out:
        for line in iter_lines(path):
            if line not in drop and line.strip(b" \t\r\n\x00"):
                out.write(line)


def count_lines(path: str) -> int:
    """Newline count, read in 1 MiB blocks (a 2 GB file costs a second, not a parse)."""
    n = 0
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                n += block.count(b"\n")
    except FileNotFoundError:
        return 0
    return n


class AppendLog:
    """Append-only JSONL writer: rows buffer in memory, :meth:`flush` writes them in one call.

    ``flush_bytes=0`` never writes from :meth:`add`: the caller hands blocks
    (:meth:`take`) to a thread that writes and fsyncs them, because a write to a
    page under writeback can block for as long as the disk takes. The file is opened ``O_APPEND`` so a line is never interleaved with another
    writer's; :meth:`sync` makes what was flushed durable. Rows still buffered
    when the process dies were never written, so resume regenerates them
    instead of finding half of them.
    """

    def __init__(self, path: str, flush_bytes: int = 1 << 20) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._buf: List[str] = []
        self._size = 0
        self._flush_bytes = flush_bytes
        self.rows = 0

    def add(self, line: str) -> None:
        self._buf.append(line)
        self._size += len(line)
        self.rows += 1
        if self._flush_bytes and self._size >= self._flush_bytes:
            self.flush()

    @property
    def pending(self) -> int:
        """Characters buffered and not yet handed to the OS."""
        return self._size

    def take(self) -> bytes:
        """The buffered rows as one block, buffer emptied (the caller writes it with :meth:`write`)."""
        if not self._buf:
            return b""
        data = "".join(self._buf).encode("utf-8", "surrogatepass")
        self._buf.clear()
        self._size = 0
        return data

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def flush(self) -> None:
        self.write(self.take())

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                self.flush()
                os.fsync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1
