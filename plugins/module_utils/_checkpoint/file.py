# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Is one checkpoint file whole? A ``torch.save`` zip or a safetensors file, judged from its framing alone.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets); tensor data is never read.

* a ``torch.save`` zip: the end-of-central-directory record sits exactly at the end of
  the file, the central directory ends where that record (or its zip64 record) starts,
  and every member's local header + data lies before the central directory, the last
  one ending where it starts (a truncated or still-growing archive has no end record);
* a safetensors file: the header parses and its tensors tile the data exactly, as the
  upstream loader (``safetensors/src/tensor.rs``, ``Metadata::validate``) requires.
"""

from __future__ import annotations

import json
import struct
import typing as t
import zipfile

# The upstream loader refuses a larger header (MAX_HEADER_SIZE in safetensors/src/tensor.rs):
# a bigger length is garbage, and reading it would cost memory on the target for nothing.
SAFETENSORS_MAX_HEADER = 100_000_000

# Bits per element, as safetensors' ``Dtype::bitsize`` (F4 and F6 pack below a byte).
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_EOCD = struct.Struct("<4s4H2LH")  # signature, disks, entries, cd size, cd offset, comment length
_ZIP64_LOCATOR_S = struct.Struct("<4sLQL")
_ZIP64_EOCD_S = struct.Struct("<4sQ2H2L4Q")
_LOCAL = struct.Struct("<4s5H3L2H")
_ZIP_MAX_COMMENT = 0xFFFF
# A member written with general-purpose flag bit 3 is followed by a data descriptor (torch.save sets it):
# crc, compressed and uncompressed size, 32- or 64-bit, with or without its optional signature.
_DESCRIPTOR_SIZES = frozenset((12, 16, 20, 24))


def _read_at(f: t.BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    return f.read(size)


def _find_eocd(f: t.BinaryIO, size: int) -> tuple[int | None, int | None]:
    """(offset of the end-of-central-directory record that ends exactly at the end of the file, or None;
    offset of a complete record followed by more bytes, or None).

    A record that does not end the file (zipfile's backwards search would accept it) means bytes after
    the archive or a stray signature in tensor data; neither is a whole torch.save file. A record cut
    short (its signature there, its fields or comment not) is a truncated file like any other.
    """
    span = min(size, _EOCD.size + _ZIP_MAX_COMMENT)
    tail = _read_at(f, size - span, span)
    followed = None
    at = tail.rfind(_ZIP_EOCD)
    while at >= 0:
        if at + _EOCD.size <= len(tail):
            end = at + _EOCD.size + _EOCD.unpack_from(tail, at)[7]
            if end == len(tail):
                return size - span + at, None
            if end < len(tail) and followed is None:
                followed = size - span + at
        at = tail.rfind(_ZIP_EOCD, 0, at)
    return None, followed


def _central_directory(f: t.BinaryIO, eocd: int) -> tuple[int, int, int] | str:
    """(cd offset, cd size, where the cd must end) from the end record (zip64 when present), or why not."""
    cd_size, cd_offset = _EOCD.unpack(_read_at(f, eocd, _EOCD.size))[5:7]
    locator_at = eocd - _ZIP64_LOCATOR_S.size
    locator = _read_at(f, locator_at, _ZIP64_LOCATOR_S.size) if locator_at >= 0 else b""
    if len(locator) == _ZIP64_LOCATOR_S.size and locator[:4] == _ZIP64_LOCATOR:
        record_at = _ZIP64_LOCATOR_S.unpack(locator)[2]
        record = _read_at(f, record_at, _ZIP64_EOCD_S.size)
        if len(record) != _ZIP64_EOCD_S.size or record[:4] != _ZIP64_EOCD:
            return "zip64 end record missing at %d" % record_at
        fields = _ZIP64_EOCD_S.unpack(record)
        if record_at + 12 + fields[1] != locator_at:
            return "zip64 end record at %d does not end at its locator (%d)" % (record_at, locator_at)
        return fields[9], fields[8], record_at
    if cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        return "zip64 sizes without a zip64 locator"
    return cd_offset, cd_size, eocd


def _first_member_name(f: t.BinaryIO) -> str:
    """The first local header's name: a truncated archive's kind, when the end record is gone."""
    head = _read_at(f, 0, _LOCAL.size)
    if len(head) < _LOCAL.size or head[:4] != _ZIP_LOCAL:
        return ""
    return _read_at(f, _LOCAL.size, _LOCAL.unpack(head)[9]).decode("utf-8", "replace")


def _is_torch_member(name: str) -> bool:
    """torch.save names its pickle ``<archive>/data.pkl`` (one folder, whatever the archive name)."""
    return name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1)


def _judge_zip(f: t.BinaryIO, size: int) -> tuple[str, bool, str]:
    """(kind, whole, why) of a zip by its structure alone: no member data is read."""
    # torch.save writes data.pkl first: its name tells the kind even when the central directory is gone
    kind = "torch-zip" if _is_torch_member(_first_member_name(f)) else "zip"
    eocd, followed = _find_eocd(f, size)
    if eocd is None:
        if followed is not None:
            return kind, False, "zip end record at %d does not end the file (%d bytes)" % (followed, size)
        return kind, False, "truncated: no zip end record at the end of the file (%d bytes)" % size
    cd = _central_directory(f, eocd)
    if isinstance(cd, str):
        return kind, False, cd
    cd_offset, cd_size, cd_end = cd
    if cd_offset + cd_size != cd_end:
        # zipfile would shift every offset by the difference and carry on; torch.save never writes that.
        return kind, False, "central directory %d+%d does not end at the end record (%d)" % (
            cd_offset, cd_size, cd_end)
    try:
        f.seek(0)
        with zipfile.ZipFile(f) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        return kind, False, "central directory does not read: %s" % e
    kind = "torch-zip" if any(_is_torch_member(i.filename) for i in infos) else "zip"
    why = _zip_members_fit(f, sorted(infos, key=lambda i: i.header_offset), cd_offset)
    return kind, not why, why


def _zip_members_fit(f: t.BinaryIO, infos: list[zipfile.ZipInfo], cd_offset: int) -> str:
    """'' when every member's header and data lie before the central directory and the last ends at it."""
    end = 0
    previous: zipfile.ZipInfo | None = None
    for info in infos:
        if info.header_offset < end and previous is not None:
            return "member %s overlaps %s" % (info.filename, previous.filename)
        head = _read_at(f, info.header_offset, _LOCAL.size)
        if len(head) < _LOCAL.size or head[:4] != _ZIP_LOCAL:
            return "member %s: no local header at %d" % (info.filename, info.header_offset)
        fields = _LOCAL.unpack(head)
        end = info.header_offset + _LOCAL.size + fields[9] + fields[10] + info.compress_size
        if end > cd_offset:
            return "truncated: member %s ends at %d, past the central directory at %d" % (
                info.filename, end, cd_offset)
        previous = info
    gap = cd_offset - end
    if previous is None:
        return "" if gap == 0 else "%d bytes before the central directory, no member" % gap
    allowed = _DESCRIPTOR_SIZES if previous.flag_bits & 0x08 else (0,)
    if gap in allowed:
        return ""
    return "%d bytes between the last member (%s) and the central directory" % (gap, previous.filename)


def _judge_safetensors(f: t.BinaryIO, size: int) -> tuple[str, bool, str]:
    """(kind, whole, why) from the header alone, with the upstream loader's rules."""
    kind = "safetensors"
    if size < 8:
        return kind, False, "truncated: %d bytes, shorter than the 8-byte header length" % size
    (n,) = struct.unpack("<Q", _read_at(f, 0, 8))
    if n > SAFETENSORS_MAX_HEADER:
        return kind, False, "header length %d is not sane (more than %d)" % (n, SAFETENSORS_MAX_HEADER)
    if 8 + n > size:
        return kind, False, "truncated: header ends at %d, file has %d bytes" % (8 + n, size)
    try:
        header = json.loads(_read_at(f, 8, n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return kind, False, "header is not JSON: %s" % e
    if not isinstance(header, dict):
        return kind, False, "header is not a JSON object"
    tensors = _safetensors_entries(header)
    if isinstance(tensors, str):
        return kind, False, tensors
    why = _safetensors_tiling(tensors, n, size)
    if why:
        return kind, False, why
    unknown = sorted({x.dtype for x in tensors if x.dtype not in SAFETENSORS_DTYPE_BITS})
    return kind, True, ("dtype %s not known: those sizes not checked" % ", ".join(unknown)) if unknown else ""


class _Tensor(t.NamedTuple):
    name: str
    dtype: str
    shape: t.List[int]
    begin: int  # data_offsets, from the start of the data (after the 8 bytes and the header)
    end: int


def _is_count(value: t.Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _safetensors_entries(header: dict) -> list[_Tensor] | str:
    """(name, dtype, shape, begin, end) per tensor, or why the header is malformed."""
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                return "__metadata__ is not a map of strings"
            continue
        if not isinstance(info, dict):
            return "tensor %s: entry is not an object" % name
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            return "tensor %s: no dtype" % name
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            return "tensor %s: shape %r is not a list of sizes" % (name, shape)
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
            return "tensor %s: data_offsets %r is not [begin, end]" % (name, offsets)
        if offsets[1] < offsets[0]:
            return "tensor %s: data_offsets %r end before they begin" % (name, offsets)
        tensors.append(_Tensor(name, dtype, shape, offsets[0], offsets[1]))
    return tensors


def _safetensors_tiling(tensors: list[_Tensor], n: int, size: int) -> str:
    """'' when the tensors' bytes match their dtype and shape and tile the data from 0 to the file's end."""
    data = size - 8 - n
    if tensors:
        # Truncation first: it is what an interrupted save looks like, and the most useful thing to say.
        last = max(tensors, key=lambda x: x.end)
        if last.end > data:
            return "truncated: tensor %s ends at %d, file has %d bytes" % (last.name, 8 + n + last.end, size)
    for name, dtype, shape, begin, end in tensors:
        bits = SAFETENSORS_DTYPE_BITS.get(dtype)
        if bits is None:
            continue  # a dtype newer than this table: its size is not known here, the tiling still is
        count = 1
        for d in shape:
            count *= d
        if count * bits % 8:
            return "tensor %s: %s shape %s is not a whole number of bytes" % (name, dtype, shape)
        if end - begin != count * bits // 8:
            return "tensor %s: data_offsets [%d, %d] hold %d bytes, %s shape %s needs %d" % (
                name, begin, end, end - begin, dtype, shape, count * bits // 8)
    expect = 0
    for tensor in sorted(tensors, key=lambda x: (x.begin, x.end)):
        if tensor.begin < expect:
            return "tensor %s at %d overlaps the tensor before it (ending at %d)" % (tensor.name, tensor.begin, expect)
        if tensor.begin > expect:
            return "%d bytes unaccounted for before tensor %s" % (tensor.begin - expect, tensor.name)
        expect = tensor.end
    if expect != data:
        return "%d bytes after the last tensor (data ends at %d, file at %d)" % (data - expect, 8 + n + expect, size)
    return ""


def _looks_safetensors(head: bytes) -> bool:
    """Header length then ``{"`` or ``{}``: a safetensors file whatever its name."""
    if len(head) < 10 or head[8:10] not in (b'{"', b"{}"):
        return False
    return struct.unpack("<Q", head[:8])[0] <= SAFETENSORS_MAX_HEADER


def judge_file(path: str, size: int) -> tuple[str, bool, str]:
    """(kind, whole, why) of a regular file by what its bytes are; unknown formats are whole, unchecked."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            if head[:4] == _ZIP_LOCAL:
                return _judge_zip(f, size)
            if path.lower().endswith(".safetensors") or _looks_safetensors(head):
                return _judge_safetensors(f, size)
    except OSError as e:
        return "file", False, "unreadable: %s" % (e.strerror or e)
    return "file", True, "format not checked (not a torch.save zip or safetensors)"
