"""Shared set-up for the datagen tests: a tiny tokenizer (rows live in tests/support/datagen_rows.py)."""

from __future__ import annotations

import pytest

from tests.support import datagen_rows


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML chat template (tools aware), built locally: no Hub."""
    return datagen_rows.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))
