"""A full disk under ``work_dir``: recognise it, estimate what the stage needs, say so in one line.

A stage that runs out of space fails with a :class:`~datagen.util.DatagenError` naming the
filesystem's path, what is free on it and about how much the stage needs, instead of a
traceback from deep inside a writer (pyarrow reports ENOSPC as an ``OSError`` without
``errno``, only ``[errno 28]`` in its text). Nothing half-written is taken as done: the
shard stages build in a private directory that is removed on failure, generate appends whole
lines and cuts a torn last line on the next start, so after space is freed a plain re-run
completes the stage.
"""

from __future__ import annotations

import errno
import glob
import os
from typing import Any, Iterable, Optional

from datagen import paths
from datagen.gen.journal import count_lines

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_MARGIN = 1 << 20  # file system metadata, manifests, the progress file


def is_disk_full(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` or one of the exceptions it was raised from is a full disk or quota."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and (exc.errno in _FULL_ERRNOS or "[errno 28]" in str(exc).lower()):
            return True
        if "no space left on device" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _sizes(files: Iterable[str]) -> int:
    return sum(_size(f) for f in files)


def generate_needs(work_dir: str) -> int:
    """Bytes the rows still to generate take: the rows left times the mean written row so far.

    Before the first row the mean is guessed as four times the mean prompt line (a response
    plus its token ids is several times its prompt).
    """
    prompts = paths.in_work(work_dir, paths.PROMPTS)
    out = paths.in_work(work_dir, paths.GENERATED)
    total, done = count_lines(prompts), count_lines(out)
    if done:
        mean = _size(out) / done
    else:
        mean = 4 * _size(prompts) / max(total, 1)
    return int(max(total - done, 0) * mean)


def stage_needs(stage: str, work_dir: str, existing_files: Iterable[str] = ()) -> int:
    """About how many bytes ``stage`` writes into ``work_dir`` (an upper estimate, plus a margin)."""
    if stage == "generate":
        need = generate_needs(work_dir)
    elif stage == "tokenize":  # Parquet shards of token ids are smaller than the JSON lines they come from
        need = _size(paths.in_work(work_dir, paths.GENERATED))
    elif stage == "merge":
        need = _sizes(glob.glob(paths.in_work(work_dir, paths.TOKENIZED_DIR, "*.parquet"))) + _sizes(existing_files)
    else:
        need = 0
    return need + _MARGIN


def _human(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def message(stage: str, work_dir: str, needed: int) -> str:
    """The one line a stage that ran out of space prints: the path, what is free, what it needs."""
    try:
        free = free_bytes(work_dir)
    except OSError:
        free = 0
    return (f"{stage}: no space left on the filesystem of work_dir {work_dir} ({_human(free)} free); "
            f"this stage needs about {_human(needed)} there. Free space (or set work_dir to a larger "
            f"filesystem) and run again: the rows and stages already done are kept; a half-written row "
            f"or shard is never taken as done.")


def disk_full_message(stage: str, cfg: Any) -> str:
    """:func:`message` for a loaded config (``cfg.work_dir``, ``cfg.existing.files``)."""
    existing = getattr(getattr(cfg, "existing", None), "files", None) or ()
    return message(stage, cfg.work_dir, stage_needs(stage, cfg.work_dir, existing))
