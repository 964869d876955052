"""The end every benchmark with goals shares: print each goal met or missed, save the summary, the exit status.

    return finish(summary, goals, a.json, a.check)   # last line of a benchmark's main()
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional


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
