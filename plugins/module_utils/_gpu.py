# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU memory sampling, holder discovery and the free/held judgement for ``gpu_free_wait``.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets); nvidia-ml-py is used when
importable (see :mod:`._nvml`).

Layout: pure parsers for ``nvidia-smi`` CSV, pure selection/judgement
functions, a ``/proc`` holder scan (what ``fuser -v /dev/nvidia*`` does), the
``nvidia-smi`` backend, and the bounded wait loop. Nothing here signals a
process: the module reports, the operator (or ``training_stop``) acts.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import stat as stat_mod
import subprocess
import time
import typing as t
from dataclasses import asdict, dataclass, field

from ansible_collections.gpuops.repurpose.plugins.module_utils._proc import (
    container_vmid_from_cgroup,
    fd_links,
    list_pids,
    read_process,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

GPU_QUERY_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "pci.bus_id")
APP_QUERY_FIELDS = ("pid", "process_name", "used_gpu_memory", "gpu_uuid")
DEFAULT_DEVICE_PATHS = ("/dev/nvidia*",)
DEFAULT_IGNORE_PROCESSES = (
    "nvidia-persistenced", "nvidia-powerd", "nv-hostengine", "dcgm-exporter", "nvidia-smi",
    "Xorg", "X", "Xwayland", "gnome-shell", "kwin_x11", "kwin_wayland", "sddm-greeter", "gdm-x-session",
)
# nvidia-smi(1) RETURN VALUE: what an operator should read into each exit code.
NVIDIA_SMI_RC = {
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on the target device",
    4: "no permission to access this device",
    6: "no GPU was found",
    8: "a device's external power cables are not attached",
    9: "the NVIDIA driver is not loaded",
    10: "the kernel detected an interrupt issue with a GPU",
    12: "the NVML library (libnvidia-ml.so) could not be found or loaded",
    13: "the local NVML does not implement this function",
    14: "the infoROM is corrupted",
    15: "a GPU has fallen off the bus or become inaccessible",
    255: "other error or internal driver error",
}
_NOT_A_NUMBER = ("[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU is lost]", "[GPU requires reset]",
                 "[Insufficient Permissions]")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F/-]*$")
_DEV_INDEX_RE = re.compile(r"nvidia(\d+)$")
# pid_max can never exceed 2**22 (PID_MAX_LIMIT); NVML struct-version mismatches give 0 or garbage.
_PID_LIMIT = 1 << 22


class GpuError(Exception):
    """The GPUs cannot be judged (bad input, missing or broken backend): never read as 'free'."""


class BackendUnavailable(GpuError):
    """This backend cannot run here; ``backend: auto`` may fall back to the next one."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    used_mib: int
    total_mib: int
    bus_id: str = ""


@dataclass(frozen=True)
class GpuProcess:
    """A compute process as the backend (NVML / nvidia-smi) lists it: PIDs of the driver's namespace."""

    pid: int
    gpu_uuid: str
    used_mib: t.Optional[int]
    name: str = ""


@dataclass
class Sample:
    """One reading of every GPU. ``processes`` is None when the backend gave no usable list."""

    at: float  # wall clock, so tests can line samples up with other processes' events
    gpus: tuple[GpuInfo, ...]
    processes: t.Optional[tuple[GpuProcess, ...]]
    backend: str
    took: float = 0.0
    notes: tuple[str, ...] = ()
    # nvidia-smi needs a second call for processes: made only when the memory alone says busy
    fetch: t.Optional[t.Callable[[], t.Tuple[t.Optional[tuple], str]]] = field(default=None, repr=False)

    def ensure_processes(self) -> None:
        """Fetch the deferred process list (once)."""
        if self.fetch is not None:
            fetch, self.fetch = self.fetch, None
            self.processes, note = fetch()
            if note:
                self.notes = self.notes + (note,)


