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
* a ``torch.save`` zip or a safetensors file by its framing (``_checkpoint.file``);
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
import time
import typing as t
from dataclasses import asdict, dataclass

from ansible_collections.gpuops.repurpose.plugins.module_utils._checkpoint.file import judge_file

SETTLE = 2.0

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
    kind, whole, why = judge_file(path, st.st_size)
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
    return verdict(*judge_file(path, st.st_size))


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
