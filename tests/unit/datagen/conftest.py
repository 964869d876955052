"""Shared set-up for the datagen tests: a tiny tokenizer (rows live in tests/support/datagen_rows.py), a systemctl."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.support import datagen_rows


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML chat template (tools aware), built locally: no Hub."""
    return datagen_rows.build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


_FAKE_SYSTEMCTL = '''#!{python}
"""systemctl show -p PROP[,PROP...] UNIT, answered as systemd does: one PROP=VALUE line per property
asked; a unit it does not know still shows its defaults (inactive, MainPID 0)."""
import json, sys
DEFAULTS = {{"ActiveState": "inactive", "SubState": "dead", "Result": "success", "NRestarts": "0",
             "NeedDaemonReload": "no", "MainPID": "0"}}
if sys.argv[1:3] != ["show", "-p"] or len(sys.argv) != 5:
    sys.exit("fake systemctl: only `show -p PROPS UNIT`, got %r" % sys.argv[1:])
props = dict(DEFAULTS, **json.load(open({answers!r})).get(sys.argv[4], {{}}))
for name in sys.argv[3].split(","):
    print("%s=%s" % (name, props.get(name, "")))
'''


@pytest.fixture
def fake_systemctl(tmp_path_factory, monkeypatch):
    """Put a ``systemctl`` on PATH that answers ``show`` from ``{unit: {property: value}}`` (no systemd here)."""
    bin_dir = tmp_path_factory.mktemp("bin")
    answers = bin_dir / "answers.json"

    def install(units):
        answers.write_text(json.dumps(units))
        script = bin_dir / "systemctl"
        script.write_text(_FAKE_SYSTEMCTL.format(python=sys.executable, answers=str(answers)))
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    return install
