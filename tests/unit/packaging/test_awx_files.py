# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""AWX's files: collections/requirements.yml installs the collection, execution-environment.yml is accepted.

Project sync is what AWX runs before a job: ``ansible-galaxy collection install
-r collections/requirements.yml`` into the job's ``requirements_collections``.
The git source is pointed at a local repository made from this working tree
(no network), so the test installs exactly what the URL would serve. ansible-builder
then reads the installed collection's ``meta/execution-environment.yml`` as it
does when it builds an image, and ``ansible-builder create`` accepts the
top-level definition as is.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import built_collection as bc


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


def test_ansible_builder_create_accepts_the_execution_environment_as_is(tmp_path: Path) -> None:
    context = tmp_path / "context"
    done = subprocess.run(
        [str(bc.BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "--context", str(context)],
        cwd=bc.ROOT, capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    dockerfile = (context / "Dockerfile").read_text(encoding="utf-8")
    assert "ansible-core==2.19.14" in dockerfile and "ansible-galaxy" in dockerfile
    # the galaxy requirements the image installs are the project's own
    shipped = yaml.safe_load((context / "_build" / "requirements.yml").read_text(encoding="utf-8"))
    assert shipped == yaml.safe_load((bc.ROOT / "collections" / "requirements.yml").read_text(encoding="utf-8"))


def test_inventories_use_no_paths_relative_to_their_own_directory() -> None:
    """AWX imports an inventory's variables as data and runs jobs elsewhere: inventory_dir paths break there."""
    offenders = [
        str(path.relative_to(bc.ROOT))
        for path in sorted((bc.ROOT / "inventories").rglob("*.yml"))
        if "inventory_dir" in path.read_text(encoding="utf-8") or "../" in path.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders
