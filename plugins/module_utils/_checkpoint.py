# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Checkpoint integrity without torch: which is the newest checkpoint that is WHOLE.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, where torch may be missing or
slow to import, and where a 100 GB checkpoint must not be read to be judged).

What is judged, cheapest first, never reading tensor data:

* partial by name (``.tmp``, ``.partial``, ``.incomplete``, ``.tmp.``), empty, or
  modified less than ``settle`` seconds ago (a writer may still be appending);
* a ``torch.save`` zip: the end-of-central-directory record sits exactly at the end of
  the file, the central directory ends where that record (or its zip64 record) starts,
  and every member's local header + data lies before the central directory, the last
  one ending where it starts (a truncated or still-growing archive has no end record);
* a safetensors file: the header parses and its tensors tile the data exactly, as the
  upstream loader (``safetensors/src/tensor.rs``, ``Metadata::validate``) requires;
* a directory: torch DCP (``.metadata`` plus ``__<rank>_<n>.distcp`` shards), a Hugging
  Face ``save_pretrained`` directory (index ``weight_map`` or a single weights file),
  or any other directory of checkpoint files (DeepSpeed's ``global_step<N>``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import struct
import time
import typing as t
import zipfile
from dataclasses import asdict, dataclass

SETTLE = 2.0

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

PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete")
# Some transformers releases staged a Trainer checkpoint as ``tmp-checkpoint-<N>`` and renamed it when
# done; one left behind by a crash is a save that never finished.
PARTIAL_PREFIXES = ("tmp-checkpoint-",)

# Files whose loss or emptiness makes a directory checkpoint unusable; other files in it (configs,
# READMEs) are judged only when their format is one we can check.
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp", ".pkl", ".npz", ".npy",
                   ".msgpack", ".h5", ".gguf")
# In a directory scan these are bookkeeping beside the checkpoints, never one (an unknown-format file
# counts as whole, so a README.md newer than every checkpoint would otherwise win).
NOT_CANDIDATE_SUFFIXES = (".json", ".txt", ".md", ".log", ".yaml", ".yml", ".csv", ".lock", ".pid")
# ``latest`` (DeepSpeed), ``latest_checkpointed_iteration.txt`` (Megatron): a pointer, never a checkpoint.
POINTER_MAX_BYTES = 4096

JSON_MAX_BYTES = 16 * 1024 * 1024  # a JSON file beside the weights is parsed when no larger (tokenizer.json is ~10 MB)
DCP_METADATA_MAX_BYTES = 64 * 1024 * 1024  # read for shard names when no larger; bigger ones: shards only counted

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

_STEP = re.compile(r"step(?:s)?[_\-.=]?(\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9_]*$")
_DCP_SHARD_NAME = re.compile(rb"__\d+_\d+\.distcp")  # torch FileSystemWriter: f"__{rank}_{n}.distcp"
_DCP_RANK_METADATA = re.compile(r"^__\d+\.metadata$")  # written per rank when ranks do not coordinate
_HF_SHARD = re.compile(r"-\d{5}-of-\d{5}\.(?:safetensors|bin)$")  # save_pretrained's shard names
_HF_SINGLE = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class Verdict:
    path: str
    whole: bool
    kind: str  # 'torch-zip', 'zip', 'safetensors', 'dcp', 'hf', 'dir', 'file', 'partial', 'missing'
    why: str  # '' when whole and fully checked; else a short human reason
    step: int | None
    mtime: float
    size: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CheckpointScan:
    newest_whole: Verdict | None
    skipped: tuple[Verdict, ...]  # candidates newer than newest_whole that are not whole, newest first
    candidates: int

    def as_dict(self) -> dict:
        return {"newest_whole": self.newest_whole.as_dict() if self.newest_whole else None,
                "skipped": [v.as_dict() for v in self.skipped], "candidates": self.candidates}


# --- names -------------------------------------------------------------------------------------------


def _partial_name(name: str) -> str:
    """The marker that makes ``name`` a write in progress, or ''."""
    lower = name.lower()
    for suffix in PARTIAL_SUFFIXES:
        if lower.endswith(suffix):
            return suffix
    if ".tmp." in lower:
        return ".tmp."
    for prefix in PARTIAL_PREFIXES:
        if lower.startswith(prefix):
            return prefix
    return ""


def _stem(name: str) -> str:
    """``name`` without partial markers and up to three extensions, so the digits left are the name's own."""
    lower = name.lower()
    cut = lower.find(".tmp.")
    if cut >= 0:
        name = name[:cut]
    for suffix in PARTIAL_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[:-len(suffix)]
    for _round in range(3):
        stripped = _EXTENSION.sub("", name)
        if stripped == name or not stripped:
            break
        name = stripped
    return name


