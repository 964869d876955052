"""The stop half as its lab tests run it: playbooks/repurpose_ct200.yml on inventories/lab with short rungs.

``FAST`` is the one set of quick settings every stop_training lab test starts from
(the role's defaults are the incident's, minutes long); a test puts its own extra
vars on top (later ``-e`` wins).
"""

from __future__ import annotations

import subprocess
from typing import Dict, Optional, Tuple

from tests.support.paths import LAB_INVENTORY, ROOT
from tests.support.playbook import playbook_argv, run_playbook, start_playbook

REPURPOSE_PLAYBOOK = ROOT / "playbooks" / "repurpose_ct200.yml"
# Short rungs keep the suites quick; the graceful trainer stops at the first.
FAST = {
    "repurpose_datagen": False,
    "stop_training_ladder": [
        {"signal": "SIGINT", "via": "tmux", "timeout": 20},
        {"signal": "SIGTERM", "timeout": 10},
        {"signal": "SIGKILL", "timeout": 5},
    ],
    "stop_training_kill_timeout": 5,
    "stop_training_gpu_timeout": 30,
    "stop_training_gpu_interval": 0.2,
    "stop_training_restart_timeout": 60,
}
# For the stubborn trainer (Ctrl-C ignored): short first rungs, so SIGKILL comes soon.
STUBBORN = dict(FAST, stop_training_ladder=[
    {"signal": "SIGINT", "via": "tmux", "timeout": 6},
    {"signal": "SIGTERM", "timeout": 4},
    {"signal": "SIGKILL", "timeout": 5},
])


def _extra(extra: Optional[dict]) -> list:
    return [FAST] + ([extra] if extra else [])


def argv(extra: Optional[dict] = None, *args: str) -> list:
    """ansible-playbook's argv for the repurpose playbook with ``FAST``, then EXTRA, then ARGS."""
    return playbook_argv(REPURPOSE_PLAYBOOK, LAB_INVENTORY, _extra(extra), args)


def play(extra: Optional[dict] = None, *args: str, timeout: float = 600) -> Tuple[int, str]:
    """Run the repurpose playbook to the end; (rc, stdout + stderr)."""
    run = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, _extra(extra), args, timeout=timeout)
    return run.rc, run.output


def start(extra: Optional[dict] = None, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """The repurpose playbook in its own process group (killable like a cancelled AWX job); ENV defaults to
    ``ansible_env()`` (tests/support/playbook.py)."""
    return start_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, _extra(extra), args, env=env)
