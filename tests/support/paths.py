"""Where things are, and the one place in tests/ that touches ``sys.path``.

The lab's helper programs (tests/lab/trainer, fakegpu, sglang_standin, tokenizer) are
plain scripts that also run inside the containers, so they are not a package; the
collection is imported as ``ansible_collections.gpuops.repurpose`` through the
``.collections`` symlink tree; the datagen package lives in the role's ``files/``.
The ``tests`` package (tests/__init__.py) calls :func:`add_import_dirs` when it is
first imported, so every ``from tests.support... import`` finds all of them, in a fixed order.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import MutableMapping, Optional

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
LAB_DIR = TESTS / "lab"
LAB_CLI = LAB_DIR / "lab"
PLAYBOOKS = TESTS / "integration" / "playbooks"
ANSIBLE_CFG = ROOT / "ansible.cfg"
COLLECTIONS = ROOT / ".collections"
DATAGEN_FILES = ROOT / "roles" / "sglang_datagen" / "files"
# recorded replies and chat templates the datagen unit tests read
DATAGEN_FIXTURES = TESTS / "unit" / "datagen" / "fixtures"
# the virtual environment's bin: ansible-playbook, ansible, ansible-galaxy of the interpreter running the tests
BIN = Path(sys.executable).parent

TRAINER_DIR = LAB_DIR / "trainer"
FAKEGPU_DIR = LAB_DIR / "fakegpu"
STANDIN_DIR = LAB_DIR / "sglang_standin"
TOKENIZER_DIR = LAB_DIR / "tokenizer"

# Searched in this order (first wins): the collection, the datagen package, then the lab's helpers.
IMPORT_DIRS = (COLLECTIONS, DATAGEN_FILES, TRAINER_DIR, FAKEGPU_DIR, STANDIN_DIR, TOKENIZER_DIR)


def load_script(path: Path, name: str) -> ModuleType:
    """A program that is not in a package (tests/lab/lanes.py, tests/cleanroom/cleanroom.py) as module NAME."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The lab's lanes (tests/lab/lanes.py): independent copies of the lab. A pytest-xdist worker gwK runs its lab
# tests on lane K (scripts/test runs the lab stream with one worker per lane); any other process on
# $GPUOPS_LAB_LANE (default 0). The choice is put in the environment before anything reads it, so every
# `tests/lab/lab` and ansible command a test starts is on the same lane.
lanes = load_script(LAB_DIR / "lanes.py", "gpuops_lab_lanes")


def select_lane(environ: Optional[MutableMapping[str, str]] = None) -> lanes.Lane:
    """The lane of this test process, written to ENVIRON (default os.environ: GPUOPS_LAB_LANE; for lanes other
    than 0 also ANSIBLE_INVENTORY, so that an ansible command given no inventory is on the lane too)."""
    environ = os.environ if environ is None else environ
    worker = re.fullmatch(r"gw(\d+)", environ.get("PYTEST_XDIST_WORKER", ""))
    if worker:
        environ[lanes.LANE_ENV] = worker.group(1)
    lane = lanes.current(environ)
    environ[lanes.LANE_ENV] = str(lane.index)
    if lane.index:
        environ["ANSIBLE_INVENTORY"] = lane.inventory("lab")
    return lane


LANE = select_lane()
# the lane's inventories: the checkout's own for lane 0 (the README's lab), else the lane's rendering of them
LAB_INVENTORY = ROOT / "inventories" / "lab" if LANE.index == 0 else Path(LANE.inventory("lab"))
# the two-node lab (`tests/lab/lab up --nodes 2`): CT200 behind the lane's port, CT210 behind the next one
FLEET_INVENTORY = ROOT / "inventories" / "lab-fleet" if LANE.index == 0 else Path(LANE.inventory("lab-fleet"))


def add_import_dirs() -> None:
    """Put :data:`IMPORT_DIRS` at the front of ``sys.path``, each once (idempotent)."""
    missing = [str(d) for d in IMPORT_DIRS if str(d) not in sys.path]
    for entry in reversed(missing):
        sys.path.insert(0, entry)
