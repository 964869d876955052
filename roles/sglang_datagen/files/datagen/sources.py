"""Source readers, and :func:`adapt`, which applies a source's adapter to one raw record.

The adapters live one per dataset in :mod:`datagen.adapters` (each module's docstring gives the dataset's Hugging
Face schema as read); what they share, :class:`~datagen.prompts.Unusable` included, is :mod:`datagen.prompts`.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from datagen.adapters import ADAPTERS
from datagen.prompts import Prompt, Unusable
from datagen.util import DatagenError


def adapt(spec: Any, raw: Any) -> Prompt:
    """Apply the source's adapter; the config's ``category`` overrides the adapter's."""
    if not isinstance(raw, dict):
        raise Unusable("malformed_record")
    messages, tools, category = ADAPTERS[spec.adapter].fn(raw, spec)
    category = spec.category or category
    if not category:
        raise Unusable("no_category")
    return messages, tools, category


# ---------------------------------------------------------------- readers

def iter_file(path: str) -> Iterator[Any]:
    """Records of one local file; a line or record that is not a JSON object yields None (counted)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DatagenError(f"cannot read Parquet file {path}: {exc}") from None
        for batch in pf.iter_batches(batch_size=2048):
            yield from batch.to_pylist()
        return
    if path.endswith(".json"):
        with open(path, "rb") as fh:
            head = fh.read(1)
            while head and head.isspace():
                head = fh.read(1)
        if head == b"[":  # a JSON array file, as hermes-function-calling-v1 and MetaMathQA ship
            with open(path, encoding="utf-8") as fh:
                yield from iter_json_array(fh, path)
            return
    from datagen.util import iter_jsonl

    for _line_no, obj in iter_jsonl(path, tolerate_torn_tail=False):
        yield obj


def iter_json_array(fh: Any, name: str, chunk: int = 1 << 20) -> Iterator[Any]:
    """Elements of a top-level JSON array, decoded one at a time (MetaMathQA's 395K-row file is one array:
    ``json.load`` would hold all of it in memory)."""
    decoder = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    started = False

    def more() -> bool:
        nonlocal buf, pos, eof
        data = fh.read(chunk)
        if not data:
            eof = True
            return False
        buf, pos = buf[pos:] + data, 0
        return True

    while True:
        while pos < len(buf) and (buf[pos].isspace() or (started and buf[pos] == ",")):
            pos += 1
        if pos >= len(buf):
            if not more():
                raise DatagenError(f"not valid JSON: {name}: the array is not closed")
            continue
        if not started:
            if buf[pos] != "[":
                raise DatagenError(f"not valid JSON: {name}: expected an array")
            started, pos = True, pos + 1
            continue
        if buf[pos] == "]":
            return
        try:
            obj, end = decoder.raw_decode(buf, pos)
        except ValueError as exc:
            if not eof and more():
                continue
            raise DatagenError(f"not valid JSON: {name}: {exc}") from None
        if end == len(buf) and not eof and more():
            continue  # a value ending exactly at the buffer's end may be cut short: decode it again
        pos = end
        yield obj


def iter_hub(spec: Any, key: str) -> Iterator[Any]:
    hub = spec.hub or {}
    try:
        import datasets  # optional: only for Hub sources
    except ImportError:
        raise DatagenError(
            f"{key}.hub: reading from the Hub needs the `datasets` package "
            "(pip install -r requirements-datagen.txt), or download the files and set path instead"
        ) from None
    try:
        ds = datasets.load_dataset(
            hub["repo"], hub.get("config"), split=hub.get("split", "train"), revision=hub["revision"],
            data_files=hub.get("data_files"), streaming=True,
        )
    except Exception as exc:  # network, auth, missing revision: all end the run with the reason
        raise DatagenError(f"{key}.hub: cannot open {hub.get('repo')}@{hub.get('revision')}: {exc}") from None
    yield from ds


def iter_source(spec: Any, index: int) -> Iterator[Any]:
    """Raw records of one source, at most ``limit``; read errors name ``sources[i]``."""
    key = f"sources[{index}]"
    n = 0
    if spec.hub:
        records: Iterator[Any] = iter_hub(spec, key)
    else:
        records = (r for f in spec.files for r in _iter_file_named(f, key))
    for rec in records:
        if spec.limit is not None and n >= spec.limit:
            return
        n += 1
        yield rec


def _iter_file_named(path: str, key: str) -> Iterator[Any]:
    try:
        yield from iter_file(path)
    except DatagenError as exc:
        raise DatagenError(f"{key}.path: {exc}") from None
    except OSError as exc:
        raise DatagenError(f"{key}.path: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DatagenError(f"{key}.path: {path} is not UTF-8 text") from None
