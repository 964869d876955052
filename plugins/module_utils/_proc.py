# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Read-only views of ``/proc``: one place for every module that looks at processes.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. It needs only the standard library (it runs on targets).

Everything here is a pure parser plus thin readers around it, so the parsers
can be tested table-driven against captured ``/proc`` text.
"""

from __future__ import annotations

import ipaddress
import os
import re
import typing as t
from dataclasses import dataclass, field, replace

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


class ProcError(Exception):
    """A ``/proc`` file was present but not in the expected format."""


@dataclass(frozen=True)
class StatFields:
    """The fields of ``/proc/PID/stat`` that identify and place a process."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    starttime: int  # clock ticks since boot; with pid it names one process for good
    tpgid: int = 0  # foreground process group of the controlling terminal (0 or -1 without one)


@dataclass(frozen=True)
class ProcessInfo:
    """One process, as seen at one moment."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    starttime: int
    comm: str
    cmdline: tuple[str, ...]
    uid: int | None = None
    is_kernel_thread: bool = False
    cgroup: str = ""
    nspid: tuple[int, ...] = field(default_factory=tuple)

    @property
    def identity(self) -> tuple[int, int]:
        """(pid, starttime): stays unique across PID reuse."""
        return (self.pid, self.starttime)

    @property
    def command(self) -> str:
        """The command line for humans; kernel threads show as ``[comm]``."""
        return " ".join(self.cmdline) if self.cmdline else "[%s]" % self.comm


def parse_stat(text: str) -> StatFields:
    """Parse ``/proc/PID/stat``.

    ``comm`` may itself contain spaces and parentheses, so it is cut at the
    first ``(`` and the *last* ``)``.
    """
    open_at = text.find("(")
    close_at = text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ProcError("no (comm) in stat line: %r" % text[:80])
    rest = text[close_at + 2:].split()
    # rest[0] is field 3 (state); starttime is field 22 -> rest[19]
    if len(rest) < 20:
        raise ProcError("stat line too short: %r" % text[:80])
    try:
        return StatFields(
            pid=int(text[:open_at].strip()),
            comm=text[open_at + 1:close_at],
            state=rest[0],
            ppid=int(rest[1]),
            pgid=int(rest[2]),
            sid=int(rest[3]),
            flags=int(rest[6]),
            starttime=int(rest[19]),
            tpgid=int(rest[5]),
        )
    except ValueError as exc:
        raise ProcError("bad number in stat line %r: %s" % (text[:80], exc)) from exc


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """Split ``/proc/PID/cmdline`` (NUL separated, maybe NUL terminated)."""
    if not raw:
        return ()
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return tuple(p.decode("utf-8", "surrogateescape") for p in parts)


def parse_proc_status(text: str) -> dict[str, str]:
    """``/proc/PID/status`` as a dict of its ``Key:\\tvalue`` lines."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def parse_uid(status: dict[str, str]) -> int | None:
    """The real UID from parsed status, or None when absent."""
    uids = status.get("Uid", "").split()
    return int(uids[0]) if uids else None


def parse_nspid(status: dict[str, str]) -> tuple[int, ...]:
    """``NSpid``: the PID in each nested PID namespace, outermost first."""
    return tuple(int(x) for x in status.get("NSpid", "").split())


# Proxmox VE (cgroup v2):   0::/lxc/200/ns/user.slice/...   monitor: /lxc.monitor/200
# plain LXC >= 4 (v1/v2):   0::/lxc.payload.200/...          monitor: /lxc.monitor.200
# LXC adds "-N" when a stale cgroup of the same name is still there (a container
# restarted after its monitor was killed): 0::/lxc.payload.200-1/...
_CT_CGROUP_RES = (
    re.compile(r"(?:^|/)lxc/(?P<vmid>\d+)(?:/|$)"),
    re.compile(r"(?:^|/)lxc\.payload\.(?P<vmid>\d+)(?:-\d+)?(?:/|$)"),
)


def container_vmid_from_cgroup(cgroup_text: str) -> int | None:
    """The VMID of the LXC container a process runs in, from ``/proc/PID/cgroup``.

    Returns None for host processes, including the container's monitor
    process, which lives outside the container's payload cgroup.
    """
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for regex in _CT_CGROUP_RES:
            match = regex.search(path)
            if match:
                return int(match.group("vmid"))
    return None


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()


