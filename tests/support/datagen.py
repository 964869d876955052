"""The datagen pipeline in CT200 as its lab tests watch it (straight through ``lxc-attach``, not the code under test)."""

from __future__ import annotations

import json
import time
from typing import List

from tests.support.paths import LAB_INVENTORY, TESTS
from tests.support.ssh import attach

WORK = "/srv/datagen/work"
# The role's converge play (the datagen half alone) and the lab inventory's datagen settings.
CONVERGE = TESTS / "integration" / "sglang_datagen" / "converge.yml"
LAB_VARS_FILE = LAB_INVENTORY / "group_vars" / "training_containers.yml"


def reset_pipeline(status: dict, vmid: str = "200") -> None:
    """A pipeline that must run again in container VMID: no finished marker, no generated rows."""
    attach(status, "rm", "-rf", f"{WORK}/pipeline.done", f"{WORK}/generated.jsonl", f"{WORK}/generate.progress.json",
           f"{WORK}/generate.errors.jsonl", f"{WORK}/tokenized", f"{WORK}/merged", f"{WORK}/report", vmid=vmid)


def wait_pipeline_finished(status: dict, timeout: float) -> None:
    """The pipeline runs on after the play: wait (bounded) until its unit has finished all its stages."""
    deadline = time.monotonic() + timeout
    while True:
        state = attach(status, "systemctl", "is-active", "datagen-pipeline.service", check=False).stdout.strip()
        marker = attach(status, "test", "-s", f"{WORK}/pipeline.done", check=False).returncode == 0
        if state in ("inactive", "failed") and marker:
            return
        assert state != "failed", attach(status, "journalctl", "-u", "datagen-pipeline", "--no-pager",
                                         check=False).stdout
        assert time.monotonic() < deadline, f"pipeline still {state}: " + attach(
            status, "journalctl", "-u", "datagen-pipeline", "--no-pager", "-n", "40", check=False).stdout
        time.sleep(1)


def generated_rows(status: dict) -> List[dict]:
    """The rows of generated.jsonl so far."""
    return [json.loads(line) for line in attach(status, "cat", f"{WORK}/generated.jsonl", check=False).stdout.splitlines()]
