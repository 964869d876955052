"""Running one of the collection's modules as Ansible runs it on a target: its own process, ``python -m`` with the
collection on PYTHONPATH and the arguments as ``{"ANSIBLE_MODULE_ARGS": ...}``. The tests' one runner (the lab's
tests/lab/trainer/trainer_harness.py still has a ``run_module`` of its own for training_stop)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Union

from tests.support.paths import COLLECTIONS, ROOT

MODULES = "ansible_collections.gpuops.repurpose.plugins.modules"


def module_env(base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """BASE (default this process's environment) with the collection first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(COLLECTIONS), env.get("PYTHONPATH", "")) if p)
    return env


def module_command(module: str, args: dict, check_mode: bool = False, diff: bool = False,
                   python: str = sys.executable, prefix: Optional[List[str]] = None) -> List[str]:
    """The command line that runs the collection's module MODULE (``training_stop``) with ARGS; PREFIX wraps the
    interpreter PYTHON (``setpriv ...`` to run it as another user)."""
    payload = dict(args)
    if check_mode:
        payload["_ansible_check_mode"] = True
    if diff:
        payload["_ansible_diff"] = True
    argv = [python, "-m", "%s.%s" % (MODULES, module), json.dumps({"ANSIBLE_MODULE_ARGS": payload})]
    return list(prefix or []) + argv


def module_result(stdout: str, stderr: str, returncode: int) -> dict:
    """The module's JSON result with ``rc`` added; AssertionError showing its output if it printed no JSON."""
    try:
        result = json.loads(stdout)
    except ValueError:
        raise AssertionError("module printed no JSON (rc %s):\n%s\n%s" % (returncode, stdout, stderr)) from None
    result["rc"] = returncode
    return result


def run_module(module: str, args: dict, check_mode: bool = False, diff: bool = False, timeout: float = 120,
               prefix: Optional[List[str]] = None, env: Optional[Mapping[str, str]] = None,
               python: str = sys.executable, cwd: Union[str, Path] = ROOT) -> dict:
    """The JSON result, with ``rc``, of the collection's module MODULE (``training_stop``) given ARGS, run in its own
    process within TIMEOUT s (:func:`module_command`); ENV is its whole environment (default :func:`module_env`)."""
    argv = module_command(module, args, check_mode=check_mode, diff=diff, python=python, prefix=prefix)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=str(cwd), stdin=subprocess.DEVNULL,
                          env=dict(module_env() if env is None else env), check=False)
    return module_result(done.stdout, done.stderr, done.returncode)