def read_process(pid: int, proc_root: str = "/proc") -> ProcessInfo | None:
    """Snapshot one process, or None if it no longer exists.

    A process can vanish between any two reads; any of them failing with
    ENOENT/ESRCH means "gone", never an error.
    """
    base = "%s/%d" % (proc_root, pid)
    try:
        stat = parse_stat(_read_text(base + "/stat"))
        with open(base + "/cmdline", "rb") as handle:
            cmdline = parse_cmdline(handle.read())
        status = parse_proc_status(_read_text(base + "/status"))
        try:
            cgroup = _read_text(base + "/cgroup")
        except PermissionError:
            cgroup = ""
    except (FileNotFoundError, ProcessLookupError):
        return None
    return ProcessInfo(
        pid=stat.pid,
        ppid=stat.ppid,
        pgid=stat.pgid,
        sid=stat.sid,
        state=stat.state,
        starttime=stat.starttime,
        comm=stat.comm,
        cmdline=cmdline,
        uid=parse_uid(status),
        is_kernel_thread=bool(stat.flags & PF_KTHREAD),
        cgroup=cgroup,
        nspid=parse_nspid(status),
    )


def read_stat(pid: int, proc_root: str = "/proc") -> StatFields | None:
    """Just ``/proc/PID/stat``, parsed, or None when the process is gone."""
    try:
        return parse_stat(_read_text("%s/%d/stat" % (proc_root, pid)))
    except (FileNotFoundError, ProcessLookupError):
        return None


def read_starttime(pid: int, proc_root: str = "/proc") -> int | None:
    """Just the start time (cheap identity check), or None when gone."""
    stat = read_stat(pid, proc_root)
    return stat.starttime if stat is not None else None


def _read_raw(path: str) -> bytes:
    # os.open/os.read: no buffered/text layers; a full-table scan is the cost before a first signal
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # only a huge cmdline needs more than one read
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_process_light(pid: int, proc_root: str = "/proc") -> ProcessInfo | None:
    """stat + cmdline only: enough to match and to walk the tree (half the reads of :func:`read_process`).

    No uid, cgroup or NSpid. None when the process is gone or its stat is unreadable.
    """
    base = "%s/%d" % (proc_root, pid)
    try:
        stat = parse_stat(_read_raw(base + "/stat").decode("utf-8", "surrogateescape"))
        cmdline = parse_cmdline(_read_raw(base + "/cmdline"))
    except (FileNotFoundError, ProcessLookupError, ProcError):
        return None
    return ProcessInfo(pid=stat.pid, ppid=stat.ppid, pgid=stat.pgid, sid=stat.sid, state=stat.state,
                       starttime=stat.starttime, comm=stat.comm, cmdline=cmdline,
                       is_kernel_thread=bool(stat.flags & PF_KTHREAD))


def task_states(pid: int, proc_root: str = "/proc") -> list[str]:
    """The state letter of each thread of ``pid`` ([] when gone); threads vanishing meanwhile are skipped."""
    states = []
    try:
        tids = os.listdir("%s/%d/task" % (proc_root, pid))
    except OSError:
        return states
    for tid in tids:
        try:
            with open("%s/%d/task/%s/stat" % (proc_root, pid, tid), encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2:].split()
        if rest:
            states.append(rest[0])
    return states


def has_live_thread(pid: int, proc_root: str = "/proc") -> bool:
    """True when any thread of ``pid`` is not a zombie: a ``Z`` leader may still be a live process."""
    return any(state not in ("Z", "X") for state in task_states(pid, proc_root))


