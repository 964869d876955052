"""A ``systemctl`` that answers ``show`` from a table, for tests on hosts without systemd."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

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


def install_fake_systemctl(bin_dir: Path, units: Dict[str, Dict[str, str]]) -> Path:
    """Write ``BIN_DIR/systemctl`` answering ``show`` from ``{unit: {property: value}}``; put BIN_DIR first on PATH
    to use it. Returns its path."""
    answers = bin_dir / "answers.json"
    answers.write_text(json.dumps(units))
    script = bin_dir / "systemctl"
    script.write_text(_FAKE_SYSTEMCTL.format(python=sys.executable, answers=str(answers)))
    script.chmod(0o755)
    return script
