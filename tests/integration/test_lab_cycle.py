"""``lab down`` leaves no process, mount, container, user or sudo rule behind; ``lab up`` restores it.

Takes the shared lab down for about half a minute, so it runs only when
``GPUOPS_LAB_CYCLE=1`` (CI, where nobody else uses the lab at the time), and
always brings the lab back up (graceful trainer) before it returns.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess

import pytest

from tests.support.lab import DECOY_CT, MAIN_CT, lab_cli
from tests.support.paths import LANE

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.environ.get("GPUOPS_LAB_CYCLE") != "1",
                       reason="takes the shared lab down and up: set GPUOPS_LAB_CYCLE=1 to run it"),
]


def live(pid: int, starttime: int | None = None) -> bool:
    """Running (a zombie that this machine's PID 1 never reaps counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] not in ("Z", "X") and (starttime is None or int(fields[19]) == starttime)


def processes_matching(pred) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or not live(int(name)):
            continue
        try:
            if pred(int(name)):
                with open("/proc/%s/cmdline" % name, "rb") as handle:
                    found.append((int(name), handle.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return found


def in_lab_mntns(pid: int, mntns: str, ns_dir: str) -> bool:
    """In the lab host's mount namespace. Its inode number alone is not enough: once the namespace ends, the
    kernel gives the number to the next new one (a clean room started beside the lab took it); only the lab's
    namespace also shows the lab's overlays (upper layers under NS_DIR) in its mount table."""
    if os.readlink("/proc/%d/ns/mnt" % pid) != mntns:
        return False
    with open("/proc/%d/mountinfo" % pid, encoding="utf-8", errors="replace") as handle:
        return "upperdir=%s/" % ns_dir in handle.read()


def in_lab_cgroup(pid: int) -> bool:
    with open("/proc/%d/cgroup" % pid, encoding="utf-8") as handle:
        text = handle.read()
    # the lane's two containers (CT200, CT201 in lane 0); their monitors by the VMIDs' common prefix ("20")
    monitors = os.path.commonprefix([MAIN_CT, DECOY_CT])
    return ("lxc.payload.%s" % MAIN_CT in text or "lxc.payload.%s" % DECOY_CT in text
            or "lxc.monitor.%s" % monitors in text)


def test_down_leaves_nothing_and_up_restores(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the CT200 lab needs root")
    before = json.loads(lab_cli("status", timeout=900).stdout)
    if not before.get("up"):
        up = lab_cli("up", timeout=900)
        assert up.returncode == 0, up.stderr
        before = json.loads(lab_cli("status", timeout=900).stdout)
    lab_dir = before["lab_dir"]
    # `lab down` acts on this process's lane ($GPUOPS_LAB_LANE) only: the other lanes' labs stay up
    assert before["lane"]["index"] == LANE.index, before["lane"]
    with open(os.path.join(lab_dir, "supervisor.json"), encoding="utf-8") as handle:
        sup = json.load(handle)
    mntns = sup["mntns"]
    recorded = [sup["supervisor"], sup["sshd"]] + ([sup["driver"]] if sup.get("driver") else [])
    trainer_pids = [before["trainer"]["host_pids"]["launcher"], *before["trainer"]["host_pids"]["workers"]]
    cache = [os.path.join("/var/cache/gpuops-lab", n) for n in os.listdir("/var/cache/gpuops-lab")
             if n.startswith("rootfs-")]
    try:
        down = lab_cli("down", timeout=900)
        assert down.returncode == 0, down.stderr

        for ref in recorded:
            assert not live(ref["pid"], ref["starttime"]), ref
        for pid in trainer_pids:
            assert not live(pid), pid
        left_in_ns = processes_matching(lambda pid: in_lab_mntns(pid, mntns, os.path.join(lab_dir, "ns")))
        assert left_in_ns == []
        assert processes_matching(in_lab_cgroup) == []
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            # the lane's directory or anything below it (lane 0's path is a prefix of the other lanes')
            assert not re.search(re.escape(lab_dir) + r"(?=[/\s]|$)", handle.read(), re.M)
        assert not os.path.exists(lab_dir)
        ls = subprocess.run(["lxc-ls", "-P", os.path.join(lab_dir, "lxc")], capture_output=True, text=True, check=False)
        assert ls.stdout.strip() == ""
        for user in before["users"]:
            if user != "root":
                with pytest.raises(KeyError):
                    pwd.getpwnam(user)
        assert not os.path.exists(LANE.sudoers)  # /etc/sudoers.d/gpuops-lab in lane 0
        with pytest.raises(OSError):
            socket.create_connection((before["host"], before["port"]), timeout=2).close()
        assert all(os.path.isdir(c) for c in cache), "the rootfs cache stays"

        after_down = json.loads(lab_cli("status", timeout=900).stdout)
        assert after_down["up"] is False
        assert after_down["containers"] == {MAIN_CT: "absent", DECOY_CT: "absent"}
    finally:
        up = lab_cli("up", timeout=900)
    assert up.returncode == 0, up.stderr
    after = json.loads(lab_cli("status", timeout=900).stdout)
    assert after["up"] and after["containers"] == {MAIN_CT: "running", DECOY_CT: "stopped"}
    assert after["trainer"]["running"] and after["trainer"]["behaviour"] == "graceful"
