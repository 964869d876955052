"""Both ends of the paramiko range the execution environment allows (meta/ee-requirements.txt) are tested.

The newest is the project's own pin (requirements.txt), which every other test runs on. The oldest gets a venv of
its own (.venv-paramiko-oldest, scripts/setup), where this runs the SSH session's tests (real sshd on loopback,
real transfers) again: the session uses paramiko's public API only (SSHClient, Transport, Channel, SFTPClient),
and each of those calls must behave alike in every release the range admits.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.processes  # the oldest venv's pytest, with sshd

OLDEST_VENV = ROOT / ".venv-paramiko-oldest"
SESSION_TESTS = "tests/unit/plugins/plugin_utils/test__pct_ssh_session.py"


def pinned(requirements: str, name: str = "paramiko") -> str:
    """The version ``name==X`` pins in a requirements file's text."""
    found = re.search(r"^%s==(\S+)" % re.escape(name), requirements, re.MULTILINE | re.IGNORECASE)
    assert found, "no %s== pin" % name
    return found.group(1)


def ee_range() -> tuple[str, str]:
    """(lower bound, upper bound) of ``paramiko>=A,<B`` in meta/ee-requirements.txt."""
    text = (ROOT / "meta" / "ee-requirements.txt").read_text()
    found = re.search(r"^paramiko>=(\S+?),<(\S+)$", text, re.MULTILINE)
    assert found, "meta/ee-requirements.txt: expected paramiko>=LOW,<HIGH"
    return found.group(1), found.group(2)


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_pins_are_the_ends_of_the_ee_range():
    low, high = ee_range()
    oldest = pinned((ROOT / "requirements-paramiko-oldest.txt").read_text())
    newest = pinned((ROOT / "requirements.txt").read_text())
    # the oldest venv holds the lowest release the range admits (3.4 means 3.4.0)
    assert release(oldest) == release(low) + (0,) * (3 - len(release(low)))
    assert release(low) <= release(newest) < release(high)


@pytest.mark.skipif(not (OLDEST_VENV / "bin" / "python").exists(), reason="no .venv-paramiko-oldest: run scripts/setup")
def test_the_ssh_session_works_on_the_oldest_paramiko_the_ee_allows():
    python = str(OLDEST_VENV / "bin" / "python")
    version = subprocess.run([python, "-c", "import paramiko; print(paramiko.__version__)"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    assert version == pinned((ROOT / "requirements-paramiko-oldest.txt").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", SESSION_TESTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=500, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "skipped" not in summary, summary  # the sshd tests ran, none skipped