@dataclass
class Holder:
    """A process with an NVIDIA device file open, as ``fuser -v /dev/nvidia*`` would list it."""

    pid: int
    name: str
    cmdline: str
    gpu: t.Optional[int]  # None: only driver-wide files (nvidiactl, nvidia-uvm) are open
    device: str
    container: t.Optional[int] = None  # VMID from the cgroup path (on the PVE host)
    container_pid: t.Optional[int] = None  # the PID inside the container (innermost NSpid)
    used_mib: t.Optional[int] = None  # where the backend reports it for this PID
    gpu_uuid: t.Optional[str] = None
    ignored: str = ""  # why it does not count, '' when it does

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        where = "GPU %s" % self.gpu if self.gpu is not None else "driver"
        mib = "%d MiB" % self.used_mib if self.used_mib is not None else "MiB unknown"
        ct = " in CT%s (pid %s there)" % (self.container, self.container_pid) if self.container is not None else ""
        return "pid %d %s [%s] on %s, %s%s" % (self.pid, self.name, self.cmdline[:120], where, mib, ct)


# ---- input checks -------------------------------------------------------------------------------

def validate_options(gpus: t.Sequence[str], max_used_mib: int, stable_for: int, timeout: float, interval: float,
                     delay: float, container: t.Optional[int]) -> list[str]:
    """Reject bad input before anything is sampled; returns the normalised ``gpus`` list."""
    if max_used_mib < 0:
        raise GpuError("max_used_mib must be >= 0 (MiB per GPU that still counts as free), got %d" % max_used_mib)
    if stable_for < 1:
        raise GpuError("stable_for must be >= 1 (consecutive free samples), got %d" % stable_for)
    if timeout < 0:
        raise GpuError("timeout must be >= 0 seconds, got %s" % timeout)
    if not interval > 0:
        raise GpuError("interval must be > 0 seconds, got %s" % interval)
    if delay < 0:
        raise GpuError("delay must be >= 0 seconds, got %s" % delay)
    if container is not None and not 100 <= container <= 999999999:
        raise GpuError("container must be a Proxmox VMID (100-999999999), got %d" % container)
    out = []
    for raw in gpus:
        item = str(raw).strip()
        if item.isdigit() or _UUID_RE.match(item):
            out.append(item)
        else:
            raise GpuError("gpus: %r is neither a GPU index (0, 1, ...) nor a UUID (GPU-...); "
                           "list them with nvidia-smi -L" % raw)
    return out


# ---- nvidia-smi parsers -------------------------------------------------------------------------

def gpu_query_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv,noheader,nounits"]


def apps_query_argv(nvidia_smi: str) -> list[str]:
    return [nvidia_smi, "--query-compute-apps=" + ",".join(APP_QUERY_FIELDS), "--format=csv,noheader,nounits"]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def check_nvidia_smi(rc: int, stdout: str, stderr: str) -> None:
    """Raise GpuError naming the cause when an nvidia-smi call failed."""
    if rc == 0 and "No devices were found" not in stdout:
        return
    said = _first_line(stdout) or _first_line(stderr) or "(no output)"
    if rc == 0:
        rc = 6
    meaning = NVIDIA_SMI_RC.get(rc, "unknown exit code")
    lost = [line.strip() for line in (stdout + "\n" + stderr).splitlines() if "Unable to determine the device handle" in line]
    if lost:
        said = "; ".join(lost)
    raise GpuError("nvidia-smi failed (rc %d: %s): %s" % (rc, meaning, said))


def parse_mib(value: str, what: str) -> int:
    """An integer MiB field; ``[N/A]``/``[Not Supported]``/garbage raise (unknown is never 0)."""
    value = value.strip()
    if value.endswith(" MiB"):
        value = value[:-4]
    if value in _NOT_A_NUMBER or not value.isdigit():
        raise GpuError("nvidia-smi reported %s as %r: GPU memory cannot be read, so the GPUs cannot be judged free"
                       % (what, value))
    return int(value)


