# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""AWX's files: collections/requirements.yml installs the collection, execution-environment.yml builds.

Project sync is what AWX runs before a job: ``ansible-galaxy collection install
-r collections/requirements.yml`` into the job's ``requirements_collections``.
The git source is pointed at a local repository made from this working tree
(no network), so the test installs exactly what the URL would serve. ansible-builder
then reads the installed collection's ``meta/execution-environment.yml`` as it
does when it builds an image, and ``ansible-builder create`` accepts the
top-level definition as is, next to the tarball it installs. No image is built
here (no container engine, no registry): the generated Dockerfile's galaxy stage
is checked for what it needs, and its install command is run on the context's
``_build`` directory, which that stage copies to ``/build`` and runs in.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import built_collection as bc

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection installed the way AWX's project sync installs it; returns requirements_collections."""
    work = tmp_path_factory.mktemp("awx")
    repo = work / "repo"
    bc.copy_checkout(repo)
    commit = bc.git_snapshot(repo)

    requirements = yaml.safe_load((bc.ROOT / "collections" / "requirements.yml").read_text(encoding="utf-8"))
    (entry,) = requirements["collections"]
    assert entry["type"] == "git" and entry["name"].endswith("/repurpose.git"), entry
    collections = work / "requirements_collections"
    # the same source kind, served locally
    done = bc.install_requirements(entry, repo, commit, work / "requirements.yml", collections, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    version = yaml.safe_load((bc.ROOT / "galaxy.yml").read_text(encoding="utf-8"))["version"]
    assert f"gpuops.repurpose:{version} was installed successfully" in done.stdout, done.stdout
    return collections


def test_project_sync_installs_the_collection_without_the_lab_and_it_resolves_the_playbook(synced: Path) -> None:
    installed = synced / "ansible_collections" / "gpuops" / "repurpose"
    assert (installed / "MANIFEST.json").is_file() and (installed / "roles" / "stop_training").is_dir()
    assert not (installed / "tests").exists() and not (installed / ".collections").exists()
    done = subprocess.run(
        [str(bc.BIN / "ansible-playbook"), "--syntax-check", "gpuops.repurpose.repurpose_ct200"],
        cwd=synced.parent, env=bc.installed_env(synced), capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ansible_builder_reads_the_collection_s_python_needs(synced: Path) -> None:
    done = subprocess.run([str(bc.BIN / "ansible-builder"), "introspect", str(synced)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "paramiko" in done.stdout and "gpuops.repurpose" in done.stdout, done.stdout


GALAXY_STAGE = "FROM base AS galaxy"
COLLECTION_INSTALL = "ansible-galaxy collection install"
# a package manager's install of git, in a RUN line (ansible-builder's $PKGMGR, or one named)
GIT_INSTALL = re.compile(r"^RUN .*(?:\$PKGMGR|\b(?:dnf|microdnf|yum|apt-get))\b.*\binstall\b.*\bgit\b")


def _galaxy_version() -> str:
    return str(yaml.safe_load((bc.ROOT / "galaxy.yml").read_text(encoding="utf-8"))["version"])


def _create_context(definition: Path, context: Path) -> subprocess.CompletedProcess:
    """``ansible-builder create`` of DEFINITION (relative paths in it are read from its directory) into CONTEXT."""
    return subprocess.run(
        [str(bc.BIN / "ansible-builder"), "create", "-f", definition.name, "--context", str(context)],
        cwd=definition.parent, capture_output=True, text=True, check=False,
    )


def galaxy_stage_problems(context: Path) -> list[str]:
    """What the galaxy stage of CONTEXT's Dockerfile lacks for its ``ansible-galaxy collection install``.

    A ``git`` requirement needs git installed before that line (in the base stage or ``prepend_galaxy``:
    centos stream9 has none); a ``file`` requirement needs its file in ``_build`` (the stage runs
    ``COPY _build /build`` and ``WORKDIR /build``, so a relative name is read from there).
    """
    lines = [line.strip() for line in (context / "Dockerfile").read_text(encoding="utf-8").splitlines()]
    if GALAXY_STAGE not in lines:
        return ["no galaxy stage in the Dockerfile"]
    stage = lines[lines.index(GALAXY_STAGE):]
    installs = [i for i, line in enumerate(stage) if line.startswith("RUN ") and COLLECTION_INSTALL in line]
    if not installs:
        return ["the galaxy stage installs no collection"]
    before = lines[:lines.index(GALAXY_STAGE)] + stage[:installs[0]]
    requirements = yaml.safe_load((context / "_build" / "requirements.yml").read_text(encoding="utf-8"))
    problems = []
    for entry in requirements.get("collections") or []:
        kind, name = entry.get("type", "galaxy"), str(entry["name"])
        if kind == "git" and not any(GIT_INSTALL.search(line) for line in before):
            problems.append(f"{name}: a git requirement, and git is not installed before the galaxy stage's install")
        if kind == "file":
            if not {"COPY _build /build", "WORKDIR /build"} <= set(stage[:installs[0]]):
                problems.append(f"{name}: the galaxy stage does not run in a copy of _build")
            relative = name.removeprefix("/build/")
            if relative.startswith("/") or not (context / "_build" / relative).is_file():
                problems.append(f"{name}: a file requirement, and the file is not in the build context's _build")
    return problems


@pytest.fixture(scope="module")
def ee_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context ``ansible-builder create`` makes from a checkout with the tarball just built in it."""
    work = tmp_path_factory.mktemp("ee")
    tree = work / "checkout"
    bc.copy_checkout(tree)
    tarball = bc.build(tree, tree)  # where `ansible-galaxy collection build` in a checkout writes it
    assert tarball.name == f"gpuops-repurpose-{_galaxy_version()}.tar.gz"
    done = _create_context(tree / "execution-environment.yml", work / "context")
    assert done.returncode == 0, done.stdout + done.stderr
    # ansible-builder only warns when an additional_build_files source is missing: the context must be whole
    assert "No matches" not in done.stdout + done.stderr, done.stdout + done.stderr
    return work / "context"


def test_ansible_builder_create_accepts_the_execution_environment_as_is(ee_context: Path) -> None:
    dockerfile = (ee_context / "Dockerfile").read_text(encoding="utf-8")
    assert "ansible-core==2.19.14" in dockerfile and COLLECTION_INSTALL in dockerfile
    # the image installs this collection, and only it, from the tarball built from this tree
    shipped = yaml.safe_load((ee_context / "_build" / "requirements.yml").read_text(encoding="utf-8"))
    (entry,) = shipped["collections"]
    assert entry["type"] == "file", entry


def test_the_execution_environment_and_project_sync_pin_galaxy_yml_s_version() -> None:
    version = _galaxy_version()
    definition = yaml.safe_load((bc.ROOT / "execution-environment.yml").read_text(encoding="utf-8"))
    (entry,) = definition["dependencies"]["galaxy"]["collections"]
    tarball = f"gpuops-repurpose-{version}.tar.gz"
    assert Path(entry["name"]).name == tarball and str(entry["version"]) == version, entry
    sources = [Path(extra["src"]).name for extra in definition["additional_build_files"]]
    assert tarball in sources, sources
    requirements = yaml.safe_load((bc.ROOT / "collections" / "requirements.yml").read_text(encoding="utf-8"))
    (synced,) = requirements["collections"]
    assert str(synced["version"]) == version, synced


def test_the_galaxy_stage_has_what_its_install_needs(ee_context: Path) -> None:
    assert galaxy_stage_problems(ee_context) == []


def test_the_galaxy_stage_s_install_installs_the_version_under_test(ee_context: Path, tmp_path: Path) -> None:
    """The stage's command, in a copy of _build as the image's /build: the tarball installs, pinned version."""
    collections = tmp_path / "collections"
    done = subprocess.run(
        [str(bc.BIN / "ansible-galaxy"), "collection", "install", "-r", "requirements.yml",
         "--collections-path", str(collections)],
        cwd=ee_context / "_build", env=bc.installed_env(collections, ANSIBLE_GALAXY_DISABLE_GPG_VERIFY="1"),
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"gpuops.repurpose:{_galaxy_version()} was installed successfully" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("galaxy", "extra", "problem"),
    [
        # a git source on a base image without git: the build would fail at the install
        ({"collections": [{"name": "https://git.example.internal/repurpose.git", "type": "git"}]}, {},
         "git is not installed"),
        ({"collections": [{"name": "https://git.example.internal/repurpose.git", "type": "git"}]},
         {"additional_build_steps": {"prepend_galaxy": ["RUN $PKGMGR install -y git && $PKGMGR clean all"]}}, None),
        # a file requirement whose tarball was never built (ansible-builder create only warns)
        ({"collections": [{"name": "collections/gpuops-repurpose-9.9.9.tar.gz", "type": "file"}]},
         {"additional_build_files": [{"src": "gpuops-repurpose-9.9.9.tar.gz", "dest": "collections"}]},
         "file is not in the build context"),
    ],
    ids=["git-without-git", "git-with-prepend-galaxy", "file-not-built"],
)
def test_the_galaxy_stage_check_finds_what_is_missing(tmp_path: Path, galaxy: dict, extra: dict,
                                                      problem: str | None) -> None:
    definition = yaml.safe_load((bc.ROOT / "execution-environment.yml").read_text(encoding="utf-8"))
    definition["dependencies"]["galaxy"] = galaxy
    definition.pop("additional_build_files", None)
    definition.update(extra)
    path = tmp_path / "execution-environment.yml"
    path.write_text(yaml.safe_dump(definition), encoding="utf-8")
    done = _create_context(path, tmp_path / "context")
    assert done.returncode == 0, done.stdout + done.stderr
    problems = galaxy_stage_problems(tmp_path / "context")
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_inventories_use_no_paths_relative_to_their_own_directory() -> None:
    """AWX imports an inventory's variables as data and runs jobs elsewhere: inventory_dir paths break there."""
    offenders = [
        str(path.relative_to(bc.ROOT))
        for path in sorted((bc.ROOT / "inventories").rglob("*.yml"))
        if "inventory_dir" in path.read_text(encoding="utf-8") or "../" in path.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders
