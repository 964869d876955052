# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The built tarball: nothing git ignores, no lab or dev tooling, everything a user needs; it installs and documents.

The tarball is built from a copy of the checkout into which one path for every
``.gitignore`` pattern is planted (at the top and, for unanchored patterns, deep
inside a role), plus a ``.git`` directory and a ``.venv``: a new ``.gitignore``
entry that ``build_ignore`` does not follow fails here.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support import built_collection as bc

pytestmark = pytest.mark.processes

# The installed collection needs none of these: lab, tests, CI, dev scripts, molecule,
# checkout-only config (the lab inventory points into tests/lab).
DEV_ONLY = (
    "tests/", "scripts/", "extensions/", ".ci/", ".collections/", "collections/", "inventories/lab/",
    ".ansible-lint", ".gitignore", "ansible.cfg", "pyproject.toml", "requirements.txt", "execution-environment.yml",
    "requirements-importer.txt", "requirements-paramiko-oldest.txt", "examples/awx/",
)
# What a user of the installed collection runs and reads: every checkout file under these ships.
USER_CONTENT = (
    "plugins/", "roles/", "playbooks/", "meta/", "inventories/ct200/", "changelogs/",
    "README.md", "CHANGELOG.rst", "LICENSE", "LICENSES/", "docs/docsite/", "awx/", "examples/pve-host/",
)
NESTED = "roles/sglang_datagen/files/datagen"


def _planted_paths(gitignore: str) -> list[str]:
    """One path per .gitignore pattern (``*`` -> ``x``), also nested for unanchored ones."""
    planted = []
    for line in gitignore.splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith(("#", "!")):
            continue
        anchored = "/" in pattern.rstrip("/")  # git: a slash but a trailing one anchors the pattern
        name = pattern.strip("/").replace("*", "x")
        planted.append(name)
        if not anchored:
            planted.append(f"{NESTED}/{name}")
    return planted


def _plant(tree: Path, rel: str) -> str:
    """Create ``rel`` (a file when it looks like one, else a directory holding one); return the file's path."""
    name = Path(rel).name
    is_dir = name.startswith(".") or name.endswith(".egg-info") or "." not in name
    leaf = f"{rel}/planted" if is_dir else rel
    (tree / leaf).parent.mkdir(parents=True, exist_ok=True)
    (tree / leaf).write_bytes(b"planted\n")
    return leaf


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("tarball")
    tree = work / "src"
    files = bc.copy_checkout(tree)
    planted = _planted_paths((bc.ROOT / ".gitignore").read_text(encoding="utf-8"))
    subprocess.run(["git", "init", "-q", str(tree)], check=True)  # also plants a .git directory
    leaves = [_plant(tree, rel) for rel in planted]
    _plant(tree, "plugins/modules/__pycache__/x.cpython-311.pyc")
    # every planted path is one git ignores: the planting follows .gitignore, not a guess
    probe = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"], cwd=tree, input="\n".join(leaves),
        capture_output=True, text=True, check=False,
    )
    assert sorted(probe.stdout.split()) == sorted(leaves), probe.stderr
    tarball = bc.build(tree, work / "dist")
    with tarfile.open(tarball) as tar:
        members = {m.name: m for m in tar.getmembers()}
    return {"work": work, "tarball": tarball, "files": files, "planted": planted, "members": members}


def test_tarball_holds_no_ignored_git_venv_or_planted_path(built: dict) -> None:
    names = built["members"]
    bad = [n for n in names if n.startswith((".git", ".venv")) or "__pycache__" in n or n.endswith(".pyc")]
    bad += [n for n in names for p in built["planted"] if n == p or n.startswith(p + "/")]
    assert not bad, f"ignored paths in the tarball: {bad}"
    # every file is a checkout file (or one of the two manifests the build writes)
    files = [n for n, m in names.items() if m.isfile()]
    strays = sorted(set(files) - set(built["files"]) - {"MANIFEST.json", "FILES.json"})
    assert not strays, f"files that are not in the checkout: {strays}"
    assert not [n for n, m in names.items() if m.issym() or m.islnk()], "links in the tarball"