def step_from_name(name: str) -> int | None:
    """The training step a checkpoint's name carries: the number after 'step', else the last run of digits.

    ``ckpt-step000682.bin`` -> 682, ``global_step1500`` -> 1500, ``checkpoint-1500`` -> 1500,
    ``ckpt-000012.pt`` -> 12, ``model.safetensors`` -> None.
    """
    name = os.path.basename(name.rstrip("/"))
    found = _STEP.findall(name)
    if found:
        return int(found[-1])
    digits = _DIGITS.findall(_stem(name))
    return int(digits[-1]) if digits else None


# --- files -------------------------------------------------------------------------------------------


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


def _judge_format(path: str, size: int) -> tuple[str, bool, str]:
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


# --- directories -------------------------------------------------------------------------------------

_Files = t.Dict[str, os.stat_result]  # name -> stat of the regular files directly in one folder


def _listing(path: str) -> tuple[_Files, list[str]] | str:
    """Regular files (name -> stat) and subdirectory names directly in ``path``, or why not readable."""
    files: _Files = {}
    dirs: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    st = entry.stat()
                except OSError:
                    continue  # a dangling link: nothing a loader could read either
                if stat.S_ISDIR(st.st_mode):
                    dirs.append(entry.name)
                elif stat.S_ISREG(st.st_mode):
                    files[entry.name] = st
    except OSError as e:
        return "unreadable: %s" % (e.strerror or e)
    return files, sorted(dirs)


def _is_weights(name: str) -> bool:
    return name.lower().endswith(WEIGHT_SUFFIXES)


