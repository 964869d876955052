"""The systemd units the role runs, as ``systemctl show`` tells (the role reads these as JSON).

``pipeline-state`` is what the role polls after it starts the pipeline unit: the unit's state
and how far the pipeline got past its start-up (``pipeline.ready.json``, written by the CLI).
:mod:`datagen.unapplied` asks the same ``systemctl show`` about the serving units.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any, Callable, Dict, Optional, Sequence

from datagen import paths
from datagen.util import DatagenError

PIPELINE_UNIT = "datagen-pipeline.service"
PIPELINE_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts")
SHOW_TIMEOUT_S = 30.0

Show = Callable[[str, Sequence[str]], str]


def parse_properties(text: str) -> Dict[str, str]:
    """``systemctl show`` output (``KEY=VALUE`` lines; a value may itself hold ``=``) as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_ready(text: Optional[str]) -> Dict[str, Any]:
    """``pipeline.ready.json``; {} when it is not there (yet) or not a JSON object."""
    if text is None:
        return {}
    try:
        ready = json.loads(text)
    except ValueError:
        return {}
    return ready if isinstance(ready, dict) else {}


def systemctl_show(unit: str, properties: Sequence[str]) -> str:
    """``systemctl show -p PROPS UNIT`` (bounded: systemd may hang on a bus timeout)."""
    argv = ["systemctl", "show", "-p", ",".join(properties), unit]
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=SHOW_TIMEOUT_S).stdout
    except FileNotFoundError:
        raise DatagenError("systemctl not found: this subcommand needs a systemd node") from None
    except subprocess.TimeoutExpired:
        raise DatagenError(f"`{' '.join(argv)}` did not answer within {SHOW_TIMEOUT_S:.0f} s; "
                           "check that systemd is responsive (systemctl status) and run again") from None


def pipeline_state(work_dir: str, show: Show = systemctl_show) -> Dict[str, Any]:
    """``{"unit": {ActiveState, SubState, Result, NRestarts}, "ready": pipeline.ready.json or {}}``."""
    unit = parse_properties(show(PIPELINE_UNIT, PIPELINE_PROPERTIES))
    try:
        with open(paths.in_work(work_dir, paths.READY), encoding="utf-8") as fh:
            text: Optional[str] = fh.read()
    except OSError:
        text = None
    return {"unit": unit, "ready": parse_ready(text)}
