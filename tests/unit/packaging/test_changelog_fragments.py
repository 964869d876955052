# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Changelog fragments follow antsibull-changelog's rules (README, "Changelog fragments").

antsibull-changelog lint (run by scripts/lint) checks the format; these check the
rules it does not: one concise line per entry, no announcement of new plugins,
modules or roles (antsibull lists those itself), and no bugfix-type sections
before the first release (there is no released code to fix).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
FRAGMENTS = sorted((ROOT / "changelogs" / "fragments").glob("*.y*ml"))
CONFIG = yaml.safe_load((ROOT / "changelogs" / "config.yaml").read_text())
RELEASES = yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text()).get("releases") or {}
SECTIONS = {name for name, _title in CONFIG["sections"]} | {CONFIG["trivial_section_name"], CONFIG["prelude_section_name"]}
ONLY_AFTER_A_RELEASE = {"bugfixes", "security_fixes", "breaking_changes", "deprecated_features", "removed_features"}
MAX_CHARS = 250
ANNOUNCES_NEW = re.compile(r"^\W*(new|add(ed|s)?)\s+(\S+\s+)?(module|plugin|filter|lookup|connection|role|playbook)s?\b",
                           re.I)


def entries(path: Path) -> list[tuple[str, str]]:
    data = yaml.safe_load(path.read_text()) or {}
    assert isinstance(data, dict), "%s: a mapping of section to entries" % path.name
    out = []
    for section, items in data.items():
        items = [items] if isinstance(items, str) else items
        out += [(section, item) for item in items]
    return out


def test_there_are_fragments():
    assert FRAGMENTS


@pytest.mark.parametrize("path", FRAGMENTS, ids=lambda p: p.name)
def test_fragment_follows_the_rules(path):
    for section, entry in entries(path):
        assert section in SECTIONS, "%s: unknown section %s (one of %s)" % (path.name, section, sorted(SECTIONS))
        assert RELEASES or section not in ONLY_AFTER_A_RELEASE, (
            "%s: %s before the first release; describe the change under minor_changes" % (path.name, section))
        assert isinstance(entry, str) and "\n" not in entry.strip(), "%s: one line per entry" % path.name
        assert len(entry) <= MAX_CHARS, "%s: %d characters; say it in one concise line (<= %d)" % (
            path.name, len(entry), MAX_CHARS)
        assert not ANNOUNCES_NEW.search(entry), "%s: antsibull-changelog lists new plugins and roles itself: %s" % (
            path.name, entry)
