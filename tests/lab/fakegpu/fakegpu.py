# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fake NVIDIA GPUs for the gpuops.repurpose lab (standard library only).

One state directory (env ``FAKEGPU_DIR``, default ``/var/lib/gpuops-lab/fakegpu``)
is shared by the host and, through a bind mount, by the containers::

    config.json        count, names, UUIDs, bus ids, release delay, modes
    dev/nvidia0..N-1   the "device files" (regular files; the lab binds them
    dev/nvidiactl      to /dev/nvidiaN in the containers)
    holders/           one registration file per allocation
    events.jsonl       hold / death records (tests and the benchmark read it)
    driver.pid         the optional driver daemon

How an allocation lives and dies, kernel-style rather than by polling PIDs
(PIDs mean nothing across the container's PID namespace):

* ``hold(index, mib)`` opens the device file and a registration file and takes
  an exclusive ``flock`` on the latter. Both fds stay open for the life of the
  process (and of any child forked from it, as with a real CUDA context).
* The allocation is alive while that lock is held. ``flock`` state lives in
  the kernel and is shared through the bind mount, so the host and every
  container judge liveness identically.
* The death time is recorded once (``holders/<id>.dead``, created with
  ``O_EXCL``). The ``driver`` daemon blocks in ``flock`` on every registration
  and so records the exact moment the last fd closed; without the daemon, the
  first reader that finds the lock free records "now" (lazy, late by however
  long nobody looked). The lab runs the daemon; the lazy path keeps the fake
  usable anywhere, e.g. inside a container without the daemon.
* Memory stays counted until ``death + release_delay`` (the driver tearing the
  context down), forever in never-release mode.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
import uuid

DEFAULT_DIR = "/var/lib/gpuops-lab/fakegpu"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
MEMORY_TOTAL_MIB = 97887
BASELINE_MIB = 4
# Bus ids of an 8-GPU workstation board layout.
_BUSES = (0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1)
MODES = ("ok", "no_devices", "no_driver", "no_nvml", "gpu_lost", "garbled", "empty", "na", "not_supported", "hang")

_HELD: list[Holding] = []  # keeps every holding's fds open for the process lifetime


def state_dir() -> str:
    return os.environ.get("FAKEGPU_DIR") or DEFAULT_DIR


def gpu_uuid(index: int) -> str:
    """Stable across re-inits: derived from the index only."""
    return "GPU-%s" % uuid.uuid5(uuid.NAMESPACE_URL, "gpuops-lab/fakegpu/%d" % index)


def bus_id(index: int) -> str:
    bus = _BUSES[index] if index < len(_BUSES) else 0x01 + index
    return "00000000:%02X:00.0" % bus


def own_pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def load_config(sdir: str | None = None) -> dict:
    sdir = sdir or state_dir()
    with open(os.path.join(sdir, "config.json")) as handle:
        return json.load(handle)


def set_config(sdir: str | None = None, **changes) -> dict:
    """Change config keys (release_delay, never_release, mode, lost_gpus, hang_seconds, baseline_mib,
    driver_version, cuda_version)."""
    sdir = sdir or state_dir()
    cfg = load_config(sdir)
    for key, value in changes.items():
        if key == "mode" and value not in MODES:
            raise ValueError("mode must be one of %s" % ", ".join(MODES))
        cfg[key] = value
    _atomic_write(os.path.join(sdir, "config.json"), json.dumps(cfg, indent=1) + "\n")
    return cfg


def ensure_devices(sdir: str, count: int) -> None:
    """``dev/nvidia0..N-1`` and ``dev/nvidiactl``, world-usable; existing files keep their inodes (bind mounts)."""
    os.makedirs(os.path.join(sdir, "dev"), exist_ok=True)
    for name in ["nvidia%d" % i for i in range(count)] + ["nvidiactl"]:
        path = os.path.join(sdir, "dev", name)
        if not os.path.exists(path):
            with open(path, "w"):
                pass
        os.chmod(path, 0o666)


def init(sdir: str | None = None, count: int = 8, release_delay: float = 2.0, never_release: bool = False,
         baseline_mib: int = BASELINE_MIB, mode: str = "ok") -> dict:
    """Create or refresh the state dir. Idempotent; device files keep their inodes (bind mounts point at them)."""
    sdir = sdir or state_dir()
    for sub in ("", "holders"):
        os.makedirs(os.path.join(sdir, sub), exist_ok=True)
    # Containers (whatever their root mapping) register holders here.
    os.chmod(os.path.join(sdir, "holders"), 0o1777)
    ensure_devices(sdir, count)
    events = os.path.join(sdir, "events.jsonl")
    if not os.path.exists(events):
        with open(events, "w"):
            pass
    os.chmod(events, 0o666)
    cfg = {
        "count": count,
        "name": GPU_NAME,
        "memory_total_mib": MEMORY_TOTAL_MIB,
        "baseline_mib": baseline_mib,
        "release_delay": float(release_delay),
        "never_release": bool(never_release),
        "mode": mode,
        "lost_gpus": [],
        "hang_seconds": 0,
        "driver_version": "580.95.05",
        "cuda_version": "13.0",
        # Where process lists are visible: NVML under LXC shows none.
        "host_pidns": own_pidns(),
        "gpus": [{"index": i, "uuid": gpu_uuid(i), "bus_id": bus_id(i)} for i in range(count)],
    }
    if mode not in MODES:
        raise ValueError("mode must be one of %s" % ", ".join(MODES))
    _atomic_write(os.path.join(sdir, "config.json"), json.dumps(cfg, indent=1) + "\n")
    return cfg


def _event(sdir: str, **record) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(os.path.join(sdir, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError:
        return
    try:
        os.write(fd, line)  # one O_APPEND write per record: lines never interleave
    finally:
        os.close(fd)


def read_events(sdir: str | None = None) -> list[dict]:
    sdir = sdir or state_dir()
    out = []
    try:
        with open(os.path.join(sdir, "events.jsonl")) as handle:
            for line in handle:
                if line.strip():
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def device_path(index: int | str, sdir: str | None = None) -> str:
    """Where this process should open GPU ``index``: ``/dev/nvidiaN`` when it is
    the lab's bind mount of the state-dir file, else the state-dir file itself."""
    sdir = sdir or state_dir()
    name = "nvidia%s" % index
    own = os.path.join(sdir, "dev", name)
    dev = "/dev/" + name
    try:
        a, b = os.stat(own), os.stat(dev)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return dev
    except OSError:
        pass
    return own


class Holding:
    """One allocation: GPU ``index`` with ``mib`` MiB, alive while this object's fds are open."""

    def __init__(self, index: int, mib: int, sdir: str | None = None) -> None:
        self.sdir = sdir or state_dir()
        cfg = load_config(self.sdir)
        if not 0 <= index < cfg["count"]:
            raise ValueError("no fake GPU %d (count %d)" % (index, cfg["count"]))
        self.index, self.mib = index, int(mib)
        self.device = device_path(index, self.sdir)
        self.device_fd = os.open(self.device, os.O_RDWR)
        ctl = device_path("ctl", self.sdir)
        self.ctl_fd = os.open(ctl, os.O_RDWR) if os.path.exists(ctl) else None
        self.id = "%d-%d-%s" % (index, os.getpid(), uuid.uuid4().hex[:8])
        holders = os.path.join(self.sdir, "holders")
        tmp = os.path.join(holders, ".tmp-" + self.id)
        self.path = os.path.join(holders, self.id + ".json")
        self.lock_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        # Lock before the file gets its public name: a watcher can never see an unlocked live holder.
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        argv0 = _argv0()
        record = {"gpu": index, "mib": self.mib, "pid": os.getpid(), "pidns": own_pidns(),
                  "process_name": argv0, "t_hold": time.time(), "device": self.device}
        os.write(self.lock_fd, json.dumps(record).encode())
        os.fchmod(self.lock_fd, 0o666)
        os.rename(tmp, self.path)
        _event(self.sdir, event="hold", t=record["t_hold"], gpu=index, mib=self.mib, pid=os.getpid(), id=self.id)

    def release(self) -> None:
        """Free the allocation as a process exit would (the release delay still applies)."""
        for fd in (self.lock_fd, self.device_fd, self.ctl_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.lock_fd = self.device_fd = self.ctl_fd = None


def _argv0() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return handle.read().split(b"\0")[0].decode(errors="replace") or "python3"
    except OSError:
        return "python3"


def hold(index: int, mib: int, sdir: str | None = None) -> Holding:
    """Hold fake GPU ``index`` with ``mib`` MiB until this process (and its forked children) exit."""
    holding = Holding(index, mib, sdir)
    _HELD.append(holding)
    return holding


# ---- the "driver": which allocations still count ---------------------------------------------

def _lock_free(path: str) -> bool | None:
    """True when nobody holds the registration's lock (holder dead), None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)  # also drops the lock if we got it
    return True


def _record_death(sdir: str, reg_path: str, rec: dict, t_death: float, by: str, delay: float) -> float:
    """Write ``<id>.dead`` once (first writer wins) and return the recorded death time."""
    dead = reg_path[:-len(".json")] + ".dead"
    try:
        fd = os.open(dead, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return _read_death(dead, t_death)
    try:
        os.write(fd, ("%.6f\n" % t_death).encode())
    finally:
        os.close(fd)
    _event(sdir, event="death", t=t_death, release_at=t_death + delay, gpu=rec.get("gpu"), mib=rec.get("mib"),
           pid=rec.get("pid"), id=os.path.basename(reg_path)[:-5], recorded_by=by)
    return t_death


def _read_death(dead: str, default: float | None = None) -> float | None:
    for _attempt in range(20):  # the writer may be between O_EXCL create and write
        try:
            with open(dead) as handle:
                text = handle.read().strip()
        except FileNotFoundError:
            return default
        if text:
            return float(text)
        time.sleep(0.005)
    return default


def allocations(sdir: str | None = None, now: float | None = None, collect: bool = True) -> list[dict]:
    """Every allocation that still counts, each with ``state`` alive or releasing."""
    sdir = sdir or state_dir()
    cfg = load_config(sdir)
    delay = float(cfg.get("release_delay", 0))
    keep = bool(cfg.get("never_release"))
    hdir = os.path.join(sdir, "holders")
    out = []
    for name in sorted(os.listdir(hdir)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(hdir, name)
        try:
            with open(path) as handle:
                rec = json.load(handle)
        except (FileNotFoundError, ValueError):
            continue
        dead_path = path[:-5] + ".dead"
        t_death = _read_death(dead_path)
        if t_death is None:
            free = _lock_free(path)
            if free is None:
                continue
            if free:
                t_death = _record_death(sdir, path, rec, time.time(), "reader", delay)
        t = time.time() if now is None else now
        if t_death is None:
            rec["state"] = "alive"
        elif keep or t < t_death + delay:
            rec["state"] = "releasing"
            rec["t_death"] = t_death
        else:
            if collect:
                for p in (path, dead_path):
                    try:
                        os.unlink(p)
                    except (FileNotFoundError, PermissionError):
                        # PermissionError: holders/ is sticky, and an unprivileged container's root may not
                        # remove a record another owner wrote (a host process's, or one from before the
                        # container was made unprivileged); a reader with the right collects it later
                        pass
            continue
        rec["id"] = name[:-5]
        out.append(rec)
    return out


def used_mib(cfg: dict, allocs: list[dict]) -> dict[int, int]:
    used = {g["index"]: int(cfg.get("baseline_mib", BASELINE_MIB)) for g in cfg["gpus"]}
    for rec in allocs:
        if rec["gpu"] in used:
            used[rec["gpu"]] += int(rec["mib"])
    return used


def driver(sdir: str | None = None, poll: float = 0.05) -> None:
    """Record exact death times: one thread per registration blocks in flock until the holder is gone."""
    sdir = os.path.abspath(sdir or state_dir())
    hdir = os.path.join(sdir, "holders")
    watched: set[str] = set()
    lock = threading.Lock()
    pidfile = os.path.join(sdir, "driver.pid")
    _atomic_write(pidfile, "%d\n" % os.getpid())

    def watch(path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # returns when the last holder fd closes
            t_death = time.time()
            if not os.path.exists(path[:-5] + ".dead"):
                try:
                    with open(path) as handle:
                        rec = json.load(handle)
                    delay = float(load_config(sdir).get("release_delay", 0))
                    _record_death(sdir, path, rec, t_death, "driver", delay)
                except (OSError, ValueError):
                    pass
        finally:
            os.close(fd)
            with lock:
                watched.discard(path)

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while os.path.exists(os.path.join(sdir, "config.json")):  # the state dir going away ends the daemon
        try:
            names = os.listdir(hdir)
        except FileNotFoundError:
            break
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                path = os.path.join(hdir, name)
                with lock:
                    if path in watched or os.path.exists(path[:-5] + ".dead"):
                        continue
                    watched.add(path)
                threading.Thread(target=watch, args=(path,), daemon=True).start()
        time.sleep(poll)
    try:
        if open(pidfile).read().strip() == str(os.getpid()):
            os.unlink(pidfile)
    except OSError:
        pass


def start_driver(sdir: str | None = None) -> int:
    """Start the driver daemon detached (new session) unless one runs; return its PID."""
    import subprocess

    sdir = os.path.abspath(sdir or state_dir())
    running = driver_pid(sdir)
    if running:
        return running
    log = open(os.path.join(sdir, "driver.log"), "ab")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "driver"], env=dict(os.environ, FAKEGPU_DIR=sdir),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
    for _attempt in range(200):
        if driver_pid(sdir) == proc.pid:
            break
        time.sleep(0.01)
    return proc.pid


def driver_pid(sdir: str | None = None) -> int | None:
    """PID of this state dir's running driver daemon, or None."""
    sdir = os.path.abspath(sdir or state_dir())
    try:
        pid = int(open(os.path.join(sdir, "driver.pid")).read())
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmd = handle.read().split(b"\0")
    except (OSError, ValueError):
        return None
    if any(c.endswith(b"fakegpu.py") for c in cmd) and b"driver" in cmd:
        return pid
    return None


def stop_driver(sdir: str | None = None) -> bool:
    pid = driver_pid(sdir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    return True


# ---- host view: which host PIDs hold which device ---------------------------------------------

_DEV_NAME = re.compile(r"nvidia(\d+|ctl)$")


def device_keys(sdir: str, cfg: dict) -> dict[tuple[int, int], int | None]:
    keys: dict[tuple[int, int], int | None] = {}
    for i in range(cfg["count"]):
        st = os.stat(os.path.join(sdir, "dev", "nvidia%d" % i))
        keys[(st.st_dev, st.st_ino)] = i
    return keys


def host_processes(sdir: str | None = None, cfg: dict | None = None, allocs: list[dict] | None = None) -> list[dict]:
    """Compute processes as host nvidia-smi lists them (host PIDs); [] unless run in the host's PID namespace."""
    sdir = sdir or state_dir()
    cfg = cfg or load_config(sdir)
    if own_pidns() != cfg.get("host_pidns"):
        return []  # NVML under LXC: the driver's PIDs mean nothing here
    allocs = allocations(sdir) if allocs is None else allocs
    live = {(a["pidns"], a["pid"], a["gpu"]): a for a in allocs if a["state"] == "alive"}
    if not live:
        return []
    keys = device_keys(sdir, cfg)
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = "/proc/%s/fd" % name
        gpus = set()
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir + "/" + fd)
                if not _DEV_NAME.search(target):
                    continue
                st = os.stat(fd_dir + "/" + fd)
            except OSError:
                continue
            gpu = keys.get((st.st_dev, st.st_ino))
            if gpu is not None:
                gpus.add(gpu)
        if not gpus:
            continue
        try:
            pidns = os.readlink("/proc/%s/ns/pid" % name)
            nspid = name
            with open("/proc/%s/status" % name) as handle:
                for line in handle:
                    if line.startswith("NSpid:"):
                        nspid = line.split()[-1]
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                pname = handle.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        for gpu in sorted(gpus):
            rec = live.get((pidns, int(nspid), gpu))
            if rec is not None:
                out.append({"pid": int(name), "process_name": pname or rec["process_name"], "gpu": gpu,
                            "used_mib": rec["mib"], "gpu_uuid": cfg["gpus"][gpu]["uuid"]})
    return sorted(out, key=lambda p: (p["gpu"], p["pid"]))


def snapshot(sdir: str | None = None) -> dict:
    sdir = sdir or state_dir()
    cfg = load_config(sdir)
    allocs = allocations(sdir)
    return {"config": cfg, "used_mib": used_mib(cfg, allocs), "allocations": allocs,
            "processes": host_processes(sdir, cfg, allocs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fakegpu.py", description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--dir", default=None, help="state dir (default $FAKEGPU_DIR or %s)" % DEFAULT_DIR)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_init = sub.add_parser("init", help="create/refresh the state dir (idempotent)")
    p_init.add_argument("--count", type=int, default=8)
    p_init.add_argument("--release-delay", type=float, default=2.0)
    p_init.add_argument("--never-release", action="store_true")
    p_init.add_argument("--baseline-mib", type=int, default=BASELINE_MIB)
    p_init.add_argument("--driver", action="store_true", help="also start the driver daemon; prints its PID")
    p_conf = sub.add_parser("config", help="change settings of an initialised state dir")
    p_conf.add_argument("--release-delay", type=float)
    p_conf.add_argument("--never-release", choices=("on", "off"))
    p_conf.add_argument("--mode", choices=MODES)
    p_conf.add_argument("--lost-gpus", help="comma-separated indexes for mode gpu_lost")
    p_conf.add_argument("--hang-seconds", type=float)
    p_conf.add_argument("--driver-version", help="what nvidia-smi reports, e.g. 570.124.06 (an r570 driver)")
    p_conf.add_argument("--cuda-version", help="the CUDA version nvidia-smi's banner shows, e.g. 12.8")
    p_hold = sub.add_parser("hold", help="hold GPUs until killed")
    p_hold.add_argument("--gpu", type=int, action="append", required=True)
    p_hold.add_argument("--mib", type=int, default=80000)
    sub.add_parser("driver", help="run the driver daemon in the foreground")
    sub.add_parser("start-driver", help="start the driver daemon detached; prints its PID")
    sub.add_parser("stop-driver", help="stop this state dir's driver daemon (by its recorded PID)")
    sub.add_parser("state", help="print memory, allocations and host processes as JSON")
    args = parser.parse_args(argv)
    if args.dir:
        os.environ["FAKEGPU_DIR"] = os.path.abspath(args.dir)
    sdir = state_dir()
    if args.cmd == "init":
        init(sdir, count=args.count, release_delay=args.release_delay, never_release=args.never_release,
             baseline_mib=args.baseline_mib)
        if args.driver:
            print(start_driver(sdir))
    elif args.cmd == "config":
        changes: dict = {}
        if args.release_delay is not None:
            changes["release_delay"] = args.release_delay
        if args.never_release is not None:
            changes["never_release"] = args.never_release == "on"
        if args.mode is not None:
            changes["mode"] = args.mode
        if args.lost_gpus is not None:
            changes["lost_gpus"] = [int(x) for x in args.lost_gpus.split(",") if x.strip()]
        if args.hang_seconds is not None:
            changes["hang_seconds"] = args.hang_seconds
        if args.driver_version is not None:
            changes["driver_version"] = args.driver_version
        if args.cuda_version is not None:
            changes["cuda_version"] = args.cuda_version
        print(json.dumps(set_config(sdir, **changes), indent=1))
    elif args.cmd == "hold":
        # die on SIGTERM even as PID 1 of a PID namespace, where the default action is ignored
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        for gpu in args.gpu:
            hold(gpu, args.mib, sdir)
        print("holding gpus %s with %d MiB each, pid %d" % (",".join(map(str, args.gpu)), args.mib, os.getpid()),
              flush=True)
        while True:
            signal.pause()
    elif args.cmd == "driver":
        driver(sdir)
    elif args.cmd == "start-driver":
        print(start_driver(sdir))
    elif args.cmd == "stop-driver":
        return 0 if stop_driver(sdir) else 1
    elif args.cmd == "state":
        print(json.dumps(snapshot(sdir), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
