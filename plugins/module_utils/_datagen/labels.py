# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``dataset_labels_info``'s reading: the distinct labels of a training set, read where it lives.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets); Parquet only where ``pyarrow`` imports.

What the values mean (``category_map``, ``default_category``, the guess for unlabelled rows) is decided by the
pipeline's own ``datagen.existing``, on the controller: only reading happens here. JSON Lines and JSON files
are read; Parquet only its FIELD column. A directory means its ``.jsonl``/``.json``/``.parquet`` files, a glob
its matches, as the pipeline reads them.
"""

from __future__ import annotations

import glob
import json
import os
import typing as t

SUFFIXES = (".jsonl", ".json", ".parquet")
MAX_VALUES = 1000  # a field with more distinct values is not a category: the pipeline says what it makes of it


def data_files(path: str) -> t.List[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(root, name) for root, _dirs, names in os.walk(path) for name in names
                      if name.endswith(SUFFIXES))
    if any(char in path for char in "*?["):
        return sorted(match for match in glob.glob(path) if match.endswith(SUFFIXES))
    return [path]


def parquet_values(path: str, field: str) -> t.Iterator[t.Any]:
    import pyarrow.parquet as pq  # pylint: disable=import-error  # not on every node: the caller reports it

    if field not in pq.read_schema(path).names:
        yield from [None] * pq.ParquetFile(path).metadata.num_rows
        return
    yield from pq.read_table(path, columns=[field]).column(field).to_pylist()


def row_value(row: t.Any, field: str) -> t.Any:
    return row.get(field) if isinstance(row, dict) else None


def field_values(path: str, field: str) -> t.Iterator[t.Any]:
    """FIELD of every row of the file PATH (None for a row without it)."""
    if path.endswith(".parquet"):
        yield from parquet_values(path, field)
        return
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".json"):
            rows = json.load(handle)
            for row in rows if isinstance(rows, list) else []:
                yield row_value(row, field)
            return
        for line in handle:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the pipeline skips a torn line too
                yield row_value(row, field)


def read_labels(path: str, field: str) -> t.Dict[str, t.Any]:
    """``{read: true, values, unlabelled}``, or ``{read: false, reason}`` when the set cannot be read here."""
    if not field:
        return {"read": True, "values": [], "unlabelled": True}
    values: t.Set[str] = set()
    unlabelled = False
    try:
        files = data_files(path)
        if not files:
            return {"read": False, "reason": "no .jsonl/.json/.parquet file at %s" % path}
        for name in files:
            for value in field_values(name, field):
                if isinstance(value, str) and value:
                    values.add(value)
                    if len(values) > MAX_VALUES:
                        return {"read": False, "reason": "%s has over %d distinct values" % (field, MAX_VALUES)}
                else:
                    unlabelled = True
    except ImportError:
        return {"read": False, "reason": "a Parquet file, and no pyarrow in this Python"}
    except (OSError, ValueError) as exc:
        return {"read": False, "reason": str(exc)}
    return {"read": True, "values": sorted(values), "unlabelled": unlabelled}


def labels_info(p: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    """``dataset_labels_info``'s runner: never fails on what it reads (``read`` false says why)."""
    return dict(read_labels(p["path"], p["field"]), changed=False)
