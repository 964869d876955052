# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Clean room: the README's first command on a fresh Debian machine with nothing installed.

Starts a new LXC container from the lab's pristine debootstrap cache (minbase
bookworm + the lab's package list, never booted), copies this checkout in
(tracked and untracked-but-not-ignored files, no .venv, no .git), and runs there,
as root, from nothing:

    ./scripts/setup                                   the system packages and the venv
    ./scripts/setup                                   again: must install nothing
    ./scripts/run-lab -e repurpose_datagen=false      setup, lab up (nested LXC 200/201, sshd, pct,
                                                      fake GPUs), the stubborn trainer, the stop half
    tests/lab/lab status                              the lab is up

The clean room has its own PID, mount and network namespaces (loopback only):
its lab uses the README's 127.0.0.1:2222, /var/lib/gpuops-lab and containers
200/201 without ever seeing the host's lab. It runs under its own lxcpath
(/var/lib/gpuops-cleanroom/lxc) and name. With no network, the inputs a network
would give come from caches built here (in /var/cache/gpuops-cleanroom, keyed
by their inputs, reused by the next run): a file apt repository with the .debs
scripts/setup installs (resolved against the rootfs), a wheelhouse of every
requirements file scripts/setup installs (REQUIREMENTS; the clean room's /etc/pip.conf
points pip at it, no index), and the host's debootstrap cache, bind-mounted
read-only where the inner lab looks for it. Not covered: the datagen half (pip installs from PyPI inside
CT200) and ./scripts/test (45 minutes).

PID 1 is a plain process (no systemd), as on this CI machine; cgroups are
mounted for the nested containers (lxc.mount.auto cgroup:rw:force).

A step that dies of SIGKILL, which none of them sends, was killed from outside
(the kernel's OOM killer, or another process on a machine the clean room shares
with the lab's tests): the error says which it looks like (the kernel's OOM kill
count across the step, whether the clean room's init still runs, MemAvailable).
It fails the run like any other failure. (Once, the cause was the lab's `down`:
it ended its mount namespace by the namespace's inode number, which the kernel
had just given to this container; the lab now checks its overlays too:
tests/lab/labctl/supervisor.py.)

    scripts/cleanroom [--keep]      --keep leaves the container for a look (lxc-attach -P ... -n ...)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
CLEAN_DIR = "/var/lib/gpuops-cleanroom"
LXCPATH = os.path.join(CLEAN_DIR, "lxc")
NAME = "cleanroom"
CDIR = os.path.join(LXCPATH, NAME)
ROOTFS = os.path.join(CDIR, "rootfs")
CACHE = os.environ.get("GPUOPS_CLEANROOM_CACHE", "/var/cache/gpuops-cleanroom")
# where the caches appear inside the clean room
IN_APT, IN_WHEELS, IN_REPO = "/srv/cleanroom/apt", "/srv/cleanroom/wheels", "/root/repo"
STEP_TIMEOUT = {"setup": 900, "setup-again": 120, "run-lab": 900, "status": 120}
START = time.monotonic()


class CleanRoomError(Exception):
    pass


class KilledFromOutside(CleanRoomError):
    """A step ended by SIGKILL that its own command did not send (the kernel's OOM killer, or a process
    outside the clean room): the error says what the machine showed, so the log names the culprit's kind."""


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat), None where it is not shown."""
    try:
        with open("/proc/vmstat", encoding="ascii") as handle:
            for line in handle:
                name, _sep, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def mem_available_mib() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def sigkill_context(oom_before: int | None, oom_after: int | None, container_state: str,
                    available_mib: int | None) -> str:
    """What the machine showed when a step died of SIGKILL, so that a failure explains itself."""
    if oom_before is None or oom_after is None:
        oom = "the kernel's OOM kill count is not shown here"
    elif oom_after > oom_before:
        oom = "the kernel's OOM killer ran %d time(s) during the step" % (oom_after - oom_before)
    else:
        oom = "the kernel's OOM killer did not run during the step"
    init = ("the clean room's init still runs, so the step's own process was killed" if container_state == "running"
            else "the clean room's init is gone (state %r), which kills everything in it" % container_state)
    mem = "MemAvailable unknown" if available_mib is None else "MemAvailable %d MiB" % available_mib
    return "%s; %s; %s" % (oom, init, mem)


def log(msg: str) -> None:
    print("cleanroom [%5.1fs]: %s" % (time.monotonic() - START, msg), flush=True)


def run(cmd: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, check=False, **kw)
    except subprocess.TimeoutExpired as exc:
        raise CleanRoomError("timed out after %ss: %s" % (timeout, shlex.join(cmd))) from exc
    if done.returncode != 0:
        raise CleanRoomError("failed (rc %d): %s\n%s%s" % (done.returncode, shlex.join(cmd),
                                                           done.stdout[-3000:], done.stderr[-3000:]))
    return done


def read_bytes(*parts: str) -> bytes:
    with open(os.path.join(*parts), "rb") as handle:
        return handle.read()


def read_text(*parts: str) -> str:
    return read_bytes(*parts).decode("utf-8")


def lab_module():
    """The lab's containers module (tests/lab/labctl/containers.py), for its rootfs cache (one place for the
    debootstrap spec); the lab's package is imported the way tests/lab/lab.py imports it."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "lab"))
    return importlib.import_module("labctl.containers")