def _split_csv(line: str) -> list[str]:
    # Names and process paths carry no commas in practice; nvidia-smi does not quote.
    return [part.strip() for part in line.split(",")]


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """Parse ``--query-gpu=index,uuid,name,memory.used,memory.total,pci.bus_id --format=csv,noheader,nounits``."""
    if "No devices were found" in text:
        raise GpuError("nvidia-smi: No devices were found")
    if "\x00" in text or "\ufffd" in text:
        raise GpuError("nvidia-smi printed garbled output (binary bytes): %r" % text[:200])
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = _split_csv(line)
        if len(parts) != len(GPU_QUERY_FIELDS):
            raise GpuError("nvidia-smi printed an unexpected line (expected %d fields %s): %r"
                           % (len(GPU_QUERY_FIELDS), ",".join(GPU_QUERY_FIELDS), line[:200]))
        index, uuid, name, used, total, bus = parts
        if not index.isdigit() or not _UUID_RE.match(uuid):
            raise GpuError("nvidia-smi printed an unexpected line (bad index or uuid): %r" % line[:200])
        gpus.append(GpuInfo(index=int(index), uuid=uuid, name=name,
                            used_mib=parse_mib(used, "memory.used of GPU %s" % index),
                            total_mib=parse_mib(total, "memory.total of GPU %s" % index), bus_id=bus))
    if not gpus:
        raise GpuError("nvidia-smi printed no GPUs (empty output): the driver lists no device")
    return gpus


def parse_apps_csv(text: str) -> list[GpuProcess]:
    """Parse ``--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv,noheader,nounits``.

    Memory may be ``[N/A]`` (containers, MIG): kept as None, the list is advisory.
    """
    if "\x00" in text or "\ufffd" in text:
        raise GpuError("nvidia-smi printed garbled process output: %r" % text[:200])
    procs = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        parts = _split_csv(line)
        if len(parts) < 4 or not parts[0].isdigit():
            raise GpuError("nvidia-smi printed an unexpected process line: %r" % line[:200])
        pid, uuid, used = parts[0], parts[-1], parts[-2]
        name = ", ".join(parts[1:-2])
        mib = int(used[:-4] if used.endswith(" MiB") else used) if used.replace(" MiB", "").isdigit() else None
        procs.append(GpuProcess(pid=int(pid), gpu_uuid=uuid, used_mib=mib, name=name))
    return procs


# ---- selection and judgement --------------------------------------------------------------------

def select_gpus(gpus: t.Sequence[GpuInfo], wanted: t.Sequence[str]) -> list[GpuInfo]:
    """The GPUs named by index or UUID (all when ``wanted`` is empty), in the order the backend lists them."""
    if not wanted:
        return list(gpus)
    by_index = {str(g.index): g for g in gpus}
    by_uuid = {g.uuid.lower(): g for g in gpus}
    chosen: dict[int, GpuInfo] = {}
    for item in wanted:
        gpu = by_index.get(item) or by_uuid.get(item.lower())
        if gpu is None:
            raise GpuError("gpus: no GPU %r here; present: %s" % (
                item, ", ".join("%d (%s)" % (g.index, g.uuid) for g in gpus)))
        chosen[gpu.index] = gpu
    return [g for g in gpus if g.index in chosen]


def name_ignored(comm: str, cmdline: t.Sequence[str], ignore: t.Sequence[str]) -> str:
    """The ignore pattern matching this process's name (comm or argv[0] basename), '' when none."""
    names = {comm}
    if cmdline:
        names.add(os.path.basename(cmdline[0]))
    for pattern in ignore:
        if any(fnmatch.fnmatchcase(n, pattern) for n in names if n):
            return pattern
    return ""


def discounted_mib(sample: Sample, ignore: t.Sequence[str], container: t.Optional[int],
                   lookup: t.Callable[[int], t.Optional[t.Any]]) -> dict[str, int]:
    """MiB per GPU UUID that the backend attributes to processes that do not count.

    Those are ignored processes and, with ``container``, processes outside that
    container. Memory nobody is known to own still counts: unknown is never free.
    ``lookup(pid)`` gives the local ``ProcessInfo`` or None (a PID foreign here).
    """
    out: dict[str, int] = {}
    for proc in sample.processes or ():
        if proc.used_mib is None:
            continue
        info = lookup(proc.pid)
        if info is None:
            continue
        skip = bool(name_ignored(info.comm, info.cmdline, ignore))
        if container is not None and container_vmid_from_cgroup(info.cgroup) != container:
            skip = True
        if skip:
            out[proc.gpu_uuid] = out.get(proc.gpu_uuid, 0) + proc.used_mib
    return out


def counted_mib(gpu: GpuInfo, discount: t.Mapping[str, int]) -> int:
    return max(0, gpu.used_mib - discount.get(gpu.uuid, 0))


