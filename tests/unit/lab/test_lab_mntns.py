"""The lab's end of a lab host's mount namespace signals only that namespace's processes.

A namespace's inode number ('mnt:[N]') is handed to the next namespace the kernel creates once the first one
has ended (the lowest free number), so the number recorded at `lab up` can name a stranger's namespace at
`lab down`: the clean room's container, started beside the lab in CI, took it and `down` SIGKILLed its setup.
Real processes in real mount namespaces (unshare), as root.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.lab.labctl import supervisor as lab

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and overlays need root"), pytest.mark.processes]


def in_new_mount_ns(script: str) -> subprocess.Popen:
    """A shell in a new private mount namespace that prints 'ready' once SCRIPT's mounts are in place."""
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script + "\necho ready\nexec sleep 60"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.2)
    return proc.poll() is None


def test_a_namespace_that_took_the_recorded_number_is_left_alone(tmp_path):
    ns_dir = tmp_path / "ns"
    ns_dir.mkdir()
    stranger = in_new_mount_ns(":")
    try:
        number = os.readlink("/proc/%d/ns/mnt" % stranger.pid)
        assert lab.mntns_members(number) == [stranger.pid]  # the number alone takes it in
        lab.end_mount_ns(number, str(ns_dir))
        assert alive(stranger), "end_mount_ns signalled a namespace without the lab's overlays"
    finally:
        stranger.kill()
        stranger.wait()


def test_the_lab_hosts_namespace_is_ended(tmp_path):
    ns_dir, lower, target = tmp_path / "ns", tmp_path / "lower", tmp_path / "target"
    for path in (ns_dir / "t.upper", ns_dir / "t.work", lower, target):
        path.mkdir(parents=True)
    # the mount the supervisor makes (lab._overlay_file): an overlay whose upper layer lies under ns_dir
    host = in_new_mount_ns("mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s"
                           % (lower, ns_dir / "t.upper", ns_dir / "t.work", target))
    try:
        number = os.readlink("/proc/%d/ns/mnt" % host.pid)
        assert lab.mntns_members(number, lab.overlay_mark(str(ns_dir))) == [host.pid]
        lab.end_mount_ns(number, str(ns_dir))
        assert host.wait(timeout=10) == -9
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