def _judge_member(folder: str, name: str, st: os.stat_result) -> tuple[bool, str, str]:
    """(whole, why, kind) of one file inside a directory checkpoint; kind 'json' for a JSON file parsed,
    'file' for one whose format is not checked."""
    path = os.path.join(folder, name)
    if st.st_size == 0:
        return (False, "%s is empty" % name, "partial") if _is_weights(name) else (True, "", "file")
    if name.lower().endswith(".json"):
        if st.st_size > JSON_MAX_BYTES:
            return True, "", "file"
        try:
            with open(path, "rb") as f:
                json.loads(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            return False, "%s does not parse: %s" % (name, e), "json"
        return True, "", "json"
    kind, whole, why = _judge_format(path, st.st_size)
    return whole, "" if whole else "%s: %s" % (name, why), kind


def _judge_members(folder: str, files: _Files, names: t.Iterable[str], prefix: str = "") -> tuple[str, int, int]:
    """(why the first broken one is not whole, weight files, weight files whose format is not checked)."""
    weights = unchecked = 0
    for name in sorted(names):
        whole, why, kind = _judge_member(folder, name, files[name])
        if not whole:
            return prefix + why, weights, unchecked
        if _is_weights(name) or kind in ("torch-zip", "zip", "safetensors"):
            weights += 1
            unchecked += kind == "file"
    return "", weights, unchecked


def _judge_dcp(path: str, files: _Files) -> tuple[bool, str]:
    """Whether a torch.distributed.checkpoint directory is complete, and why not (or what was not checked).

    torch's FileSystemWriter writes every ``__<rank>_<n>.distcp`` shard, then ``.metadata.tmp``, then
    renames it to ``.metadata``: the metadata is the commit. It is a pickle of torch classes (not
    unpickled here: no torch), but the shard names sit in it as plain strings.
    """
    metas = [".metadata"] if ".metadata" in files else sorted(n for n in files if _DCP_RANK_METADATA.match(n))
    if not metas:
        return False, ".metadata missing: the save did not finish"
    shards = sorted(n for n in files if n.endswith(".distcp"))
    if not shards:
        return False, "no .distcp shard"
    for name in metas + shards:
        if files[name].st_size == 0:
            return False, "%s is empty" % name
    unread = []
    for meta in metas:
        if files[meta].st_size > DCP_METADATA_MAX_BYTES:
            unread.append(meta)
            continue
        try:
            with open(os.path.join(path, meta), "rb") as f:
                named = sorted({m.decode() for m in _DCP_SHARD_NAME.findall(f.read())})
        except OSError as e:
            return False, "%s unreadable: %s" % (meta, e.strerror or e)
        missing = [n for n in named if n not in files]
        if missing:
            more = " (and %d more)" % (len(missing) - 1) if len(missing) > 1 else ""
            return False, "shard %s named in %s is missing%s" % (missing[0], meta, more)
    why = _judge_members(path, files, [n for n in files if n not in metas and n not in shards])[0]
    if why:
        return False, why
    return True, "%s too large to read for shard names: shards only counted" % ", ".join(unread) if unread else ""


def _hf_index(path: str, name: str) -> list[str] | str:
    """The files an HF index's ``weight_map`` names, or why the index is not usable."""
    try:
        with open(os.path.join(path, name), "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return "%s does not parse: %s" % (name, e)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return "%s has no weight_map" % name
    return sorted(set(weight_map.values()))


def _is_dcp(files: _Files) -> bool:
    return any(n == ".metadata" or n.endswith(".distcp") or _DCP_RANK_METADATA.match(n) for n in files)


def _is_hf(files: _Files) -> bool:
    return any(n.endswith(".index.json") or n in _HF_SINGLE or _HF_SHARD.search(n) for n in files)


def _judge_hf(path: str, files: _Files) -> tuple[bool, str]:
    """Whether a ``save_pretrained`` directory's weights are all there and whole, and why not."""
    named: set[str] = set()
    for index in sorted(n for n in files if n.endswith(".index.json")):
        shards = _hf_index(path, index)
        if isinstance(shards, str):
            return False, shards
        for shard in shards:
            # a weight_map names files beside the index; anything else is not this checkpoint's
            if shard not in files:
                return False, "shard %s named by %s is missing" % (shard, index)
        named.update(shards)
    # save_pretrained writes the index after the shards: shards that no index names are a save cut short
    orphans = sorted(n for n in files if _HF_SHARD.search(n) and n not in named)
    if orphans:
        return False, "shard %s is named by no index: the save did not finish" % orphans[0]
    why, _weights, unchecked = _judge_members(path, files, files)
    if why:
        return False, why
    return True, "%d weight file(s) of a format not checked" % unchecked if unchecked else ""


def _judge_plain_dir(path: str, groups: dict[str, _Files]) -> tuple[bool, str]:
    """Checkpoint files in no layout we know (DeepSpeed ``global_step<N>``, Megatron ``iter_<N>/mp_rank_00``):
    whole when it holds weights and every file in it, and one folder down, is whole."""
    weights = unchecked = 0
    for sub, files in sorted(groups.items()):
        why, found, not_checked = _judge_members(os.path.join(path, sub), files, files, sub + "/" if sub else "")
        if why:
            return False, why
        weights += found
        unchecked += not_checked
    if not weights:
        return False, "no checkpoint file in it"
    return True, "%d weight file(s) of a format not checked" % unchecked if unchecked else ""


def _partial_why(marker: str) -> str:
    pattern = "*" + marker if marker in PARTIAL_SUFFIXES else marker + "*" if marker in PARTIAL_PREFIXES else "*.tmp.*"
    return "named %s: a save in progress or abandoned" % pattern


def _settle_why(age: float, settle: float, what: str) -> str:
    if age < 0:  # a writer on a host whose clock runs ahead; it will settle once ours catches up
        return "modified %.1fs in the future (settle %.1fs): %s" % (-age, settle, what)
    return "modified %.1fs ago (settle %.1fs): %s" % (age, settle, what)


def _judge_dir(path: str, st: os.stat_result, now: float, settle: float, step: int | None) -> Verdict:
    listing = _listing(path)
    if isinstance(listing, str):
        return Verdict(path, False, "dir", listing, step, st.st_mtime, 0)
    files, dirs = listing
    kind = "dcp" if _is_dcp(files) else "hf" if _is_hf(files) else "dir"
    groups = {"": files}
    if kind == "dir":  # a layout we do not know may keep its files one folder down (Megatron's mp_rank_00)
        for sub in dirs:
            inner = _listing(os.path.join(path, sub))
            if isinstance(inner, str):
                return Verdict(path, False, kind, "%s: %s" % (sub, inner), step, st.st_mtime, 0)
            groups[sub] = inner[0]
    stats = [f for members in groups.values() for f in members.values()]
    # The folder's own mtime moves only when entries come and go; a file still growing moves its own.
    mtime = max([st.st_mtime] + [f.st_mtime for f in stats])
    size = sum(f.st_size for f in stats)

    def verdict(kind: str, whole: bool, why: str) -> Verdict:
        return Verdict(path, whole, kind, why, step, mtime, size)

    names = [os.path.basename(os.path.normpath(path))] + dirs + [n for members in groups.values() for n in members]
    marked = [(n, _partial_name(n)) for n in names if _partial_name(n)]
    if marked:
        name, marker = marked[0]
        return verdict("partial", False, _partial_why(marker) if name == names[0] else
                       "%s inside, %s" % (name, _partial_why(marker)))
    if not stats and not dirs:
        return verdict("partial", False, "empty directory")
    if now - mtime < settle:
        return verdict("partial", False, _settle_why(now - mtime, settle, "may still be written"))
    if kind == "dcp":
        return verdict(kind, *_judge_dcp(path, files))
    if kind == "hf":
        return verdict(kind, *_judge_hf(path, files))
    return verdict(kind, *_judge_plain_dir(path, groups))


# --- the API -----------------------------------------------------------------------------------------


def judge_checkpoint(path: str, now: float | None = None, settle: float = SETTLE) -> Verdict:
    """Whether the checkpoint at ``path`` (file or directory) is whole, judged without torch; never raises."""
    now = time.time() if now is None else now
    name = os.path.basename(os.path.normpath(path))
    step = step_from_name(name)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Verdict(path, False, "missing", "does not exist", step, 0.0, 0)
    except OSError as e:
        return Verdict(path, False, "missing", "cannot stat: %s" % (e.strerror or e), step, 0.0, 0)
    if stat.S_ISDIR(st.st_mode):
        return _judge_dir(path, st, now, settle, step)

    def verdict(kind: str, whole: bool, why: str) -> Verdict:
        return Verdict(path, whole, kind, why, step, st.st_mtime, st.st_size)

    if not stat.S_ISREG(st.st_mode):
        return verdict("file", False, "not a regular file")
    marker = _partial_name(name)
    if marker:
        return verdict("partial", False, _partial_why(marker))
    if st.st_size == 0:
        return verdict("partial", False, "empty file")
    if now - st.st_mtime < settle:
        return verdict("partial", False, _settle_why(now - st.st_mtime, settle, "may still be growing"))
    return verdict(*_judge_format(path, st.st_size))


@dataclass(frozen=True)
class _Candidate:
    path: str
    step: int | None
    mtime: float


def _is_pointer(entry: os.DirEntry) -> bool:
    """``latest`` and its kin: a symlink or a few bytes of text that name a checkpoint, not one."""
    if not entry.name.lower().startswith("latest"):
        return False
    try:
        return entry.is_symlink() or (entry.is_file() and entry.stat().st_size <= POINTER_MAX_BYTES)
    except OSError:
        return False


def _candidates_in(folder: str, patterns: t.Sequence[str]) -> list[_Candidate]:
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                # dot-names are hidden as a shell glob hides them: rsync's in-flight copies, NFS leftovers
                if name.startswith(".") or not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                    continue
                if name.lower().endswith(NOT_CANDIDATE_SUFFIXES) or _is_pointer(entry):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                    found.append(_Candidate(entry.path, step_from_name(name), st.st_mtime))
    except OSError:
        pass  # an unreadable folder holds no candidate we could judge
    return found


def _newest_first(candidates: t.Iterable[_Candidate]) -> list[_Candidate]:
    """By step where both have one, else by mtime.

    That rule is no total order once some names carry a step and some do not, so: the stepped ones
    in step order (mtime breaks ties), the others in mtime order, and the two lists merged by mtime,
    an unstepped candidate going before the first stepped one it is newer than.
    """
    candidates = list(candidates)
    stepped = sorted((c for c in candidates if c.step is not None), key=lambda c: (c.step, c.mtime, c.path),
                     reverse=True)
    plain = sorted((c for c in candidates if c.step is None), key=lambda c: (c.mtime, c.path), reverse=True)
    merged: list[_Candidate] = []
    i = j = 0
    while i < len(stepped) and j < len(plain):
        if plain[j].mtime > stepped[i].mtime:
            merged.append(plain[j])
            j += 1
        else:
            merged.append(stepped[i])
            i += 1
    return merged + stepped[i:] + plain[j:]


def scan_checkpoints(paths: t.Sequence[str], patterns: t.Sequence[str] = ("*",), now: float | None = None,
                     settle: float = SETTLE, limit: int = 2000) -> CheckpointScan:
    """The newest whole checkpoint among ``paths`` (files, or folders whose direct entries match ``patterns``).

    Candidates are judged newest first until one is whole, at most ``limit`` of them; the ones judged
    and found not whole come back in ``skipped``. A missing path adds nothing; nothing raises.
    """
    now = time.time() if now is None else now
    seen: dict[str, _Candidate] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found = _candidates_in(path, patterns)
        else:
            found = [_Candidate(path, step_from_name(os.path.basename(path)), st.st_mtime)]
        for candidate in found:
            seen.setdefault(os.path.abspath(candidate.path), candidate)
    skipped = []
    for candidate in _newest_first(seen.values())[:max(0, limit)]:
        verdict = judge_checkpoint(candidate.path, now=now, settle=settle)
        if verdict.whole:
            return CheckpointScan(verdict, tuple(skipped), len(seen))
        skipped.append(verdict)
    return CheckpointScan(None, tuple(skipped), len(seen))
