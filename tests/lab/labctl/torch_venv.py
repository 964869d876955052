# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The PyTorch (CPU) venv of the ``torchrun`` behaviour: built once into the cache, linked into a container.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import sys
import time

from .containers import cache_key, is_unprivileged, rootfs_cache
from .facts import CACHE_DIR, CT_TORCH_VENV, CT_TORCH_WHEELS, LXCPATH, TORCH_VERSION, Deadline, LabError, log
from .host import run, umount_under

VENV_MARKER = ".gpuops-lab-complete"


def torch_venv_cache(timeout: float = 1800) -> str:
    """The PyTorch (CPU) venv for CT200, made with the containers' own python3; built once, cached.

    Built in a throwaway hard-link copy of the rootfs cache (the tree CT200 is copied from: its
    python3, its libc), chrooted in a private mount namespace: no lab, container or lock of the lab is
    involved, so it can be built ahead (`lab torch-venv`) or on first use of the torchrun behaviour. The
    wheels (torch's CPU build from pip's find-links, its dependencies) are fetched on the host by the
    system pip with its own configuration and installed with `--no-index`. Every step is bounded; an
    interrupted build is started again. Keyed by torch version and rootfs.
    """
    cache = os.path.join(CACHE_DIR, "ct-torch-venv-%s-%s" % (TORCH_VERSION, cache_key()))
    if os.path.exists(os.path.join(cache, VENV_MARKER)):
        return cache
    os.makedirs(CACHE_DIR, exist_ok=True)
    fd = os.open(os.path.join(CACHE_DIR, ".ct-torch-venv.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = Deadline(timeout)
        while True:  # one build at a time (bounded)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    raise LabError("another build of %s took more than %ss" % (cache, timeout)) from None
                time.sleep(1)
        if os.path.exists(os.path.join(cache, VENV_MARKER)):
            return cache
        root = cache + ".build"
        if os.path.exists(root):
            shutil.rmtree(root)
        log("building the torch %s venv for the containers (once, a few minutes): %s" % (TORCH_VERSION, cache))
        run(["cp", "-al", rootfs_cache(), root], timeout=300)  # new directories, shared (unmodified) files
        try:
            wheels = os.path.join(root, CT_TORCH_WHEELS.lstrip("/"))
            run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                 "--only-binary=:all:", "--dest", wheels, "torch==" + TORCH_VERSION], timeout=1200)
            if not [name for name in os.listdir(wheels) if name.startswith("torch-%s+cpu-" % TORCH_VERSION)]:
                raise LabError("pip found no CPU build of torch %s (torch-%s+cpu-*.whl in pip's find-links); a "
                               "CUDA build would pull gigabytes of nvidia-* wheels: put the CPU wheel there"
                               % (TORCH_VERSION, TORCH_VERSION))
            env = "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"
            script = " && ".join([
                "mount -t proc proc %s/proc" % shlex.quote(root),
                "mount --rbind /dev %s/dev" % shlex.quote(root),
                "chroot %s %s python3 -m venv %s" % (shlex.quote(root), env, CT_TORCH_VENV),
                "chroot %s %s %s/bin/pip install --quiet --disable-pip-version-check --no-index --find-links %s "
                "torch==%s" % (shlex.quote(root), env, CT_TORCH_VENV, CT_TORCH_WHEELS, TORCH_VERSION),
                "chroot %s %s %s/bin/python -c 'import torch.distributed, torch; assert torch.version.cuda is None'"
                % (shlex.quote(root), env, CT_TORCH_VENV),
            ])
            # the mounts live in this private namespace only and end with it
            run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script], timeout=1500)
            venv = os.path.join(root, CT_TORCH_VENV.lstrip("/"))
            with open(os.path.join(venv, VENV_MARKER), "w", encoding="utf-8") as handle:
                handle.write("torch %s for %s (rootfs %s)\n" % (TORCH_VERSION, CT_TORCH_VENV, cache_key()))
            shutil.rmtree(cache, ignore_errors=True)
            os.rename(venv, cache)
        finally:
            umount_under(root)
            shutil.rmtree(root, ignore_errors=True)
        return cache
    finally:
        os.close(fd)


def ct_torch_venv(vmid: str) -> str:
    """Put the cached torch venv into the container (hard links: a second or so); its path there."""
    dest = os.path.join(LXCPATH, vmid, "rootfs", CT_TORCH_VENV.lstrip("/"))
    if os.path.exists(os.path.join(dest, VENV_MARKER)):
        return CT_TORCH_VENV
    cache = torch_venv_cache()
    if os.path.exists(dest):
        shutil.rmtree(dest)  # an interrupted copy: start again
    # hard links share their owner with the cache: an unprivileged container's shifted ids would reach it
    if is_unprivileged(vmid) or run(["cp", "-al", cache, dest], timeout=300, check=False).returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)  # the cache on another filesystem: a real copy
        run(["cp", "-a", "--reflink=auto", cache, dest], timeout=600)
    return CT_TORCH_VENV
