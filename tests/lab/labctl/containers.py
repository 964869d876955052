# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab's LXC containers: the rootfs cache, their LXC and Proxmox VE configs, their files, unprivileged
containers as Proxmox VE makes them, a killed container's cgroups, boot.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
import uuid

from .facts import (
    CACHE_DIR,
    CT_ENV,
    CT_FAKEGPU_DIR,
    CT_LAB,
    CT_TORCH_VENV,
    FAKEGPU_DIR,
    GPU_COUNT,
    GPU_CTS,
    HERE,
    LXCPATH,
    MIRROR,
    NODES,
    PACKAGES,
    SUITE,
    TRAINER_CKPT,
    VARIANT,
    Deadline,
    LabError,
    LabNode,
    log,
)
from .host import atomic_write, run, umount_under, write_if_changed


def cache_key() -> str:
    spec = {"suite": SUITE, "variant": VARIANT, "mirror": MIRROR, "packages": sorted(PACKAGES), "v": 1}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_cache() -> str:
    """The pristine debootstrap tree for this package list, built once (never booted)."""
    path = os.path.join(CACHE_DIR, "rootfs-%s-%s" % (SUITE, cache_key()))
    if os.path.exists(os.path.join(path, ".gpuops-lab-complete")):
        return path
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp = path + ".partial"
    if os.path.exists(tmp):
        umount_under(tmp)
        shutil.rmtree(tmp)
    log("building the rootfs cache with debootstrap (about a minute): %s" % path)
    try:
        run(["debootstrap", "--variant=" + VARIANT, "--include=" + ",".join(PACKAGES), SUITE, tmp, MIRROR],
            timeout=1500)
    except LabError:
        umount_under(tmp)
        raise
    umount_under(tmp)
    with open(os.path.join(tmp, ".gpuops-lab-complete"), "w", encoding="utf-8") as handle:
        json.dump({"suite": SUITE, "variant": VARIANT, "mirror": MIRROR, "packages": sorted(PACKAGES)}, handle)
    os.rename(tmp, path)
    return path


def lxc(tool: str, vmid: str, *args: str) -> list[str]:
    return [tool, "-P", LXCPATH, "-n", vmid, *args]


def ct_state(vmid: str) -> str:
    if not os.path.isfile(os.path.join(LXCPATH, vmid, "config")):
        return "absent"
    res = run(lxc("lxc-info", vmid, "-s", "-H"), timeout=20, check=False)
    state = res.stdout.decode().strip().lower()
    return state if state in ("running", "stopped") else (state or "unknown")


def ct_init_pid(vmid: str) -> int | None:
    res = run(lxc("lxc-info", vmid, "-p", "-H"), timeout=20, check=False)
    try:
        return int(res.stdout.decode().strip())
    except ValueError:
        return None


