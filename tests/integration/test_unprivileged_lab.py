# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""CT200 as an unprivileged container, as Proxmox VE makes one (``lab unprivileged on``): its ids 0-65535 are host
100000-165535, ``unprivileged: 1`` is in its config, and ``pct push`` creates files inside its user namespace as
its root (pve-container ``src/PVE/CLI/pct.pm`` push, 771-788).

1. pct's push as the real one does it: the file is the container's root's (host uid 100000), an owner asked by
   name is resolved and mapped inside, and a directory the container's root may not write refuses the file
   (``failed to create file``, exit 0), which ``pct_ssh`` reports as a failed copy;
2. Ansible's copies through ``pct_ssh`` end up owned as the task asked, inside the container;
3. the whole playbook, both halves, against it: the stubborn trainer stopped, the GPUs proved free, SGLang
   served and the pipeline finished; a second run changes nothing.

The unprivileged container has a network namespace of its own (the kernel mounts sysfs in a user namespace only
in a network namespace it owns), so nothing here reaches its services from this machine: every check runs inside.
Its data-half venv is installed while CT200 is still privileged (the lane's first converge) and kept by the
shift: the install's own network access is not what this file proves.
"""

from __future__ import annotations

import os
import secrets
import shlex

import pytest

from tests.support.ct200 import assert_stopped_cleanly, decoy_pids, trainer_pids
from tests.support.datagen import generated_rows, play, prepared_ids, reset_pipeline, wait_pipeline_finished
from tests.support.lab import MAIN_CT, lab_status, lab_switched, trainer
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import run_playbook, task_results
from tests.support.ssh import attach, on_host
from tests.support.stop_training import FAST, REPURPOSE_PLAYBOOK, STUBBORN

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(900)]

HOST_ROOT = 100000  # the container's root on the host (pve-container's default lxc.idmap)
WWW_DATA = 33  # Debian's www-data, in the container


@pytest.fixture(scope="module")
def unprivileged(lab: dict) -> dict:
    """CT200 unprivileged for this file, privileged again after it (``lab unprivileged off`` brings back its
    trainer and decoys, as ``up`` leaves them)."""
    if attach(lab, "test", "-x", "/opt/datagen/venv/bin/python", check=False).returncode != 0:
        play()  # the lane's data half, installed while CT200 can reach the package index
    with lab_switched(["unprivileged", "on"], ["unprivileged", "off"]):
        status = lab_status()
        assert status["unprivileged"] == [MAIN_CT], status["unprivileged"]
        yield status


def host_path(status: dict, ct_path: str) -> str:
    return os.path.join(status["lxcpath"], MAIN_CT, "rootfs", ct_path.lstrip("/"))


def owner(status: dict, ct_path: str) -> tuple[int, int]:
    """(uid, gid) of CT_PATH as the container sees it."""
    uid, gid = attach(status, "stat", "-c", "%u %g", ct_path).stdout.split()
    return int(uid), int(gid)


def test_the_container_is_unprivileged_as_pve_makes_one(unprivileged):
    uid_map = attach(unprivileged, "cat", "/proc/self/uid_map").stdout.split()
    assert uid_map == ["0", str(HOST_ROOT), "65536"], uid_map
    assert os.stat(host_path(unprivileged, "/etc/hostname")).st_uid == HOST_ROOT
    config = on_host(unprivileged, "pct", "config", MAIN_CT).stdout
    assert "unprivileged: 1" in config.splitlines(), config
    assert attach(unprivileged, "systemctl", "is-system-running", check=False).stdout.strip() in ("running",
                                                                                                  "degraded")
    assert trainer_pids(unprivileged), "the lab's trainer runs in the unprivileged CT200"


def test_pct_push_creates_files_as_the_containers_root(unprivileged, tmp_path):
    src = "/tmp/gpuops-unpriv-%s" % secrets.token_hex(4)
    on_host(unprivileged, "sh", "-c", "printf pushed > %s" % src)
    try:
        done = on_host(unprivileged, "pct", "push", MAIN_CT, src, "/root/pushed-plain")
        assert done.stderr == "", done.stderr
        assert owner(unprivileged, "/root/pushed-plain") == (0, 0)
        assert os.stat(host_path(unprivileged, "/root/pushed-plain")).st_uid == HOST_ROOT

        on_host(unprivileged, "pct", "push", MAIN_CT, src, "/root/pushed-owned", "--user", "www-data",
                "--group", "www-data", "--perms", "640")
        assert owner(unprivileged, "/root/pushed-owned") == (WWW_DATA, WWW_DATA)
        st = os.stat(host_path(unprivileged, "/root/pushed-owned"))
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (HOST_ROOT + WWW_DATA, HOST_ROOT + WWW_DATA, 0o640)

        # a directory of the host's root (not mapped: nobody inside, 0755) refuses the container's root
        hostile = host_path(unprivileged, "/srv/host-owned")
        os.makedirs(hostile, mode=0o755, exist_ok=True)
        os.chown(hostile, 0, 0)
        done = on_host(unprivileged, "pct", "push", MAIN_CT, src, "/srv/host-owned/file", check=False)
        assert done.returncode == 0, "pct push exits 0 when the copy fails (no exit-code handler)"
        assert "failed to create file: /srv/host-owned/file: Permission denied" in done.stderr, done.stderr
        assert not os.path.exists(os.path.join(hostile, "file"))
    finally:
        on_host(unprivileged, "rm", "-f", src)
        attach(unprivileged, "rm", "-rf", "/root/pushed-plain", "/root/pushed-owned", "/srv/host-owned")


COPIES = """
- hosts: ct200
  gather_facts: false
  tasks:
    - name: A file for www-data, as the task asks
      ansible.builtin.copy:
        content: "for www-data\\n"
        dest: /srv/unpriv/owned
        owner: www-data
        group: www-data
        mode: "0640"
    - name: A file with the defaults, the container's root's
      ansible.builtin.copy:
        content: "{{ 'x' * 70000 }}"
        dest: /srv/unpriv/plain
        mode: "0600"
    - name: Back to the controller
      ansible.builtin.fetch:
        src: /srv/unpriv/plain
        dest: "{{ fetched }}"
        flat: true
    - name: Into a directory the container's root may not write
      ansible.builtin.copy:
        content: "refused\\n"
        dest: /srv/host-owned/file
      register: refused
      ignore_errors: true
"""


def test_copies_through_pct_ssh_are_owned_as_the_task_asked(unprivileged, tmp_path):
    play_file = tmp_path / "copies.yml"
    play_file.write_text(COPIES, encoding="utf-8")
    attach(unprivileged, "mkdir", "-p", "/srv/unpriv")
    hostile = host_path(unprivileged, "/srv/host-owned")
    os.makedirs(hostile, mode=0o755, exist_ok=True)
    os.chown(hostile, 0, 0)
    try:
        for method in ("sftp", "cat"):
            attach(unprivileged, "rm", "-f", "/srv/unpriv/owned", "/srv/unpriv/plain")
            fetched = tmp_path / ("plain-" + method)
            done = run_playbook(play_file, LAB_INVENTORY, [{"fetched": str(fetched),
                                                            "ansible_pct_ssh_transfer_method": method}],
                                json_results=True, timeout=300)
            assert done.rc == 0, done.stdout[-3000:] + done.stderr[-2000:]
            assert owner(unprivileged, "/srv/unpriv/owned") == (WWW_DATA, WWW_DATA), method
            st = os.stat(host_path(unprivileged, "/srv/unpriv/owned"))
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (HOST_ROOT + WWW_DATA, HOST_ROOT + WWW_DATA, 0o640)
            assert owner(unprivileged, "/srv/unpriv/plain") == (0, 0), method
            assert os.stat(host_path(unprivileged, "/srv/unpriv/plain")).st_uid == HOST_ROOT
            assert fetched.read_text(encoding="utf-8") == "x" * 70000, method
            refused = task_results(done.json)["Into a directory the container's root may not write"]["ct200"]
            assert refused.get("failed"), refused
            assert refused.get("msg") == "Destination /srv/host-owned not writable", refused
            assert not os.path.exists(os.path.join(hostile, "file"))
    finally:
        attach(unprivileged, "rm", "-rf", "/srv/unpriv", "/srv/host-owned")


WHOLE = dict(STUBBORN, repurpose_datagen=True)


def whole_playbook() -> tuple[int, dict, str]:
    done = run_playbook(REPURPOSE_PLAYBOOK, LAB_INVENTORY, [FAST, WHOLE], json_results=True, timeout=800)
    results = {name: hosts["ct200"] for name, hosts in task_results(done.json).items() if "ct200" in hosts}
    return done.rc, results, done.stdout[-3000:] + done.stderr[-3000:]


def summary(results: dict) -> str:
    found = [r for name, r in results.items() if name.split(" : ", 1)[-1].startswith("Report | Summary")]
    assert len(found) == 1, sorted(results)
    return "\n".join(found[0]["msg"])


def test_whole_playbook_against_the_unprivileged_ct200(unprivileged):
    trainer("stubborn")
    assert trainer_pids(unprivileged)
    decoys = decoy_pids(unprivileged)
    reset_pipeline(unprivileged)
    rc, results, tail = whole_playbook()
    assert rc == 0, tail
    assert_stopped_cleanly(unprivileged, summary(results), decoys)

    # the data half: every file it put is the container's, and the pipeline finishes
    for path in ("/opt/datagen/datagen.yml", "/opt/datagen/serve_keyed.py"):
        st = os.stat(host_path(unprivileged, path))
        assert st.st_uid >= HOST_ROOT, (path, st.st_uid)
    wait_pipeline_finished(unprivileged, 300)
    prepared = prepared_ids(unprivileged)
    rows = generated_rows(unprivileged)
    assert prepared and {r["id"] for r in rows} >= prepared, (len(rows), len(prepared))

    rc, results, tail = whole_playbook()
    assert rc == 0, tail
    changed = sorted(name for name, r in results.items() if r.get("changed"))
    assert changed == [], changed
    assert "Stopped: nothing, no process was selected" in summary(results), summary(results)
    assert shlex.split(attach(unprivileged, "cat", "/proc/self/uid_map").stdout)[1] == str(HOST_ROOT)