def judge(gpus: t.Sequence[GpuInfo], discount: t.Mapping[str, int], max_used_mib: int) -> bool:
    """Free when every given GPU's counted memory is at or under the threshold."""
    return all(counted_mib(g, discount) <= max_used_mib for g in gpus)


# ---- holders: the /proc scan --------------------------------------------------------------------

def _identity(st: os.stat_result) -> tuple:
    if stat_mod.S_ISCHR(st.st_mode):
        return ("chr", st.st_rdev)
    return ("file", st.st_dev, st.st_ino)


def device_identities(patterns: t.Sequence[str]) -> dict[tuple, str]:
    """The device files the patterns name here, keyed by identity (char device number, or inode)."""
    import glob

    ids: dict[tuple, str] = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                ids.setdefault(_identity(os.stat(path)), path)
            except OSError:
                continue
    return ids


def device_gpu_index(path: str) -> t.Optional[int]:
    match = _DEV_INDEX_RE.search(path)
    return int(match.group(1)) if match else None


def _container_of(info: t.Any) -> tuple[t.Optional[int], t.Optional[int]]:
    """(VMID from the cgroup path, PID in the innermost PID namespace); each None where it does not apply."""
    inner = info.nspid[-1] if len(info.nspid) > 1 else None
    return container_vmid_from_cgroup(info.cgroup), inner


def scan_holders(patterns: t.Sequence[str] = DEFAULT_DEVICE_PATHS, proc_root: str = "/proc",
                 exclude_pids: t.Collection[int] = ()) -> list[Holder]:
    """Every process with a matching device file open, one entry per (pid, GPU).

    A fd counts when it is the same file as a device the patterns name here
    (so a bind mount seen under another path in a container still matches),
    or when its path matches a pattern (the device exists only in the
    process's own mount namespace). Processes vanishing mid-scan are skipped.
    """
    ids = device_identities(patterns)
    base_globs = {os.path.basename(p) for p in patterns}
    holders: list[Holder] = []
    for pid in list_pids(proc_root):
        if pid in exclude_pids:
            continue
        devices: dict[t.Optional[int], str] = {}
        for fd_path, target in fd_links(pid, proc_root):
            if not any(fnmatch.fnmatchcase(os.path.basename(target), g) for g in base_globs):
                continue
            device = None
            try:
                device = ids.get(_identity(os.stat(fd_path)))
            except OSError:
                pass
            if device is None and any(fnmatch.fnmatchcase(target, p) for p in patterns):
                device = target
            if device is not None:
                devices.setdefault(device_gpu_index(device), device)
        if not devices:
            continue
        info = read_process(pid, proc_root)
        if info is None:
            continue
        vmid, inner = _container_of(info)
        gpus = sorted(g for g in devices if g is not None) or [None]
        for gpu in gpus:
            holders.append(Holder(pid=pid, name=info.comm, cmdline=info.command, gpu=gpu,
                                  device=devices.get(gpu, devices.get(None, "")), container=vmid,
                                  container_pid=inner))
    return holders


def merge_backend_processes(holders: list[Holder], sample: t.Optional[Sample], gpus: t.Sequence[GpuInfo],
                            lookup: t.Callable[[int], t.Optional[t.Any]]) -> tuple[list[Holder], list[dict]]:
    """Attach backend MiB to /proc holders and add backend processes the scan could not see.

    Returns (holders, foreign): ``foreign`` are backend PIDs that do not exist
    in this PID namespace (host PIDs seen from inside a container).
    """
    if sample is None or not sample.processes:
        return holders, []
    uuid_to_index = {g.uuid: g.index for g in gpus}
    by_key = {(h.pid, h.gpu): h for h in holders}
    foreign = []
    for proc in sample.processes:
        index = uuid_to_index.get(proc.gpu_uuid)
        holder = by_key.get((proc.pid, index))
        if holder is not None:
            holder.used_mib = proc.used_mib
            holder.gpu_uuid = proc.gpu_uuid
            continue
        info = lookup(proc.pid)
        if info is None:
            foreign.append({"pid": proc.pid, "name": proc.name, "gpu_uuid": proc.gpu_uuid, "used_mib": proc.used_mib})
            continue
        vmid, inner = _container_of(info)
        new = Holder(pid=proc.pid, name=info.comm, cmdline=info.command, gpu=index, device="", used_mib=proc.used_mib,
                     gpu_uuid=proc.gpu_uuid, container=vmid, container_pid=inner)
        holders.append(new)
        by_key[(proc.pid, index)] = new
    for h in holders:
        if h.gpu_uuid is None and h.gpu is not None:
            h.gpu_uuid = next((g.uuid for g in gpus if g.index == h.gpu), None)
    return holders, foreign


