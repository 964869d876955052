# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Licence files: every SPDX header cites a licence text that ships with the collection."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

SPDX = re.compile(r"SPDX-License-Identifier:\s*([A-Za-z0-9.+-]+)")
CITED = re.compile(r"\(see (LICENSES/[^ )]+)")


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as handle:
        return handle.read(4096)


def test_galaxy_licence_has_its_text_at_the_top_and_in_licenses() -> None:
    with open(os.path.join(ROOT, "galaxy.yml"), encoding="utf-8") as handle:
        galaxy = yaml.safe_load(handle)
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as handle:
        top = handle.read()
    with open(os.path.join(ROOT, "LICENSES", "GPL-3.0-or-later.txt"), encoding="utf-8") as handle:
        reuse = handle.read()
    assert "GNU GENERAL PUBLIC LICENSE" in top and "Version 3, 29 June 2007" in top
    assert top == reuse


def test_every_spdx_header_cites_a_shipped_licence_text() -> None:
    headers = 0
    for path in _tracked_files():
        head = _read(path)
        for ident in SPDX.findall(head):
            headers += 1
            assert os.path.isfile(os.path.join(ROOT, "LICENSES", ident + ".txt")), f"{path}: no LICENSES/{ident}.txt"
        for cited in CITED.findall(head):
            assert os.path.isfile(os.path.join(ROOT, cited)), f"{path} cites {cited}, which does not exist"
    assert headers > 0
