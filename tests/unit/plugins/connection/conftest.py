"""The pct_ssh connection's documentation as Ansible renders it (doc fragments merged), once per session."""

from __future__ import annotations

import json
import os
import subprocess
import typing as t

import pytest

from tests.support import paths


@pytest.fixture(scope="session")
def pct_ssh_doc() -> t.Dict[str, t.Any]:
    """``ansible-doc -t connection --json gpuops.repurpose.pct_ssh``'s doc: every option, fragments included."""
    out = subprocess.run(
        [os.path.join(str(paths.BIN), "ansible-doc"), "-t", "connection", "--json", "gpuops.repurpose.pct_ssh"],
        cwd=paths.ROOT, capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    return json.loads(out)["gpuops.repurpose.pct_ssh"]["doc"]
