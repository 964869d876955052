"""Shared set-up for the datagen tests: the package on sys.path, a tiny tokenizer (rows live in dg_rows.py)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FILES = os.path.join(ROOT, "roles", "sglang_datagen", "files")
if FILES not in sys.path:
    sys.path.insert(0, FILES)
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # dg_rows.py
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML chat template (tools aware), built locally: no Hub."""
    import dg_rows

    return dg_rows.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
