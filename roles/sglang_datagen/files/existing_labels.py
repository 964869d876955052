"""The distinct labels of the existing training set, read where it lives (the node), before anything is stopped.

Run by the role's validation pass with the node's Python (standard library only; nothing is installed yet)::

    existing_labels.py --path /srv/datagen/existing/train.jsonl --field category

Prints one JSON object: ``read`` (false with ``reason`` when the set could not be read here), ``values`` (the
distinct values of FIELD, as they are in the rows) and ``unlabelled`` (whether some row has no such value).
What the values mean (``category_map``, ``default_category``, the guess for unlabelled rows) is decided by the
pipeline's own ``datagen.existing``, on the controller (``python -m datagen check-mix``): only reading happens
here. JSON Lines and JSON files are read; Parquet only where ``pyarrow`` imports (only its FIELD column).
A directory means its ``.jsonl``/``.json``/``.parquet`` files, a glob its matches, as the pipeline reads them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, Iterator, List, Set

SUFFIXES = (".jsonl", ".json", ".parquet")
MAX_VALUES = 1000  # a field with more distinct values is not a category: the pipeline says what it makes of it


def data_files(path: str) -> List[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(root, name) for root, _dirs, names in os.walk(path) for name in names
                      if name.endswith(SUFFIXES))
    if any(char in path for char in "*?["):
        return sorted(match for match in glob.glob(path) if match.endswith(SUFFIXES))
    return [path]


def field_values(path: str, field: str) -> Iterator[Any]:
    """FIELD of every row of the file PATH (None for a row without it)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # not in the node's Python before the venv: the caller reports it

        table = pq.read_table(path, columns=[field]) if field in pq.read_schema(path).names else None
        if table is None:
            yield from [None] * pq.ParquetFile(path).metadata.num_rows
        else:
            yield from table.column(field).to_pylist()
        return
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".json"):
            rows = json.load(handle)
            for row in rows if isinstance(rows, list) else []:
                yield row.get(field) if isinstance(row, dict) else None
            return
        for line in handle:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the pipeline skips a torn line too
                yield row.get(field) if isinstance(row, dict) else None


def read_labels(path: str, field: str) -> Dict[str, Any]:
    values: Set[str] = set()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--path", required=True, help="existing_dataset.path, resolved on this node")
    parser.add_argument("--field", default="", help="existing_dataset.category_field ('' for none)")
    args = parser.parse_args()
    if not args.field:
        result: Dict[str, Any] = {"read": True, "values": [], "unlabelled": True}
    else:
        result = read_labels(args.path, args.field)
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