def test_tarball_leaves_the_lab_and_dev_tooling_out(built: dict) -> None:
    dev = [n for n in built["members"] if n.startswith(DEV_ONLY) or n + "/" in DEV_ONLY]
    assert not dev, f"lab/dev paths in the tarball: {dev}"


def test_tarball_carries_everything_a_user_needs(built: dict) -> None:
    wanted = {f for f in built["files"] if f.startswith(USER_CONTENT) and f != "changelogs/.plugin-cache.yaml"}
    missing = sorted(wanted - set(built["members"]))
    assert not missing, f"user content missing from the tarball: {missing}"
    assert {"plugins/connection/pct_ssh.py", "roles/stop_training/tasks/main.yml", "LICENSE"} <= wanted


def _plugins(installed: Path) -> dict[str, list[str]]:
    kinds = {"modules": "module", "connection": "connection", "action": "action", "lookup": "lookup",
             "filter": "filter", "callback": "callback", "inventory": "inventory", "become": "become"}
    found: dict[str, list[str]] = {}
    for directory, kind in kinds.items():
        for path in sorted((installed / "plugins" / directory).glob("[!_]*.py")):
            if kind == "filter" and "DOCUMENTATION" not in path.read_text():
                continue  # a file of several filters: each is documented in a .yml of its own
            found.setdefault(kind, []).append(f"{bc.NAMESPACE}.{bc.NAME}.{path.stem}")
        if kind == "filter":
            pages = [f"{bc.NAMESPACE}.{bc.NAME}.{path.stem}" for path in (installed / "plugins" / directory).glob("*.yml")]
            found[kind] = sorted(found.get(kind, []) + pages)
    return found


def test_installed_tarball_documents_every_plugin_and_role(built: dict) -> None:
    collections = built["work"] / "installed" / "collections"
    collections.mkdir(parents=True)
    installed = bc.install(built["tarball"], collections)
    env = bc.installed_env(collections)
    plugins = _plugins(installed)
    assert plugins.get("module") and plugins.get("connection")
    for kind, names in plugins.items():
        if kind == "action":  # action plugins are documented by their module
            continue
        out = subprocess.run(
            [str(bc.BIN / "ansible-doc"), "-t", kind, "--json", *names],
            cwd=collections.parent, env=env, capture_output=True, text=True, check=True,
        )
        docs = json.loads(out.stdout)
        assert sorted(docs) == sorted(names), out.stderr
        if kind == "filter":  # every filter the plugins export has its page
            listed = subprocess.run(
                [str(bc.BIN / "ansible-doc"), "-t", kind, "--list", "--json", f"{bc.NAMESPACE}.{bc.NAME}"],
                cwd=collections.parent, env=env, capture_output=True, text=True, check=True,
            )
            assert sorted(json.loads(listed.stdout)) == sorted(names), listed.stdout
        for name, doc in docs.items():
            assert doc["doc"]["filename"].startswith(str(installed)), f"{name} documented from {doc['doc']['filename']}"
            assert doc["doc"].get("short_description") and doc.get("examples"), f"{name}: incomplete docs"
    roles = sorted(p.name for p in (installed / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())
    assert roles == sorted(p.name for p in (bc.ROOT / "roles").iterdir() if p.is_dir())
    for role in roles:
        fqcn = f"{bc.NAMESPACE}.{bc.NAME}.{role}"
        out = subprocess.run(
            [str(bc.BIN / "ansible-doc"), "-t", "role", "--json", fqcn],
            cwd=collections.parent, env=env, capture_output=True, text=True, check=True,
        )
        doc = json.loads(out.stdout)[fqcn]
        assert doc["path"] == str(installed), doc["path"]
        assert doc["entry_points"]["main"]["options"], f"{fqcn}: no documented options"
