# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The changelog follows antsibull-changelog's rules (docs/development.md, "Changelog and releases").

antsibull-changelog lint (run by scripts/lint) checks the format; these check the
rules it does not, before a release (the fragments) and after one (the entries
``antsibull-changelog release`` moved into changelogs/changelog.yaml): one concise
``component - what changed.`` line per entry, written for a user (no CI, lab, test
suite, issue number or internal path), in plain RST (antsibull-changelog 0.36 leaves
ansible-doc markup such as ``O(...)`` in fragments as it is), no announcement of new
plugins, modules or roles (antsibull lists those itself from ``version_added``), and
no bugfix-type sections in the first release (there was no released code to fix).
CHANGELOG.rst, once there is one, is what ``antsibull-changelog generate`` makes.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

FRAGMENTS = sorted((ROOT / "changelogs" / "fragments").glob("*.y*ml"))
CONFIG = yaml.safe_load((ROOT / "changelogs" / "config.yaml").read_text())
RELEASES = yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text()).get("releases") or {}
FIRST_RELEASE = min(RELEASES, key=Version) if RELEASES else None
GALAXY_VERSION = str(yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"])
CHANGELOG_RST = (ROOT / "changelogs" / CONFIG["changelog_filename_template"]).resolve()
SUMMARY = CONFIG["prelude_section_name"]
SECTIONS = {name for name, _title in CONFIG["sections"]} | {CONFIG["trivial_section_name"], SUMMARY}
ONLY_AFTER_A_RELEASE = {"bugfixes", "security_fixes", "breaking_changes", "deprecated_features", "removed_features"}
MAX_CHARS = 250
ANNOUNCES_NEW = re.compile(r"^\W*(new|add(ed|s)?)\s+(\S+\s+)?(module|plugin|filter|lookup|connection|role|playbook)s?\b",
                           re.I)
# one line naming what changed: "training_stop - a match that ... is refused."
ENTRY = re.compile(r"^\S.*? - \S.*\.$")
# how the work went, not what changed for a user
INTERNAL = re.compile(
    r"\bCI\b|\b[Ll]ab\b|\b[Ff]ault suite\b|\b[Bb]ench(?:mark)?|\bpytest\b|\bmolecule\b|\b(?:tests|scripts)/"
    r"|#\d|\b[Ii]ssue\s+#?\d|\b[Tt]his stop\b|\bmodule_utils\b|\bplugin_utils\b|\b[Rr]efactor"
)
# ansible-doc markup that antsibull-changelog leaves unrendered in entries: write ``literal`` instead
RAW_MARKUP = re.compile(r"\b(?:[BCEILMOPUV]|RV)\(")
# the first release has nothing before it to compare with, and everything in it is new
COMPARES_WITH_BEFORE = re.compile(
    r"\b(?:no longer|as before|(?:earlier|previous) releases?|previously|used to)\b|\(was\b"
    r"|\bnew (?:options?|return values?|result keys?|variables?|subcommands?|action groups?|callbacks?)\b",
    re.I,
)


def _items(changes: dict) -> list[tuple[str, str]]:
    out = []
    for section, items in (changes or {}).items():
        items = [items] if isinstance(items, str) else items
        out += [(section, item) for item in items]
    return out


def fragment_entries(path: Path) -> list[tuple[str, str]]:
    data = yaml.safe_load(path.read_text()) or {}
    assert isinstance(data, dict), "%s: a mapping of section to entries" % path.name
    return _items(data)


# every entry, with where it is and whether it is (or will be) part of the first release
SOURCES = [(p.name, fragment_entries(p), not RELEASES) for p in FRAGMENTS] + [
    ("changelog.yaml %s" % version, _items(release.get("changes")), version == FIRST_RELEASE)
    for version, release in sorted(RELEASES.items(), key=lambda item: Version(item[0]))
]


def test_there_is_a_changelog():
    assert FRAGMENTS or RELEASES


@pytest.mark.parametrize("where, items, first_release", SOURCES, ids=[s[0] for s in SOURCES])
def test_entries_follow_the_rules(where, items, first_release):
    assert "playbook" not in where, "%s: galaxy-importer's ansible-lint takes it for a playbook; rename it" % where
    for section, entry in items:
        assert section in SECTIONS, "%s: unknown section %s (one of %s)" % (where, section, sorted(SECTIONS))
        assert not (first_release and section in ONLY_AFTER_A_RELEASE), (
            "%s: %s in the first release; describe the change under minor_changes" % (where, section))
        assert isinstance(entry, str) and "\n" not in entry.strip(), "%s: one line per entry" % where
        assert not RAW_MARKUP.search(entry), "%s: ansible-doc markup stays raw in CHANGELOG.rst; use ``x``: %s" % (
            where, entry)
        assert not INTERNAL.search(entry), "%s: says how the work went, not what changed for a user: %s" % (
            where, entry)
        assert not (first_release and COMPARES_WITH_BEFORE.search(entry)), (
            "%s: nothing was released before the first release: %s" % (where, entry))
        if section == SUMMARY:
            continue
        assert len(entry) <= MAX_CHARS, "%s: %d characters; say it in one concise line (<= %d)" % (
            where, len(entry), MAX_CHARS)
        assert ENTRY.match(entry), "%s: 'component - what changed.': %s" % (where, entry)
        assert not ANNOUNCES_NEW.search(entry), "%s: antsibull-changelog lists new plugins and roles itself: %s" % (
            where, entry)


def test_a_release_has_one_summary():
    summaries = [p.name for p in FRAGMENTS if SUMMARY in (yaml.safe_load(p.read_text()) or {})]
    assert len(summaries) <= 1, "one %s per release: %s" % (SUMMARY, summaries)
    for version, release in RELEASES.items():
        assert (release.get("changes") or {}).get(SUMMARY), "release %s has no %s" % (version, SUMMARY)
    if GALAXY_VERSION not in RELEASES:  # galaxy.yml names the release being prepared
        assert summaries, "galaxy.yml says %s, not released yet: add its %s fragment" % (GALAXY_VERSION, SUMMARY)


def _released(version: str) -> bool:
    """A version antsibull-changelog can list things under: a release, or one after the last (the next)."""
    if version in RELEASES:
        return True
    return Version(version) > max(map(Version, RELEASES)) if RELEASES else Version(version) >= Version(GALAXY_VERSION)


def _nested_version_added(spec: dict, above: str, where: str) -> list[str]:
    bad = []
    for name, item in (spec or {}).items():
        if not isinstance(item, dict):
            continue
        here = str(item.get("version_added") or above)
        if "version_added" in item and Version(here) <= Version(above):
            bad.append("%s.%s: version_added %s, not after its plugin's %s" % (where, name, here, above))
        for key in ("suboptions", "options", "contains"):
            bad += _nested_version_added(item.get(key), here, "%s.%s" % (where, name))
    return bad


def _plugin_docs() -> list[tuple[str, dict, dict]]:
    """(plugin, DOCUMENTATION, RETURN) of every documented plugin in plugins/."""
    docs = []
    for path in sorted((ROOT / "plugins").glob("*/*.py")):
        if path.parent.name in ("module_utils", "plugin_utils", "doc_fragments", "action") or path.name == "__init__.py":
            continue
        found = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "RETURN"):
                    found[target.id] = yaml.safe_load(node.value.value) or {}
        if "DOCUMENTATION" in found:
            docs.append((str(path.relative_to(ROOT)), found["DOCUMENTATION"], found.get("RETURN") or {}))
    return docs


