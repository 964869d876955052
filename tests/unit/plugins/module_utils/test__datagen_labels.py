"""_datagen.labels, the existing training set's labels read where it lives: on real files of each format; then
``dataset_labels_info`` in its own process."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import labels
from tests.support import datagen_rows as fx
from tests.support.module import run_module

pytestmark = pytest.mark.processes


@pytest.fixture
def labelled(tmp_path):
    """A directory with a JSON Lines file (one row unlabelled, one torn line) and a JSON file."""
    fx.write_jsonl(tmp_path / "d" / "a.jsonl", [{"category": "coding"}, {"category": "math"}, {"other": 1}])
    with open(tmp_path / "d" / "a.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"category": "torn\n')
    (tmp_path / "d" / "b.json").write_text(json.dumps([{"category": "coding"}, {"category": "science"}, "x"]))
    (tmp_path / "d" / "notes.txt").write_text("not data")
    return tmp_path / "d"


@pytest.mark.parametrize("case,where,field,expected", [
    ("a directory", "d", "category",
     {"read": True, "values": ["coding", "math", "science"], "unlabelled": True}),
    ("one file", "d/b.json", "category", {"read": True, "values": ["coding", "science"], "unlabelled": True}),
    ("a glob", "d/*.jsonl", "category", {"read": True, "values": ["coding", "math"], "unlabelled": True}),
    ("no field: no labels", "d", "", {"read": True, "values": [], "unlabelled": True}),
    ("a glob matching nothing", "d/nothing-*.jsonl", "category",
     {"read": False, "reason": "no .jsonl/.json/.parquet file at {d}/nothing-*.jsonl"}),
])
def test_read_labels(labelled, case, where, field, expected):
    path = str(labelled.parent / where)
    expected = {k: v.format(d=labelled) if isinstance(v, str) else v for k, v in expected.items()}
    assert labels.read_labels(path, field) == expected, case


def test_read_labels_says_why_a_set_cannot_be_read(tmp_path, monkeypatch):
    assert labels.read_labels(str(tmp_path / "absent.jsonl"), "category")["read"] is False
    (tmp_path / "bad.json").write_text("{not json")
    assert labels.read_labels(str(tmp_path / "bad.json"), "category")["read"] is False
    monkeypatch.setattr(labels, "MAX_VALUES", 2)
    fx.write_jsonl(tmp_path / "many.jsonl", [{"c": str(i)} for i in range(3)])
    assert labels.read_labels(str(tmp_path / "many.jsonl"), "c") == {"read": False, "reason": "c has over 2 distinct values"}


def test_parquet_reads_only_its_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"category": ["agent", None]}), str(tmp_path / "c.parquet"))
    pq.write_table(pa.table({"other": [1, 2]}), str(tmp_path / "o.parquet"))
    assert labels.read_labels(str(tmp_path / "c.parquet"), "category") == {"read": True, "values": ["agent"],
                                                                           "unlabelled": True}
    assert labels.read_labels(str(tmp_path / "o.parquet"), "category") == {"read": True, "values": [],
                                                                           "unlabelled": True}


def test_module_reads_the_labels_in_its_own_process(labelled):
    out = run_module("dataset_labels_info", {"path": str(labelled), "field": "category"}, check_mode=True)
    assert out["rc"] == 0 and out["changed"] is False, out
    assert (out["read"], out["values"], out["unlabelled"]) == (True, ["coding", "math", "science"], True)
    out = run_module("dataset_labels_info", {"path": str(labelled / "absent.jsonl"), "field": "category"})
    assert out["rc"] == 0 and out["read"] is False and "absent.jsonl" in out["reason"], out