def ct_exec(vmid: str, argv: list[str], timeout: float = 60, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = lxc("lxc-attach", vmid, "--clear-env")
    for key, value in dict(CT_ENV, **(env or {})).items():
        cmd += ["--set-var", "%s=%s" % (key, value)]
    return run(cmd + ["--", *argv], timeout=timeout, check=check)


def lxc_config(vmid: str, hostname: str, fakegpu_dir: str = FAKEGPU_DIR, unprivileged: bool = False) -> str:
    cdir = os.path.join(LXCPATH, vmid)
    lines = [
        "# gpuops lab container %s, written by tests/lab/lab (rewritten on every up)" % vmid,
        "lxc.uts.name = %s" % hostname,
        "lxc.rootfs.path = dir:%s" % os.path.join(cdir, "rootfs"),
        # share the host's network: loopback to the lab's services, pip/apt inside. An unprivileged container
        # gets a network namespace of its own with only its loopback: the kernel lets a user namespace mount
        # sysfs (which systemd needs) only in a network namespace it owns.
        "lxc.net.0.type = %s" % ("empty" if unprivileged else "none"),
        "lxc.apparmor.profile = unconfined",
        "lxc.include = /usr/share/lxc/config/common.conf",
    ]
    if unprivileged:  # as pve-container's LXC.pm update_lxc_config writes an unprivileged CT's config
        lines += ["lxc.include = /usr/share/lxc/config/userns.conf",
                  "lxc.idmap = u 0 %d %d" % (ID_SHIFT, ID_RANGE), "lxc.idmap = g 0 %d %d" % (ID_SHIFT, ID_RANGE)]
    lines += [
        "lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed",
        # Proxmox VE's cgroup layout (pve-container LXC.pm update_lxc_config): the container in lxc/VMID, its
        # processes in the inner cgroup lxc/VMID/ns, the monitor in lxc.monitor/VMID; what the collection reads
        # to see a frozen container
        "lxc.cgroup.dir.monitor = lxc.monitor/%s" % vmid,
        "lxc.cgroup.dir.container = lxc/%s" % vmid,
        "lxc.cgroup.dir.container.inner = ns",
        "lxc.init.cmd = /lib/systemd/systemd",
        "lxc.log.file = %s" % os.path.join(cdir, "lxc.log"),
        "lxc.log.level = WARN",
        "lxc.mount.entry = %s %s none bind,create=dir 0 0" % (fakegpu_dir, CT_FAKEGPU_DIR.lstrip("/")),
    ]
    for name in ["nvidia%d" % i for i in range(GPU_COUNT)] + ["nvidiactl"]:
        lines.append("lxc.mount.entry = %s dev/%s none bind,create=file 0 0" % (
            os.path.join(fakegpu_dir, "dev", name), name))
    return "\n".join(lines) + "\n"


def pve_config(vmid: str, hostname: str, unprivileged: bool = False) -> str:
    """What /etc/pve/nodes/<node>/lxc/<vmid>.conf of a GPU node looks like (read by tests/lab/pct)."""
    big = vmid in GPU_CTS
    lines = [
        "arch: amd64",
        "cores: %d" % (32 if big else 4),
        "features: nesting=1",
        "hostname: %s" % hostname,
        "memory: %d" % (262144 if big else 8192),
        "net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:00:%02X:%02X,ip=dhcp,type=veth" % (
            int(vmid) // 256, int(vmid) % 256),
        "onboot: 1",
        "ostype: debian",
        "rootfs: local-lvm:vm-%s-disk-0,size=%s" % (vmid, "500G" if big else "32G"),
        "swap: 0",
    ]
    if unprivileged:
        lines.append("unprivileged: 1")
    if big:
        lines.append("lxc.cgroup2.devices.allow: c 195:* rwm")
        lines.append("lxc.cgroup2.devices.allow: c 508:* rwm")
        for name in ["nvidia%d" % i for i in range(GPU_COUNT)] + ["nvidiactl", "nvidia-uvm"]:
            lines.append("lxc.mount.entry: /dev/%s dev/%s none bind,optional,create=file" % (name, name))
    return "\n".join(lines) + "\n"


def customize_rootfs(rootfs: str, hostname: str) -> None:
    """Per-container files; idempotent, safe while the container runs."""
    write_if_changed(os.path.join(rootfs, "etc/hostname"), hostname + "\n")
    write_if_changed(os.path.join(rootfs, "etc/hosts"),
                     "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" % hostname)
    mid = os.path.join(rootfs, "etc/machine-id")
    try:
        with open(mid, encoding="ascii") as handle:
            has_id = len(handle.read().strip()) == 32
    except OSError:
        has_id = False
    if not has_id:
        atomic_write(mid, uuid.uuid4().hex + "\n", 0o444)
    # the networkd-dispatcher decoy, as a real systemd service
    decoys = os.path.join(HERE, "decoys")
    with open(os.path.join(decoys, "networkd-dispatcher.py"), encoding="utf-8") as handle:
        # the shebang makes ps show '/usr/bin/python3 /usr/bin/networkd-dispatcher ...', as on Debian
        write_if_changed(os.path.join(rootfs, "usr/bin/networkd-dispatcher"),
                         "#!/usr/bin/python3\n" + handle.read(), 0o755)
    unit = os.path.join(rootfs, "etc/systemd/system/networkd-dispatcher.service")
    shutil.copyfile(os.path.join(decoys, "networkd-dispatcher.service"), unit)
    write_if_changed(os.path.join(rootfs, "etc/default/networkd-dispatcher"),
                     'networkd_dispatcher_args="--run-startup-triggers"\n')
    wants = os.path.join(rootfs, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    link = os.path.join(wants, "networkd-dispatcher.service")
    if not os.path.islink(link):
        os.symlink("/etc/systemd/system/networkd-dispatcher.service", link)
    # the fake driver's tools where the real ones live
    smi = os.path.join(rootfs, "usr/bin/nvidia-smi")
    if not os.path.islink(smi):
        if os.path.exists(smi):
            os.unlink(smi)
        os.symlink(CT_LAB + "/fakegpu/nvidia-smi", smi)
    os.makedirs(os.path.join(rootfs, CT_FAKEGPU_DIR.lstrip("/")), exist_ok=True)
    os.makedirs(os.path.join(rootfs, TRAINER_CKPT.lstrip("/")), exist_ok=True)
    sync_lab_files(rootfs)


def _tree_files(top: str) -> dict[str, str]:
    """Relative path -> absolute path of the regular files to copy (no caches, no tests)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "tests")]
        for name in filenames:
            if name.endswith(".pyc") or name.startswith("test_"):
                continue
            path = os.path.join(dirpath, name)
            if os.path.isfile(path):
                out[os.path.relpath(path, top)] = path
    return out


def sync_lab_files(rootfs: str) -> None:
    """Mirror tests/lab/trainer, tests/lab/fakegpu and tests/lab/torchrun_job into /opt/lab/ in the container.

    File by file with an atomic rename, and only what changed: tools in the
    container (nvidia-smi every few seconds) never see a missing file.
    """
    for name in ("trainer", "fakegpu", "torchrun_job"):
        src_top = os.path.join(HERE, name)
        if not os.path.isdir(src_top):
            continue
        dest_top = os.path.join(rootfs, CT_LAB.lstrip("/"), name)
        want = _tree_files(src_top)
        for rel, src in want.items():
            dest = os.path.join(dest_top, rel)
            with open(src, "rb") as handle:
                data = handle.read()
            mode = os.stat(src).st_mode & 0o777
            try:
                with open(dest, "rb") as handle:
                    if handle.read() == data and (os.stat(dest).st_mode & 0o777) == mode:
                        continue
            except OSError:
                pass
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = "%s.lab-%d" % (dest, os.getpid())
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        if os.path.isdir(dest_top):
            for rel in set(_tree_files(dest_top)) - set(want):
                os.unlink(os.path.join(dest_top, rel))


def ensure_container(vmid: str, hostname: str, cache: str, node: LabNode = NODES[1], unprivileged: bool = False) -> None:
    """Container VMID created from CACHE if it is not, privileged (as `up` leaves every container) or
    UNPRIVILEGED, its files and configs as the lab writes them."""
    cdir = os.path.join(LXCPATH, vmid)
    rootfs = os.path.join(cdir, "rootfs")
    done = os.path.join(cdir, ".created")
    if not os.path.exists(done):
        if os.path.exists(cdir):
            if ct_state(vmid) == "running":
                raise LabError("container %s is half-created but running; run 'lab down' first" % vmid)
            umount_under(cdir)
            shutil.rmtree(cdir)
        os.makedirs(cdir, mode=0o755)
        log("creating container %s (%s) from %s" % (vmid, hostname, os.path.basename(cache)))
        run(["cp", "-a", "--reflink=auto", cache, rootfs], timeout=600)
        os.unlink(os.path.join(rootfs, ".gpuops-lab-complete"))
        customize_rootfs(rootfs, hostname)
        with open(done, "w", encoding="utf-8") as handle:
            handle.write(os.path.basename(cache) + "\n")
    else:
        customize_rootfs(rootfs, hostname)
    convert_container(vmid, unprivileged)
    match_ids(vmid)  # what customize_rootfs wrote, as the container's root
    write_if_changed(os.path.join(cdir, "config"), lxc_config(vmid, hostname, node.fakegpu_dir, unprivileged))
    if ct_state(vmid) == "stopped":
        clear_stale_cgroups(vmid)
    os.makedirs(node.pve_conf_dir, mode=0o755, exist_ok=True)
    write_if_changed(os.path.join(node.pve_conf_dir, "%s.conf" % vmid), pve_config(vmid, hostname, unprivileged))


# An unprivileged CT as Proxmox VE makes one: its root is host uid/gid 100000, its ids 0-65535 mapped to
# 100000-165535 (pve-container LXC.pm's default lxc.idmap), its rootfs owned accordingly. `lab unprivileged on`
# turns a lab container into one (the rootfs shifted in place, the mark file records it); `off` and `up` turn
# it back. Shifting only ids in the range that is not yet shifted makes it idempotent: files the lab writes
# from the host later (lab files, checkpoints dirs) are shifted by calling it again.
ID_SHIFT = 100000
ID_RANGE = 65536
UNPRIVILEGED_MARK = ".unprivileged"


def is_unprivileged(vmid: str) -> bool:
    return os.path.exists(os.path.join(LXCPATH, vmid, UNPRIVILEGED_MARK))


def shift_ids(root: str, delta: int) -> int:
    """Every file under ROOT owned in the unshifted range moved by DELTA (+ID_SHIFT into the container's
    user namespace, -ID_SHIFT back); how many changed. Set-id bits, which chown clears, are put back."""
    low = 0 if delta > 0 else ID_SHIFT
    changed = 0

    def moved(value: int) -> int:
        return value + delta if low <= value < low + ID_RANGE else value

    for top, dirs, files in os.walk(root):
        for path in [top] + [os.path.join(top, name) for name in dirs + files]:
            st = os.lstat(path)
            uid, gid = moved(st.st_uid), moved(st.st_gid)
            if (uid, gid) == (st.st_uid, st.st_gid):
                continue
            os.lchown(path, uid, gid)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))
            changed += 1
    return changed


def match_ids(vmid: str) -> None:
    """An unprivileged container's files the lab wrote from the host, owned by the container's ids."""
    if is_unprivileged(vmid):
        shift_ids(os.path.join(LXCPATH, vmid, "rootfs"), ID_SHIFT)


def convert_container(vmid: str, unprivileged: bool) -> None:
    """Container VMID made UNPRIVILEGED or not: stopped (the lab's own lxc-stop, not pct: no lock or HA applies)
    and its rootfs shifted. The mark exists from before the shift in until after the shift back, so an
    interrupted conversion either way is finished by the next `up` (which converts back) or `on`."""
    if is_unprivileged(vmid) == unprivileged:
        return
    if ct_state(vmid) == "running":
        run(lxc("lxc-stop", vmid, "--timeout", "30"), timeout=90)
    mark = os.path.join(LXCPATH, vmid, UNPRIVILEGED_MARK)
    rootfs = os.path.join(LXCPATH, vmid, "rootfs")
    if unprivileged:
        # the torch venv is hard links into the cache (ct_torch_venv): dropped, copied again when a test needs it
        shutil.rmtree(os.path.join(rootfs, CT_TORCH_VENV.lstrip("/")), ignore_errors=True)
        with open(mark, "w", encoding="ascii") as handle:
            handle.write("u 0 %d %d\n" % (ID_SHIFT, ID_RANGE))
        shift_ids(rootfs, ID_SHIFT)
    else:
        shift_ids(rootfs, -ID_SHIFT)
        os.unlink(mark)
    log("CT%s is now %sprivileged" % (vmid, "un" if unprivileged else ""))


def clear_stale_cgroups(vmid: str, root: str = "/sys/fs/cgroup") -> None:
    """Remove the empty cgroups a stopped CT left behind, so that its next start can create them.

    The PVE layout names the cgroups without LXC's '-N' fallback (lxc.cgroup.dir.*), so a CT
    whose monitor was killed (a machine's processes killed between two CI runs) leaves
    lxc/VMID and lxc.monitor/VMID behind, and lxc-start fails with "Failed to create monitor
    cgroup". Only empty directories go: a cgroup that still holds a process is left, and named.
    """
    held = []
    for controller in sorted(os.listdir(root)):
        for rel in ("lxc.monitor/%s" % vmid, "lxc/%s" % vmid):
            top = os.path.join(root, controller, rel)
            if not os.path.isdir(top):
                continue
            for path, _dirs, _files in os.walk(top, topdown=False):  # children before their parent
                try:
                    os.rmdir(path)
                except OSError:
                    held.append(path)
    if held:
        log("CT%s is stopped but %d of its cgroups still hold processes, e.g. %s" % (vmid, len(held), held[0]))


def wait_booted(vmid: str, timeout: float = 120) -> str:
    deadline = Deadline(timeout)
    last = ""
    while not deadline.expired():
        res = ct_exec(vmid, ["systemctl", "is-system-running"], timeout=20, check=False)
        last = (res.stdout.decode().strip() or res.stderr.decode().strip())
        if last in ("running", "degraded"):
            return last
        time.sleep(0.3)
    raise LabError("container %s did not finish booting within %ss (systemctl is-system-running: %s)" % (
        vmid, timeout, last))