def test_version_added_names_a_release():
    """New Modules/Plugins/Roles come from version_added: a released version (or the next), never one that wasn't."""
    bad = []
    docs = _plugin_docs()
    assert any(p.startswith("plugins/modules/") for p, _d, _r in docs)
    for path, doc, returns in docs:
        version = str(doc.get("version_added", ""))
        if not version or not _released(version):
            bad.append("%s: version_added %r" % (path, version or None))
            continue
        bad += _nested_version_added(doc.get("options"), version, path)
        bad += _nested_version_added(returns, version, path + " RETURN")
    for specs in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        role = specs.parents[1].name
        for entry, spec in (yaml.safe_load(specs.read_text())["argument_specs"] or {}).items():
            version = str(spec.get("version_added", ""))
            if not version or not _released(version):
                bad.append("role %s, entry point %s: version_added %r" % (role, entry, version or None))
                continue
            bad += _nested_version_added(spec.get("options"), version, "role %s" % role)
    assert not bad, "\n".join(bad)


def test_changelog_rst_is_what_antsibull_changelog_generates(tmp_path):
    if not RELEASES:
        assert not CHANGELOG_RST.exists(), "CHANGELOG.rst before any release: antsibull-changelog release writes it"
        return
    assert CHANGELOG_RST.is_file(), "released %s but no %s" % (sorted(RELEASES), CHANGELOG_RST.name)
    text = CHANGELOG_RST.read_text()
    assert not RAW_MARKUP.search(text), "raw ansible-doc markup in CHANGELOG.rst: %s" % RAW_MARKUP.search(text)
    for version in RELEASES:
        assert re.search(r"^v%s\n=+$" % re.escape(version), text, re.M), "CHANGELOG.rst has no v%s" % version
    pytest.importorskip("antsibull_changelog")
    generated = tmp_path / "CHANGELOG.rst"
    subprocess.run([sys.executable, "-m", "antsibull_changelog", "generate", "--output", str(generated)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    assert text == generated.read_text(), "CHANGELOG.rst differs from antsibull-changelog generate's output"
