"""The lab's (tests/lab/labctl/containers.py) shift of a container's ids into and out of an unprivileged container's map.

Real files under a temporary directory, chowned as root: the shift moves only ids of the range not yet shifted
(so it is idempotent and finishes an interrupted run), keeps set-id bits that chown clears, and never follows a
symlink out of the tree.
"""

from __future__ import annotations

import os
import stat

import pytest

from tests.lab.labctl import containers as lab

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


def owners(root) -> dict:
    return {str(path.relative_to(root)): (path.lstat().st_uid, path.lstat().st_gid) for path in root.rglob("*")}


def test_shift_in_is_idempotent_keeps_setid_bits_and_shift_out_restores(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("host file")
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("ct\n")
    (root / "home/user").mkdir(parents=True)
    os.chown(root / "home/user", 1000, 1000)
    (root / "usr/bin").mkdir(parents=True)
    tool = root / "usr/bin/tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o4755)
    (root / "escape").symlink_to(outside)
    before = owners(root)

    moved = lab.shift_ids(str(root), lab.ID_SHIFT)
    assert moved == len(before) + 1  # every entry and the root itself
    after = owners(root)
    assert after["home/user"] == (lab.ID_SHIFT + 1000, lab.ID_SHIFT + 1000)
    assert after["etc/hostname"] == (lab.ID_SHIFT, lab.ID_SHIFT)
    assert stat.S_IMODE(tool.stat().st_mode) == 0o4755, "chown clears set-id bits; the shift puts them back"
    assert (outside.stat().st_uid, outside.stat().st_gid) == (0, 0), "a symlink's target outside is left alone"
    assert lab.shift_ids(str(root), lab.ID_SHIFT) == 0, "shifting twice moves nothing"

    assert lab.shift_ids(str(root), -lab.ID_SHIFT) == len(before) + 1
    assert owners(root) == before
    assert stat.S_IMODE(tool.stat().st_mode) == 0o4755