def classify_holders(holders: t.Sequence[Holder], gpus: t.Optional[t.Sequence[GpuInfo]], ignore: t.Sequence[str],
                     container: t.Optional[int],
                     lookup: t.Callable[[int], t.Optional[t.Any]] = lambda pid: None) -> tuple[list[Holder], list[Holder]]:
    """Split into (counted, ignored); holders of unselected GPUs are dropped (``gpus`` None: every GPU counts)."""
    wanted = None if gpus is None else {g.index for g in gpus}
    counted, ignored = [], []
    for h in holders:
        if wanted is not None and h.gpu is not None and h.gpu not in wanted:
            continue
        info = lookup(h.pid)
        argv = tuple(info.cmdline) if info is not None else tuple(h.cmdline.split(" ")[:1])
        pattern = name_ignored(h.name, argv, ignore)
        if pattern:
            h.ignored = "ignore_processes: %s" % pattern
        elif container is not None and h.container != container:
            h.ignored = "outside container %d (%s)" % (
                container, "CT%d" % h.container if h.container is not None else "host")
        (ignored if h.ignored else counted).append(h)
    return counted, ignored


# ---- the nvidia-smi backend ---------------------------------------------------------------------

def resolve_nvidia_smi(path: str) -> str:
    """An executable path for ``nvidia_smi_path`` (a bare name is looked up on PATH)."""
    if "/" not in path:
        found = shutil.which(path) or shutil.which(path, path="/usr/bin:/usr/local/bin:/usr/sbin:/bin")
        if not found:
            raise GpuError("nvidia-smi not found on PATH (%s): install the NVIDIA driver utilities, "
                           "or set nvidia_smi_path" % os.environ.get("PATH", ""))
        return found
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise GpuError("nvidia_smi_path %s is not an executable file" % path)
    return path


Runner = t.Callable[[t.Sequence[str], float], t.Tuple[int, str, str]]


