# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The collection's docsite files (docs/docsite/) as antsibull-docs reads them, in a second or two.

scripts/docs is the whole check (the plugin docs through ansible-doc, then a Sphinx build, about half a
minute); this is the part that needs neither: every guide in docs/docsite/rst/ is listed in extra-docs.yml
(else Sphinx warns it is in no toctree), and antsibull-docs' own linters of the extra docs and links.yml,
the ones ``antsibull-docs lint-collection-docs`` runs, find nothing.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.paths import ROOT

DOCSITE = ROOT / "docs" / "docsite"


def test_every_guide_is_in_the_extra_docs_index_and_every_entry_is_a_guide() -> None:
    index = yaml.safe_load((DOCSITE / "extra-docs.yml").read_text(encoding="utf-8"))
    listed = [entry for section in index["sections"] for entry in section["toctree"]]
    guides = sorted(path.stem for path in (DOCSITE / "rst").glob("*.rst"))
    assert len(listed) == len(set(listed)), "listed twice in extra-docs.yml: %s" % listed
    assert sorted(listed) == guides, "extra-docs.yml lists %s; docs/docsite/rst/ has %s" % (sorted(listed), guides)


# antsibull-docutils still calls docutils the pre-2.0 way (PendingDeprecationWarning); nothing here to act on
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_antsibull_docs_lints_the_extra_docs_and_links_clean() -> None:
    collection_links = pytest.importorskip("antsibull_docs.collection_links")
    lint_extra_docs = pytest.importorskip("antsibull_docs.lint_extra_docs")
    errors = collection_links.lint_collection_links(str(ROOT))
    errors += lint_extra_docs.lint_collection_extra_docs_files(str(ROOT))
    assert not errors, "\n".join("%s:%s:%s: %s" % error for error in errors)


def test_links_point_at_the_repository_galaxy_yml_names() -> None:
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))
    links = yaml.safe_load((DOCSITE / "links.yml").read_text(encoding="utf-8"))
    assert galaxy["repository"] == "https://github.com/%s" % links["edit_on_github"]["repository"]
