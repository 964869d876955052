"""Running one of the collection's modules as Ansible runs it on a target: the lab's trainer harness has the one
runner (tests/lab/trainer/trainer_harness.py ``run_module``); this names the module."""

from __future__ import annotations

from typing import List, Optional

from trainer_harness import run_module as _run_module

MODULES = "ansible_collections.gpuops.repurpose.plugins.modules"


def run_module(module: str, args: dict, check_mode: bool = False, diff: bool = False, timeout: float = 120,
               prefix: Optional[List[str]] = None) -> dict:
    """The JSON result, with ``rc``, of the collection's module MODULE (``training_stop``) given ARGS, run in its own
    process (``python -m``, the collection on PYTHONPATH) within TIMEOUT s; AssertionError if it prints no JSON."""
    return _run_module(args, check_mode=check_mode, diff=diff, timeout=timeout, prefix=prefix,
                       module="%s.%s" % (MODULES, module))