def setup_packages() -> list[str]:
    """The apt_packages array of scripts/setup (one list, read from there)."""
    text = read_text(ROOT, "scripts", "setup")
    match = re.search(r"^apt_packages=\((.*?)\)", text, re.S | re.M)
    if not match:
        raise CleanRoomError("scripts/setup has no apt_packages=(...) list")
    return shlex.split(match.group(1), comments=True)


def key_of(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def publish(tmp: str, final: str) -> str:
    """Atomically make a finished cache directory visible."""
    with open(os.path.join(tmp, ".complete"), "w", encoding="utf-8") as handle:
        handle.write("ok\n")
    os.rename(tmp, final)
    return final


def apt_repo(rootfs: str, packages: list[str]) -> str:
    """A file apt repository with what `apt-get install PACKAGES` needs on top of the rootfs."""
    sources = read_text(rootfs, "etc", "apt", "sources.list")
    status = read_bytes(rootfs, "var", "lib", "dpkg", "status")
    final = os.path.join(CACHE, "apt-" + key_of(sources, hashlib.sha256(status).hexdigest(), *sorted(packages)))
    if os.path.exists(os.path.join(final, ".complete")):
        return final
    log("building the apt repository cache %s" % final)
    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("lists/partial", "archives/partial", "etc"):
        os.makedirs(os.path.join(tmp, sub))
    with open(os.path.join(tmp, "etc", "sources.list"), "w", encoding="utf-8") as handle:
        handle.write(sources)
    # the host's apt, resolving against the rootfs's dpkg status and sources
    opts = []
    for key, value in (("Dir::State::status", os.path.join(rootfs, "var/lib/dpkg/status")),
                       ("Dir::State::Lists", os.path.join(tmp, "lists")),
                       ("Dir::Cache::archives", os.path.join(tmp, "archives")),
                       ("Dir::Etc::SourceList", os.path.join(tmp, "etc", "sources.list")),
                       ("Dir::Etc::SourceParts", os.path.join(tmp, "etc", "none")),
                       ("Dir::Cache::pkgcache", ""), ("Dir::Cache::srcpkgcache", "")):
        opts += ["-o", "%s=%s" % (key, value)]
    run(["apt-get", *opts, "update", "-qq"], timeout=600)
    run(["apt-get", *opts, "install", "-y", "-qq", "--download-only", "--no-install-recommends", *packages],
        timeout=900, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    archives = os.path.join(tmp, "archives")
    index = run(["dpkg-scanpackages", "-m", "."], cwd=archives, timeout=300).stdout
    with open(os.path.join(archives, "Packages"), "w", encoding="utf-8") as handle:
        handle.write(index)
    shutil.rmtree(os.path.join(tmp, "lists"))
    return publish(tmp, final)


# The requirements files scripts/setup installs, each into a venv of its own (tests/unit/lab/test_cleanroom.py
# holds this list equal to scripts/setup's).
REQUIREMENTS = ("requirements.txt", "requirements-importer.txt", "requirements-paramiko-oldest.txt")


def wheelhouse() -> str:
    """Wheels of every REQUIREMENTS file (plus pip, setuptools, wheel), built with this checkout's venv."""
    reqs = [read_text(ROOT, name) for name in REQUIREMENTS]
    final = os.path.join(CACHE, "wheels-" + key_of(*reqs, "cp311"))
    if os.path.exists(os.path.join(final, ".complete")):
        return final
    pip = os.path.join(ROOT, ".venv", "bin", "pip")
    if not os.access(pip, os.X_OK):
        raise CleanRoomError("no %s: run ./scripts/setup first (the wheelhouse is built with it)" % pip)
    log("building the wheelhouse cache %s" % final)
    tmp = final + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    # one `pip wheel` per file: their pins conflict (attrs), and each venv resolves only its own file's wheels
    for name in REQUIREMENTS:
        run([pip, "wheel", "-q", "-w", tmp, "-r", os.path.join(ROOT, name), "pip", "setuptools", "wheel"],
            timeout=1800)
    return publish(tmp, final)


def prune(keep: list[str]) -> None:
    """Remove cache directories of older inputs (an earlier requirements.txt or package list)."""
    for name in os.listdir(CACHE):
        path = os.path.join(CACHE, name)
        if name.startswith(("apt-", "wheels-")) and path not in keep and os.path.isdir(path):
            log("removing the stale cache %s" % path)
            shutil.rmtree(path)


def lxc(tool: str, *args: str) -> list[str]:
    return [tool, "-P", LXCPATH, "-n", NAME, *args]


def state() -> str:
    if not os.path.isfile(os.path.join(CDIR, "config")):
        return "absent"
    return subprocess.run(lxc("lxc-info", "-s", "-H"), capture_output=True, text=True, timeout=30,
                          check=False).stdout.strip().lower()


def destroy() -> None:
    """Stop and remove the clean room (only ours: our lxcpath, our name)."""
    if state() not in ("absent", "stopped", ""):
        subprocess.run(lxc("lxc-stop", "-k"), capture_output=True, timeout=60, check=False)
        subprocess.run(lxc("lxc-wait", "-s", "STOPPED", "-t", "30"), capture_output=True, timeout=60, check=False)
    if state() not in ("absent", "stopped", ""):
        raise CleanRoomError("the clean room container did not stop; not removing %s" % CDIR)
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mounted = [line.split()[4] for line in handle if line.split()[4].startswith(CDIR + "/")]
    if mounted:
        raise CleanRoomError("mounts left under %s, not removing it: %s" % (CDIR, mounted[:5]))
    if os.path.exists(CDIR):
        shutil.rmtree(CDIR)


def copy_checkout(dest: str) -> None:
    """Tracked and untracked-but-not-ignored files of this checkout (what a clone holds)."""
    files = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).stdout
    present = "\0".join(f for f in files.split("\0") if f and os.path.lexists(os.path.join(ROOT, f)))
    os.makedirs(dest)
    run(["rsync", "-a", "--from0", "--files-from=-", "./", dest + "/"], cwd=ROOT, input=present + "\0")


def create(rootfs_cache: str, apt: str, wheels: str) -> None:
    os.makedirs(CDIR)
    log("copying the pristine rootfs %s" % os.path.basename(rootfs_cache))
    run(["cp", "-a", rootfs_cache, ROOTFS], timeout=300)
    os.unlink(os.path.join(ROOTFS, ".gpuops-lab-complete"))
    # the machine's package sources: the caches above, in place of the network
    with open(os.path.join(ROOTFS, "etc", "apt", "sources.list"), "w", encoding="utf-8") as handle:
        handle.write("deb [trusted=yes] file:%s ./\n" % IN_APT)
    with open(os.path.join(ROOTFS, "etc", "pip.conf"), "w", encoding="utf-8") as handle:
        handle.write("[global]\nno-index = true\nfind-links = %s\n" % IN_WHEELS)
    copy_checkout(ROOTFS + IN_REPO)
    lab_cache = os.path.dirname(rootfs_cache)
    binds = [(os.path.join(apt, "archives"), IN_APT), (wheels, IN_WHEELS), (lab_cache, lab_cache)]
    lines = [
        "# gpuops clean room, written by scripts/cleanroom (removed on every run)",
        "lxc.uts.name = %s" % NAME,
        "lxc.rootfs.path = dir:%s" % ROOTFS,
        "lxc.net.0.type = empty",  # its own network namespace: loopback only
        "lxc.apparmor.profile = unconfined",
        "lxc.include = /usr/share/lxc/config/common.conf",
        # privileged and keeping CAP_SYS_ADMIN, so LXC would leave cgroups unmounted: force them
        # (the nested lab's containers need them)
        "lxc.mount.auto = proc:rw sys:rw cgroup:rw:force",
        "lxc.init.cmd = /bin/sleep infinity",
        # what init mounts on any machine: /run and /dev/shm (ansible's multiprocessing needs it)
        "lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755,create=dir 0 0",
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
        "lxc.log.file = %s" % os.path.join(CDIR, "lxc.log"),
        "lxc.log.level = WARN",
    ]
    for src, dst in binds:
        lines.append("lxc.mount.entry = %s %s none bind,ro,create=dir 0 0" % (src, dst.lstrip("/")))
    with open(os.path.join(CDIR, "config"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def start() -> None:
    run(lxc("lxc-start", "-d"), timeout=60)
    run(lxc("lxc-wait", "-s", "RUNNING", "-t", "30"), timeout=60)
    pid = run(lxc("lxc-info", "-p", "-H"), timeout=30).stdout.strip()
    # a machine's loopback is up before anyone logs in (no init here does it)
    run(["nsenter", "--net=/proc/%s/ns/net" % pid, "ip", "link", "set", "lo", "up"], timeout=30)


def inside(step: str, command: str) -> str:
    """Run a shell command as root in the checkout inside the clean room; stream and return its output."""
    log("%s: %s" % (step, command))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "TERM": "dumb", "USER": "root"}
    cmd = lxc("lxc-attach", "--clear-env")
    for key, value in env.items():
        cmd += ["--set-var", "%s=%s" % (key, value)]
    cmd += ["--", "bash", "-c", "cd %s && %s" % (IN_REPO, command)]
    oom_before = oom_kills()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    out = []
    deadline = time.monotonic() + STEP_TIMEOUT[step]
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        print("  | " + line, end="", flush=True)
        if time.monotonic() > deadline:
            proc.kill()
            break
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait(timeout=30)
    if time.monotonic() > deadline:
        raise CleanRoomError("%s: timed out after %ss" % (step, STEP_TIMEOUT[step]))
    if rc in (128 + 9, -9):  # the step (or the clean room's init) died of SIGKILL, which no step sends
        raise KilledFromOutside("%s was killed by SIGKILL (rc %d): %s (%s)" % (
            step, rc, command, sigkill_context(oom_before, oom_kills(), state(), mem_available_mib())))
    if rc != 0:
        raise CleanRoomError("%s failed (rc %d): %s" % (step, rc, command))
    return "".join(out)


def check(step: str, ok: bool, what: str) -> None:
    if not ok:
        raise CleanRoomError("%s: %s" % (step, what))
    log("%s: ok, %s" % (step, what))


def attempt(rootfs_cache: str, apt: str, wheels: str, keep: bool) -> None:
    """One clean room from nothing: a new container, the README's first command, its checks."""
    destroy()
    create(rootfs_cache, apt, wheels)
    start()
    try:
        out = inside("setup", "./scripts/setup")
        check("setup", "installing system packages" in out and "installing Python requirements" in out,
              "installed the system packages and the venv from nothing")
        out = inside("setup-again", "./scripts/setup")
        check("setup-again", "installing" not in out, "a second run installed nothing")
        out = inside("run-lab", "./scripts/run-lab -e repurpose_datagen=false")
        check("run-lab", "training stopped, GPUs free" in out and "Stopped:" in out,
              "the playbook stopped the stubborn trainer and proved the GPUs free")
        out = inside("status", "tests/lab/lab status")
        status = json.loads(out[out.index("{"):])
        check("status", status.get("up") is True, "the lab is up")
    finally:
        if not keep:
            destroy()
        else:
            log("kept: lxc-attach -P %s -n %s" % (LXCPATH, NAME))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--keep", action="store_true", help="leave the clean room container after the run")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("cleanroom: error: run as root (it starts an LXC container)", file=sys.stderr)
        return 2
    try:
        rootfs_cache = lab_module().rootfs_cache()
        packages = setup_packages()
        apt = apt_repo(rootfs_cache, packages)
        wheels = wheelhouse()
        prune([apt, wheels])
        attempt(rootfs_cache, apt, wheels, args.keep)
    except CleanRoomError as exc:
        log("error: %s" % exc)
        return 1
    log("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
