# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The docs that ship read well from the tarball alone: Galaxy shows the README, and a user has only what installs.

Every link in a shipped Markdown or RST file resolves inside the tarball or is a public https URL; the README
starts with installing and using the collection, and its minimal inventory is one ansible-inventory reads.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.support import built_collection as bc

pytestmark = pytest.mark.processes

# [text](target) in Markdown; `text <target>`_ and .. _label: target in RST. Anchors (#...) and mailto: are not files.
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
RST_LINK = re.compile(r"`[^`<]*<([^>`]+)>`_{1,2}|^\.\. _[^:\n]+:[ \t]+(\S+)[ \t]*$", re.MULTILINE)


def links(name: str, text: str) -> list[str]:
    """The link targets in a shipped doc, by its kind (md or rst), without #anchors."""
    if name.endswith(".md"):
        found = MD_LINK.findall(text)
    else:
        found = [a or b for a, b in RST_LINK.findall(text)]
    # a target ending in _ is a reference to a label, not a file or URL
    return [target.split("#", 1)[0] for target in found if target.split("#", 1)[0] and not target.endswith("_")]


def link_problem(doc: str, target: str, members: set[str]) -> str | None:
    """Why TARGET, linked from DOC in the tarball, would not resolve for a user; None when it does."""
    if target.startswith("https://"):
        return None
    if re.match(r"^[a-z]+:", target):
        return "%s links to %s: only public https URLs or files in the tarball" % (doc, target)
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(doc), target))
    if resolved.startswith("../") or resolved not in members and not any(m.startswith(resolved + "/") for m in members):
        return "%s links to %s, which is not in the tarball" % (doc, target)
    return None


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The built tarball's text docs: {path: text} for every .md and .rst, plus '' for every other member."""
    work = tmp_path_factory.mktemp("docs")
    bc.copy_checkout(work / "src")
    built = bc.build(work / "src", work / "dist")
    docs = {}
    with tarfile.open(built) as tar:
        for member in tar.getmembers():
            docs[member.name] = ""
            if member.isfile() and member.name.endswith((".md", ".rst")):
                docs[member.name] = tar.extractfile(member).read().decode("utf-8")
    return docs


def test_link_problem_catches_what_a_tarball_user_could_not_follow() -> None:
    members = {"README.md", "docs/docsite/rst/awx.rst", "roles/x/README.md"}
    assert link_problem("README.md", "docs/docsite/rst/awx.rst", members) is None
    assert link_problem("roles/x/README.md", "../../docs/docsite/rst/awx.rst", members) is None
    assert link_problem("README.md", "https://github.com/gpuops/repurpose", members) is None
    assert "not in the tarball" in link_problem("README.md", "tests/lab/README.md", members)
    assert "not in the tarball" in link_problem("README.md", "../outside-the-collection/notes.md", members)
    assert "only public https" in link_problem("README.md", "http://pve1.example.internal:8006/", members)
    assert links("a.md", "see [x](docs/a.md#part) and [y](#local)") == ["docs/a.md"]
    assert links("a.rst", "see `x <https://e.org/>`_ and\n.. _lab: ../y.rst\n") == ["https://e.org/", "../y.rst"]
    assert links("a.rst", ".. _label:\n\nTitle\n=====\n\nsee `there <label_>`_\n") == []


def test_every_link_in_a_shipped_doc_resolves_in_the_tarball_or_is_public(tarball: dict[str, str]) -> None:
    members = set(tarball)
    docs = [name for name, text in tarball.items() if text]
    assert "README.md" in docs
    problems = [problem for doc in docs for target in links(doc, tarball[doc])
                if (problem := link_problem(doc, target, members))]
    assert not problems, "\n".join(problems)


def test_the_readme_starts_with_installing_and_using_the_collection(tarball: dict[str, str]) -> None:
    headings = re.findall(r"^## (.+)$", tarball["README.md"], re.MULTILINE)
    assert headings[0] == "Install" and {"A minimal inventory", "Use"} <= set(headings[:4]), headings
    assert "ansible-galaxy collection install gpuops.repurpose" in tarball["README.md"]
    for playbook in ("gpuops.repurpose.repurpose_ct200", "gpuops.repurpose.restore_training"):
        assert playbook in tarball["README.md"]


def test_the_readme_minimal_inventory_is_one_ansible_reads(tarball: dict[str, str], tmp_path: Path) -> None:
    section = tarball["README.md"].split("## A minimal inventory", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "inventory.yml").write_text(block, encoding="utf-8")
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-inventory")), "-i", str(tmp_path / "inventory.yml"), "--list"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )
    assert shown.returncode == 0 and "[WARNING]" not in shown.stderr, shown.stderr
    hosts = yaml.safe_load(shown.stdout)["_meta"]["hostvars"]
    assert hosts["ct200"]["ansible_connection"] == "gpuops.repurpose.pct_ssh"
    assert hosts["ct200"]["ansible_host"].endswith(".example.internal")
