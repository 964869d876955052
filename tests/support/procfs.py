"""This machine's processes and TCP sockets as /proc shows them: process trees, and who serves a connection.

The dead-link tests cut an SSH connection on its server side (the sshd child serving it), found by
the TCP socket it holds: its local port is the server's, its peer port the client's local port. Only
processes among the candidates a test passes (its own sshd's descendants) are ever returned.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Set, Tuple


def parent_pids() -> Dict[int, int]:
    """PID -> parent PID of every process now."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, encoding="ascii", errors="replace") as fh:
                    parents[int(name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(root: int) -> List[int]:
    """ROOT's descendants now (not ROOT): children that setsid'd or left the group stay its descendants."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tcp_table() -> Dict[int, Tuple[int, int]]:
    """Socket inode -> (local port, remote port) for every IPv4 TCP socket."""
    table = {}
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            table[int(f[9])] = (int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16))
    return table


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Something listens on HOST:PORT (IPv4; read from /proc/net/tcp, so no probe connection reaches the server)."""
    want = "%s:%04X" % ("".join("%02X" % int(b) for b in reversed(host.split("."))), port)
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        return any(f[1] == want and f[3] == "0A" for f in (line.split() for line in fh))


def socket_inodes(pid: int) -> Set[int]:
    """The inodes of the sockets PID holds open (empty when it is gone)."""
    inodes: Set[int] = set()
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def serving_processes(client_pid: int, server_port: int, candidates: Iterable[int]) -> List[int]:
    """The CANDIDATES holding the server end of CLIENT_PID's one TCP connection to SERVER_PORT.

    Asserts that CLIENT_PID has exactly one such connection and that some candidate serves it.
    """
    table = tcp_table()
    client_ports = {table[i][0] for i in socket_inodes(client_pid) if i in table and table[i][1] == server_port}
    assert len(client_ports) == 1, "expected one connection from pid %d to port %d, got %s" % (
        client_pid, server_port, client_ports)
    (client_port,) = client_ports
    found = [pid for pid in candidates
             if pid != client_pid and any(table.get(i) == (server_port, client_port) for i in socket_inodes(pid))]
    assert found, "no candidate process serves port %d for pid %d's connection" % (server_port, client_pid)
    return found


def cmdline_text(pid: int) -> str:
    """PID's command line, its arguments joined by spaces; "" once it is gone."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def exited(pid: int) -> bool:
    """PID has exited: no such process, or one that is only a zombie (or dying) now."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True