def run_command(argv: t.Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run with ``LC_ALL=C`` (numbers and messages as parsed), bounded by ``timeout``."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise GpuError("%s did not answer within %g s (hung driver or lost GPU?)" % (argv[0], timeout)) from exc
    except OSError as exc:
        raise GpuError("cannot run %s: %s" % (argv[0], exc)) from exc
    return (proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


class NvidiaSmiBackend:
    """Samples through ``nvidia-smi`` CSV queries.

    The process list is a second call, made only when the memory alone says
    busy. While the GPUs are busy it is started alongside the memory query
    (the next sample will likely need it), so a sample costs one call's time,
    not two; an unused prefetch is ended, never left behind.
    """

    name = "nvidia_smi"

    def __init__(self, path: str, runner: Runner = run_command, call_timeout: float = 30.0) -> None:
        self.path = path
        self.runner = runner
        self.call_timeout = call_timeout
        self._prefetch: t.Optional[subprocess.Popen] = None
        self._want_processes = False

    def gpus(self) -> list[GpuInfo]:
        rc, out, err = self.runner(gpu_query_argv(self.path), self.call_timeout)
        check_nvidia_smi(rc, out, err)
        return parse_gpu_csv(out)

    def _apps_result(self, rc: int, out: str, err: str) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        try:
            check_nvidia_smi(rc, out, err)
            return tuple(parse_apps_csv(out)), ""
        except GpuError as exc:
            return None, "no process list: %s" % exc

    def processes(self) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        """The process list, or (None, why) when it cannot be had: it is advisory."""
        self._want_processes = True
        try:
            return self._apps_result(*self.runner(apps_query_argv(self.path), self.call_timeout))
        except GpuError as exc:
            return None, "no process list: %s" % exc

    def _start_prefetch(self) -> None:
        if self.runner is not run_command:
            return
        try:
            self._prefetch = subprocess.Popen(apps_query_argv(self.path), stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              env=dict(os.environ, LC_ALL="C", LANG="C"))
        except OSError:
            self._prefetch = None

    def _take_prefetch(self, proc: subprocess.Popen) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        self._want_processes = True
        if self._prefetch is proc:
            self._prefetch = None
        try:
            out, err = proc.communicate(timeout=self.call_timeout)
        except subprocess.TimeoutExpired:
            self._end(proc)
            return None, "no process list: nvidia-smi did not answer within %g s" % self.call_timeout
        return self._apps_result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    @staticmethod
    def _end(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.communicate()
        except (OSError, ValueError):
            pass

    def sample(self) -> Sample:
        start = time.monotonic()
        now = time.time()
        self.close()  # an unused prefetch from the previous sample
        if self._want_processes:
            self._start_prefetch()
        self._want_processes = False
        prefetch = self._prefetch
        gpus = self.gpus()
        fetch = (lambda: self._take_prefetch(prefetch)) if prefetch is not None else self.processes
        return Sample(at=now, gpus=tuple(gpus), processes=None, backend=self.name,
                      took=time.monotonic() - start, fetch=fetch)

    def close(self) -> None:
        if self._prefetch is not None:
            self._end(self._prefetch)
            self._prefetch = None


# ---- waiting ------------------------------------------------------------------------------------

@dataclass
class WaitResult:
    free: bool
    first: Sample
    last: Sample
    samples: int
    elapsed: float
    history: list[dict] = field(default_factory=list)
    timed_out: bool = False


def _history_entry(sample: Sample, started: float, free: bool, counted: t.Mapping[int, int]) -> dict:
    return {"t": round(sample.at, 3), "elapsed": round(sample.at - started, 3), "took": round(sample.took, 3),
            "free": free, "counted_mib": dict(counted)}


class Waiter:
    """Samples every ``interval`` until ``stable_for`` consecutive free samples or ``timeout``."""

    def __init__(self, timeout: float, interval: float, delay: float = 0.0, stable_for: int = 1,
                 sleep: t.Callable[[float], None] = time.sleep, clock: t.Callable[[], float] = time.monotonic,
                 history_limit: int = 100) -> None:
        self.timeout, self.interval, self.delay, self.stable_for = timeout, interval, delay, stable_for
        self.sleep, self.clock, self.history_limit = sleep, clock, history_limit

    def wait(self, sample_fn: t.Callable[[], Sample],
             free_fn: t.Callable[[Sample], t.Tuple[bool, t.Mapping[int, int]]]) -> WaitResult:
        deadline = Deadline(self.timeout, clock=self.clock)  # delay counts within timeout, as in wait_for
        wall_start = time.time()
        if self.delay:
            self.sleep(min(self.delay, deadline.remaining()))
        streak = count = 0
        first: t.Optional[Sample] = None
        history: list[dict] = []
        while True:
            began = self.clock()
            sample = sample_fn()
            count += 1
            first = first or sample
            free, counted = free_fn(sample)
            sample.took = self.clock() - began  # backend calls and judgement: the next sample starts interval after
            streak = streak + 1 if free else 0
            history.append(_history_entry(sample, wall_start, free, counted))
            del history[:-self.history_limit]
            if streak >= self.stable_for:
                return WaitResult(True, first, sample, count, deadline.elapsed(), history)
            if deadline.expired():
                return WaitResult(False, first, sample, count, deadline.elapsed(), history, timed_out=True)
            # sleep from the end of the sample: a slow backend never turns into back-to-back calls
            self.sleep(min(self.interval, deadline.remaining()))


class CheckModeWaiter(Waiter):
    """Check mode: one sample, reported; never waits (the kubernetes.core no-op waiter idea)."""

    def __init__(self) -> None:
        super().__init__(timeout=0, interval=1)

    def wait(self, sample_fn, free_fn) -> WaitResult:
        start = self.clock()
        wall_start = time.time()
        sample = sample_fn()
        free, counted = free_fn(sample)
        return WaitResult(free, sample, sample, 1, self.clock() - start,
                          [_history_entry(sample, wall_start, free, counted)], timed_out=False)
