"""What every benchmark with goals shares: its ``--json``/``--check`` flags, and its end (print each goal
met or missed, save the summary, the exit status).

    ap = goal_flags(argparse.ArgumentParser(...))     # then the benchmark's own flags
    return finish(summary, goals, a.json, a.check)   # last line of a benchmark's main()
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, Mapping, Optional


def goal_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the two flags :func:`finish` reads to PARSER: ``--json FILE`` and ``--check``."""
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    return parser


def finish(summary: Dict[str, Any], goals: Mapping[str, bool], json_path: Optional[str], check: bool) -> int:
    """Print ``met``/``MISS`` per goal, write SUMMARY (with the goals under ``goals``) to JSON_PATH when given,
    and return the exit status: 1 when CHECK and a goal was missed, else 0."""
    summary["goals"] = dict(goals)
    for goal, ok in goals.items():
        print(f"  {'met ' if ok else 'MISS'}  {goal}")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2)
    return 1 if check and not all(goals.values()) else 0
