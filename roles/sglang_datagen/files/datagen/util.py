"""Shared helpers: stable hashes, canonical prompts, JSONL streams, atomic writes and directory swaps, fingerprints."""

from __future__ import annotations

import difflib
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import unicodedata
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

_WS = re.compile(r"\s+")


class DatagenError(RuntimeError):
    """A stage could not do its job; the message says why and what to do."""


# ---------------------------------------------------------------- hashing

def bump(counts: Dict[str, int], key: str, by: int = 1) -> None:
    """Add ``by`` to ``counts[key]`` (a plain dict, as the manifests write it)."""
    counts[key] = counts.get(key, 0) + by


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` when a known name is close enough to NAME to be its typo (difflib, cutoff 0.6, as the
    collection's unknown_variables filter), else ''."""
    close = difflib.get_close_matches(str(name), sorted(str(k) for k in known), n=1, cutoff=0.6)
    return " (did you mean %s?)" % close[0] if close else ""


def blake(data: str, size: int = 8) -> bytes:
    return hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=size).digest()


def hash64(data: str) -> int:
    """8-byte digest as an int: the dedup index holds these (about 60 bytes per entry in a set)."""
    return int.from_bytes(blake(data, 8), "big")


def unit_interval(seed: int, key: str) -> int:
    """A seeded, order-independent rank for deterministic sampling (smaller = chosen first)."""
    return hash64(f"{seed}\x1f{key}")


def normalise_text(text: str) -> str:
    """Dedup form: NFKC, case-folded, whitespace collapsed (catches copies that differ only in spacing)."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def canonical_prompt(messages: List[Dict[str, Any]], tools: Optional[List[Any]] = None) -> str:
    """The prompt as one string: roles and normalised contents, plus tools with sorted keys.

    Assistant turns inside the prompt (multi-turn context) count: two conversations
    that share the last question but differ in history are different prompts.
    """
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True, ensure_ascii=False)
        calls = m.get("tool_calls")
        extra = json.dumps(calls, sort_keys=True, ensure_ascii=False) if calls else ""
        parts.append(f"{m.get('role', '')}\x1e{normalise_text(content)}{extra}")
    if tools:
        parts.append("tools\x1e" + json.dumps(tools, sort_keys=True, ensure_ascii=False))
    return "\x1d".join(parts)


def prompt_key(messages: List[Dict[str, Any]], tools: Optional[List[Any]] = None) -> int:
    """Dedup key, independent of the source: the same prompt from two datasets collides."""
    return hash64(canonical_prompt(messages, tools))


def stable_id(source: str, messages: List[Dict[str, Any]], tools: Optional[List[Any]] = None,
              canonical: Optional[str] = None) -> str:
    """Row id: hash of source name and canonical prompt (24 hex chars; collisions need ~2^48 rows)."""
    if canonical is None:
        canonical = canonical_prompt(messages, tools)
    return blake(source + "\x1f" + canonical, 12).hex()


# ---------------------------------------------------------------- JSONL

def iter_jsonl(path: str, tolerate_torn_tail: bool = True) -> Iterator[Tuple[int, Any]]:
    """Yield (line_no, obj or None) for each non-blank line; None marks a line that is not JSON.

    A last line without its newline that does not parse is a write torn by a crash:
    with ``tolerate_torn_tail`` it is skipped silently instead of reported.
    """
    with open(path, "rb") as fh:
        line_no = 0
        for raw in fh:
            line_no += 1
            if not raw.strip():
                continue
            try:
                yield line_no, json.loads(raw)
            except ValueError:
                # only the last line can lack its newline
                if tolerate_torn_tail and not raw.endswith(b"\n"):
                    return
                yield line_no, None


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _create_temp(path: str) -> Tuple[int, str]:
    """Create ``PATH.tmp-PID-RANDOM`` exclusively (no other writer, thread or process, shares it): (fd, name).

    Not mkstemp: it makes the file 0600, and giving it the usual mode needs the umask, which can
    only be read by changing it, process-wide, under the pipeline's other threads (two threads
    doing so at once can leave it 0). Here the kernel applies the umask to 0666 itself.
    """
    for _attempt in range(8):
        tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:  # one of 2**32 names taken: a leftover of a dead process with this PID
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


class AtomicWriter:
    """Write to ``PATH.tmp-PID-RANDOM`` beside the target; rename it over the target on success.

    A reader never sees half a file. The writer's PID in the temp name lets the next writer
    of the same path remove what a killed one (SIGKILL, a reboot) left between write and
    rename. ``durable`` fsyncs the file and its directory, so the rename survives a crash;
    a file rewritten every second that only reports (progress) can do without.
    """

    def __init__(self, path: str, mode: str = "w", durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        remove_dead_leftovers(path)
        fd, self.tmp = _create_temp(path)
        self.fh = os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")

    def __enter__(self):
        return self.fh

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            self.fh.flush()
            if self.durable:
                os.fsync(self.fh.fileno())
            self.fh.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self._discard()  # a full disk fails the flush: the temp file must not stay on it
            raise
        if self.durable:
            fsync_dir(self.path)

    def _discard(self) -> None:
        try:
            self.fh.close()  # flushes what is buffered, which fails again on a full disk
        except OSError:
            pass
        _unlink_quietly(self.tmp)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(path: str) -> None:
    """Make a rename or a new file in ``path``'s directory survive a crash."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, obj: Any, durable: bool = True) -> None:
    with AtomicWriter(path, durable=durable) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")


def read_json(path: str) -> Optional[Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def fresh_build_dir(out_dir: str) -> str:
    """An empty private sibling of ``out_dir`` (``OUT.tmp-PID``) to build the stage's next output in."""
    remove_dead_leftovers(out_dir)
    tmp_dir = out_dir + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    return tmp_dir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_leftovers(path: str) -> List[str]:
    """Remove ``PATH.tmp-PID…``/``PATH.old-PID`` left by a writer that was killed (its PID is gone).

    A stage SIGKILLed mid-write (or a container rebooted under it) leaves its private temp
    file or build directory behind: never a finished output, but it holds disk space the
    next run needs. What a process still running left (another run's write in progress,
    or this process's own) is left alone.
    """
    removed = []
    for kind in ("tmp", "old"):
        prefix = f"{path}.{kind}-"
        for leftover in glob.glob(glob.escape(prefix) + "*"):
            pid = leftover[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                if os.path.isdir(leftover) and not os.path.islink(leftover):
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    _unlink_quietly(leftover)
                removed.append(leftover)
    return removed


def swap_dir(tmp_dir: str, out_dir: str) -> None:
    """Put the finished ``tmp_dir`` in ``out_dir``'s place as a whole: a reader never sees half a set of shards."""
    if os.path.exists(out_dir):
        old_dir = out_dir + f".old-{os.getpid()}"
        os.rename(out_dir, old_dir)
        os.rename(tmp_dir, out_dir)
        shutil.rmtree(old_dir, ignore_errors=True)
    else:
        os.rename(tmp_dir, out_dir)


# ---------------------------------------------------------------- fingerprints

def file_stamp(path: str) -> Dict[str, Any]:
    """Cheap identity of an input file: path, size, mtime (re-hashing 2 GB of input on every run is not cheap)."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def fingerprint(parts: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()


def peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