def live_thread_cmdline(pid: int, proc_root: str = "/proc") -> tuple[str, ...]:
    """A zombie leader's own cmdline reads empty; a live thread still shows the process's."""
    try:
        tids = os.listdir("%s/%d/task" % (proc_root, pid))
    except OSError:
        return ()
    for tid in tids:
        try:
            with open("%s/%d/task/%s/cmdline" % (proc_root, pid, tid), "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        if raw:
            return parse_cmdline(raw)
    return ()


def boot_time(proc_root: str = "/proc") -> float:
    """The boot time in seconds since the epoch (``btime``): turns a start time into a wall-clock time."""
    with open(proc_root + "/stat", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise ProcError("no btime in %s/stat" % proc_root)


def list_pids(proc_root: str = "/proc") -> list[int]:
    """Every numeric entry of ``/proc``, i.e. every thread-group leader."""
    return sorted(int(name) for name in os.listdir(proc_root) if name.isdigit())


def iter_processes(proc_root: str = "/proc") -> t.Iterator[ProcessInfo]:
    """Snapshot every process that still exists while it is read."""
    for pid in list_pids(proc_root):
        info = read_process(pid, proc_root)
        if info is not None:
            yield info


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/PID/environ`` (NUL-separated ``NAME=value``) as a dict."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str] | None:
    """The environment ``pid`` started with; None when it is not readable (gone, or another user's)."""
    try:
        with open("%s/%d/environ" % (proc_root, pid), "rb") as handle:
            return parse_environ(handle.read(1 << 20))
    except OSError:
        return None


def ancestors_of(pid: int, proc_root: str = "/proc") -> list[int]:
    """PIDs from ``pid``'s parent up to PID 1 (the chain the caller must never signal)."""
    chain: list[int] = []
    seen = {pid}
    current = pid
    while current > 1:
        info = read_process(current, proc_root)
        if info is None or info.ppid in seen or info.ppid == 0:
            break
        chain.append(info.ppid)
        seen.add(info.ppid)
        current = info.ppid
    return chain


def read_wchan(pid: int, proc_root: str = "/proc") -> str:
    """Where a process sleeps in the kernel ('' when unknown): for 'unkillable' reports."""
    try:
        return _read_text("%s/%d/wchan" % (proc_root, pid)).strip()
    except OSError:
        return ""


def fd_targets(pid: int, proc_root: str = "/proc") -> list[str]:
    """What each open fd of ``pid`` points at (like ``ls -l /proc/PID/fd``).

    Unreadable or vanished processes give an empty list: callers scan every
    process and must not fail on one that exits mid-scan.
    """
    return [target for fd_path, target in fd_links(pid, proc_root)]


def fd_links(pid: int, proc_root: str = "/proc") -> list[tuple[str, str]]:
    """``(fd path, target)`` for each open fd of ``pid``, e.g. ``('/proc/7/fd/3', '/dev/nvidia0')``.

    Like :func:`fd_targets`, but keeps the fd path so a caller can ``os.stat`` it
    and compare the file's identity (a bind-mounted device file shows another
    path in another mount namespace). Vanished or unreadable processes give [].
    """
    fd_dir = "%s/%d/fd" % (proc_root, pid)
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    links = []
    for name in names:
        path = fd_dir + "/" + name
        try:
            links.append((path, os.readlink(path)))
        except OSError:
            continue
    return links


def parse_fdinfo_flags(text: str) -> int | None:
    """The ``flags:`` field (octal open flags) of a ``/proc/PID/fdinfo/N`` text; None without one."""
    for line in text.splitlines():
        if line.startswith("flags:"):
            try:
                return int(line.split(":", 1)[1].strip(), 8)
            except ValueError:
                return None
    return None


def files_open_for_writing(pid: int, proc_root: str = "/proc") -> set[tuple[int, int]]:
    """``(st_dev, st_ino)`` of every regular file ``pid`` holds open for writing.

    Identities, not paths: they still match after the file is renamed, and
    when the caller sees the file through another mount namespace (the PVE
    host looking into a container's rootfs). Vanished or unreadable
    processes give an empty set.
    """
    found: set[tuple[int, int]] = set()
    for fd_path, _target in fd_links(pid, proc_root):
        try:
            st = os.stat(fd_path)
        except OSError:
            continue
        if (st.st_mode & 0o170000) != 0o100000:  # S_ISREG: pipes, sockets, ttys and devices are not saves
            continue
        try:
            flags = parse_fdinfo_flags(_read_text("%s/%d/fdinfo/%s" % (proc_root, pid, os.path.basename(fd_path))))
        except OSError:
            continue
        if flags is not None and (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR):
            found.add((st.st_dev, st.st_ino))
    return found


# ---------------------------------------------------------------- listening sockets

class Listener(t.NamedTuple):
    address: str  # as the kernel shows it, made readable: "0.0.0.0", "127.0.0.1", "::", "::1"
    port: int
    inode: int


def _hex_address(text: str) -> str:
    """A ``/proc/net/tcp{,6}`` local address (kernel-endian 32-bit words in hex) as an IP address string."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each word is host (little) endian
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    return str(ipaddress.IPv6Address(words))


def parse_tcp_listeners(text: str) -> list[Listener]:
    """The sockets in state LISTEN (``0A``) of a ``/proc/net/tcp`` or ``/proc/net/tcp6`` text."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        address, port = fields[1].split(":", 1)
        found.append(Listener(_hex_address(address), int(port, 16), int(fields[9])))
    return found


def read_tcp_listeners(proc_root: str = "/proc") -> list[Listener]:
    """Every TCP listener in this network namespace, IPv4 and IPv6."""
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            found.extend(parse_tcp_listeners(_read_text(os.path.join(proc_root, "net", name))))
        except OSError:  # no tcp6 on a kernel without IPv6
            continue
    return found


def socket_owners(inodes: t.Iterable[int], proc_root: str = "/proc") -> dict[int, list[int]]:
    """{socket inode: pids holding it open} for INODES, from every visible process's fds (a socket of a process
    this namespace cannot see, e.g. in another container sharing the network, has no owner here)."""
    wanted = {"socket:[%d]" % inode: inode for inode in inodes}
    owners: dict[int, list[int]] = {}
    if not wanted:
        return owners
    for pid in list_pids(proc_root):
        for target in set(fd_targets(pid, proc_root)):
            if target in wanted:
                owners.setdefault(wanted[target], []).append(pid)
    return owners


def parse_systemd_unit(cgroup_text: str) -> str:
    """The systemd service or scope a ``/proc/PID/cgroup`` places the process in ('' when none)."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return ""


def read_systemd_unit(pid: int, proc_root: str = "/proc") -> str:
    try:
        return parse_systemd_unit(_read_text(os.path.join(proc_root, str(pid), "cgroup")))
    except OSError:  # gone meanwhile
        return ""


def describe_process(pid: int, proc_root: str = "/proc") -> dict[str, t.Any]:
    """State, wchan and command line of a survivor (for the 'unkillable' report)."""
    info = read_process(pid, proc_root)
    if info is None:
        return {"pid": pid, "state": "gone", "wchan": "", "cmdline": ""}
    return {"pid": pid, "ppid": info.ppid, "state": info.state, "wchan": read_wchan(pid, proc_root),
            "cmdline": info.command, "uid": info.uid}


def stat_children(parents: t.Collection[int], proc_root: str = "/proc") -> list[tuple[int, int, int]]:
    """(pid, starttime, pgid) of every process whose parent is in ``parents`` (a light /proc scan)."""
    wanted = set(parents)
    found: list[tuple[int, int, int]] = []
    frontier = True
    while frontier:
        frontier = False
        for pid in list_pids(proc_root):
            if pid in wanted:
                continue
            try:
                stat = read_stat(pid, proc_root)
            except OSError:
                continue
            if stat is not None and stat.ppid in wanted and stat.state not in ("Z", "X"):
                wanted.add(stat.pid)
                found.append((stat.pid, stat.starttime, stat.pgid))
                frontier = True
    return found


def _keep(info: ProcessInfo | None, proc_root: str) -> ProcessInfo | None:
    """None for true zombies (no live thread: already gone); a zombie leader shows a live thread's cmdline."""
    if info is None:
        return None
    if info.state in ("Z", "X"):
        if not has_live_thread(info.pid, proc_root):
            return None
        if not info.cmdline:
            info = replace(info, cmdline=live_thread_cmdline(info.pid, proc_root))
    return info


def read_table(proc_root: str = "/proc", light: bool = False) -> dict[int, ProcessInfo]:
    """Every live process; ``light`` reads only stat and cmdline (no uid, cgroup, NSpid)."""
    table: dict[int, ProcessInfo] = {}
    for pid in list_pids(proc_root):
        info = _keep(read_process_light(pid, proc_root) if light else read_process(pid, proc_root), proc_root)
        if info is not None:
            table[pid] = info
    return table


def enrich(table: dict[int, ProcessInfo], pids: t.Iterable[int], proc_root: str = "/proc") -> None:
    """Complete the light entries of ``pids`` in place (uid, cgroup, NSpid); drop those gone meanwhile."""
    for pid in pids:
        info = _keep(read_process(pid, proc_root), proc_root)
        if info is None or info.starttime != table[pid].starttime:
            table.pop(pid, None)
        else:
            table[pid] = info


def read_tpgid(pid: int, proc_root: str = "/proc") -> int:
    """The foreground process group of ``pid``'s terminal (0 or -1 without one): what Ctrl-C reaches."""
    try:
        stat = read_stat(pid, proc_root)
    except (OSError, ProcError):
        return 0
    return stat.tpgid if stat is not None else 0
