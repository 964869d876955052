"""The lab (tests/lab/labctl/containers.py) clears the cgroups a killed CT left behind, and only empty ones of that CT.

A CT whose LXC monitor was SIGKILLed (a machine's processes killed between two runs) leaves
lxc/VMID and lxc.monitor/VMID behind; with Proxmox VE's fixed cgroup names the next lxc-start
fails with "Failed to create monitor cgroup". Real cgroups on the real cgroupfs, as root.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.lab.labctl import containers as lab

PIDS = "/sys/fs/cgroup/pids"

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir(PIDS),
                                 reason="creating cgroups needs root and the v1 pids hierarchy"), pytest.mark.processes]


@pytest.fixture
def cgroup_root(tmp_path):
    """A scratch cgroup on the real pids hierarchy, seen as the 'pids' controller of a root."""
    scratch = os.path.join(PIDS, "gpuops-test-%s" % uuid.uuid4().hex[:8])
    os.mkdir(scratch)
    (tmp_path / "pids").symlink_to(scratch)
    yield tmp_path, scratch
    for path, _dirs, _files in os.walk(scratch, topdown=False):  # the test's process has ended by now
        os.rmdir(path)


def test_a_killed_cts_empty_cgroups_go_and_a_held_one_stays(cgroup_root):
    root, scratch = cgroup_root
    for rel in ("lxc.monitor/999", "lxc/999/ns/system.slice/a.service", "lxc/999/ns/init.scope",
                "lxc/998/ns", "lxc.monitor/998"):
        os.makedirs(os.path.join(scratch, rel))
    held = os.path.join(scratch, "lxc/999/ns/init.scope")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(held, "cgroup.procs"), "w", encoding="ascii") as procs:
            procs.write("%d\n" % sleeper.pid)
        lab.clear_stale_cgroups("999", root=str(root))
        assert not os.path.exists(os.path.join(scratch, "lxc.monitor/999"))
        assert not os.path.exists(os.path.join(scratch, "lxc/999/ns/system.slice"))
        assert os.path.isdir(held), "a cgroup that holds a process is never removed"
        assert sleeper.poll() is None, "clearing cgroups signals nothing"
        for other in ("lxc/998/ns", "lxc.monitor/998"):
            assert os.path.isdir(os.path.join(scratch, other)), "another CT's cgroups are left alone"
    finally:
        sleeper.kill()
        sleeper.wait()
