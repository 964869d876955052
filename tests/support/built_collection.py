# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Build the collection tarball from a copy of the checkout and install it, as a user would.

Shared by tests/unit/packaging (contents, ansible-doc) and tests/integration
(the installed collection runs the playbook, ansible-runner). Every ansible
command run against the installed copy gets :func:`installed_env`: a config file
of its own and a cwd outside the checkout, so the checkout's ``ansible.cfg`` and
``.collections`` symlink can never be what resolves ``gpuops.repurpose``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.paths import BIN, ROOT

NAMESPACE, NAME = "gpuops", "repurpose"


def checkout_files(root: Path = ROOT) -> list[str]:
    """Tracked and untracked-but-not-ignored files, as a release from this working tree would hold."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    # files deleted but not yet committed are skipped: the copy is the tree as it is
    return sorted(f for f in out.split("\0") if f and ((root / f).is_symlink() or (root / f).is_file()))


def copy_checkout(dest: Path, root: Path = ROOT) -> list[str]:
    """Copy :func:`checkout_files` into ``dest``; return the copied relative paths."""
    files = checkout_files(root)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (root / rel).is_symlink():  # .collections/ansible_collections/gpuops/repurpose -> ../../..
            os.symlink(os.readlink(root / rel), target)
        else:
            shutil.copy2(root / rel, target)
    return files


def build(src: Path, out_dir: Path) -> Path:
    """``ansible-galaxy collection build``; return the tarball."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(out_dir), str(src)],
        cwd=out_dir, check=True, capture_output=True, text=True, env=installed_env(out_dir / "unused"),
    )
    (tarball,) = out_dir.glob(f"{NAMESPACE}-{NAME}-*.tar.gz")
    return tarball


def install(tarball: Path, collections_dir: Path) -> Path:
    """``ansible-galaxy collection install`` into ``collections_dir``; return the installed collection root."""
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--force", "-p", str(collections_dir), str(tarball)],
        cwd=collections_dir.parent, check=True, capture_output=True, text=True, env=installed_env(collections_dir),
    )
    return collections_dir / "ansible_collections" / NAMESPACE / NAME


def installed_env(collections_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for ansible commands that must see only the installed copy (no checkout config)."""
    cfg = collections_dir.parent / "ansible.cfg"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    if not cfg.exists():
        cfg.write_text(f"[defaults]\ncollections_path = {collections_dir}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(cfg),
        ANSIBLE_COLLECTIONS_PATH=str(collections_dir),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    env.update(extra)
    return env


def git(cwd: Path, *args: str) -> str:
    """``git ARGS`` in CWD with a throwaway identity; stdout (fails loudly)."""
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout


def git_snapshot(tree: Path) -> str:
    """Make TREE a git repository with one commit of everything in it; the commit id."""
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "snapshot")
    return git(tree, "rev-parse", "HEAD").strip()


def install_requirements(entry: dict, repo: Path, version: str, req_file: Path, collections_dir: Path,
                         cwd: Path) -> subprocess.CompletedProcess:
    """AWX's project sync: collections/requirements.yml's ENTRY with its git source served from REPO at VERSION,
    installed by ``ansible-galaxy collection install -r`` into COLLECTIONS_DIR (created)."""
    import yaml

    req_file.write_text(yaml.safe_dump({"collections": [dict(entry, name=f"file://{repo}", version=version)]}),
                        encoding="utf-8")
    collections_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "-r", str(req_file), "-p", str(collections_dir)],
        cwd=cwd, env=installed_env(collections_dir), capture_output=True, text=True, check=False,
    )
