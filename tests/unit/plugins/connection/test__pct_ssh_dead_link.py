"""A dead SSH link is noticed within the documented bound, against a real throwaway sshd.

The link is cut the two ways it dies in practice, on the sshd process that
serves the connection (found by the TCP socket it holds, whose peer port is
the client's local port): frozen with SIGSTOP (a silent host: the TCP
connection stays up, nothing answers) and killed (the host closes the
connection). Each time a pending command must fail with kind ``lost`` within
``dead_after(settings)`` plus the second the command loop takes to notice, the
control master must exit, and a new request must get a fresh connection.
Only processes this test's own sshd fixture started are signalled.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import typing as t

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh


def settings(server, **kw) -> _pct_ssh.Settings:
    return _pct_ssh.Settings(
        host="127.0.0.1", port=server.port, user="root", key_filename=server.key, look_for_keys=False,
        known_hosts_file=server.known_hosts, connect_timeout=5, **kw,
    )

# the command loop checks the channel once a second; the rest is scheduling slack on a loaded 2-core CI box
NOTICE_S = 1.0
SLACK_S = 4.0
FAST = dict(server_alive_interval=1, server_alive_count_max=2)


def _tcp_table() -> t.Dict[int, t.Tuple[int, int]]:
    """Socket inode -> (local port, remote port) for every IPv4 TCP socket."""
    table = {}
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            table[int(f[9])] = (int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16))
    return table


def _socket_inodes(pid: int) -> t.Set[int]:
    inodes = set()
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


def _descendants(root: int) -> t.List[int]:
    children: t.Dict[int, t.List[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def serving_sshd(sshd, client_pid: int) -> t.List[int]:
    """The fixture's sshd processes that hold the server end of CLIENT_PID's connection to it."""
    table = _tcp_table()
    client_ports = {table[i][0] for i in _socket_inodes(client_pid) if i in table and table[i][1] == sshd.port}
    assert len(client_ports) == 1, "expected one connection from pid %d to port %d, got %s" % (client_pid, sshd.port, client_ports)
    (client_port,) = client_ports
    found = []
    for pid in _descendants(sshd.proc.pid):
        if any(table.get(i) == (sshd.port, client_port) for i in _socket_inodes(pid)):
            found.append(pid)
    assert found, "no sshd child of pid %d serves port %d" % (sshd.proc.pid, client_port)
    return found


def exited(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_until(predicate: t.Callable[[], bool], bound: float) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class Pending:
    """A request running in a thread; ``error`` is its SessionError once it failed."""

    def __init__(self, call: t.Callable[[], t.Any]) -> None:
        self.result: t.Any = None
        self.error: t.Optional[_pct_ssh.SessionError] = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: t.Callable[[], t.Any]) -> None:
        try:
            self.result = call()
        except _pct_ssh.SessionError as e:
            self.error = e


def _cut(pids: t.List[int], how: str) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP if how == "freeze" else signal.SIGKILL)


def _release(pids: t.List[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_documented_bound_follows_the_options():
    s = _pct_ssh.Settings(host="h")
    assert _pct_ssh.dead_after(s) == 5 * (3 + 1)
    assert _pct_ssh.dead_after(_pct_ssh.Settings(host="h", server_alive_interval=0)) is None
    assert _pct_ssh.frame_timeout(s) == 5 * 4 + 5
    with pytest.raises(_pct_ssh.SessionError, match="server_alive_count_max must be >= 1"):
        _pct_ssh.validate_alive(5, 0)
    with pytest.raises(_pct_ssh.SessionError, match="server_alive_interval must be >= 0"):
        _pct_ssh.validate_alive(-1, 3)


@pytest.mark.parametrize("how", ["freeze", "kill"])
def test_control_master_fails_every_pending_request_and_exits(sshd, tmp_path, how):
    st = settings(sshd, **FAST)
    cp = str(tmp_path / "cp")
    client = _pct_ssh.open_master(st, cp, persist=60, start_timeout=30)
    master_pid = client._call({"op": "ping"})[0]["pid"]
    marker = tmp_path / "second-ran"
    pending = [
        Pending(lambda: client.exec("echo started; sleep 120", timeout=3600)),
        Pending(lambda: client.exec("sleep 120; touch %s" % marker, timeout=3600)),
    ]
    time.sleep(0.5)  # both commands are running on the host
    victims = serving_sshd(sshd, master_pid)
    try:
        _cut(victims, how)
        bound = _pct_ssh.dead_after(st) + NOTICE_S + SLACK_S
        for p in pending:
            p.thread.join(bound)
            assert not p.thread.is_alive(), "a pending request still waits after the documented bound (%gs)" % bound
            assert p.error is not None and p.error.kind == "lost", p.error or p.result
            assert "may have run in part" in p.error.msg
            if how == "freeze":
                assert "answered no keepalive" in p.error.msg and "server_alive_interval=1" in p.error.msg
        assert wait_until(lambda: exited(master_pid), _pct_ssh.DEAD_DRAIN_S + SLACK_S), "the control master did not exit"
        assert not os.path.exists(client.path)
        # the next task gets a fresh master with a fresh connection
        fresh = _pct_ssh.open_master(st, cp, persist=5, start_timeout=30)
        assert fresh._call({"op": "ping"})[0]["pid"] != master_pid
        assert fresh.exec("echo again").stdout == b"again\n"
        fresh.stop()
    finally:
        _release(victims)


def test_direct_session_notices_a_frozen_host(sshd):
    st = settings(sshd, **FAST)
    session = _pct_ssh.DirectSession(st).connect()
    try:
        pending = Pending(lambda: session.exec("sleep 120", timeout=3600))
        time.sleep(0.5)
        victims = serving_sshd(sshd, os.getpid())
        try:
            _cut(victims, "freeze")
            pending.thread.join(_pct_ssh.dead_after(st) + NOTICE_S + SLACK_S)
            assert not pending.thread.is_alive()
            assert pending.error is not None and pending.error.kind == "lost"
            assert not session.alive()
            with pytest.raises(_pct_ssh.SessionError) as exc:  # nothing runs on a dead connection: safe to retry
                session.exec("true")
            assert exc.value.kind == "gone"
        finally:
            _release(victims)
    finally:
        session.close()


def test_a_live_quiet_command_outlasts_the_bound(sshd, tmp_path):
    """Probes are answered while a command prints nothing: a quiet command is not a dead link."""
    st = settings(sshd, **FAST)
    client = _pct_ssh.open_master(st, str(tmp_path / "cp"), persist=5, start_timeout=30)
    try:
        r = client.exec("sleep %d; echo done" % (_pct_ssh.dead_after(st) * 2), timeout=60)
        assert (r.rc, r.stdout) == (0, b"done\n")
    finally:
        client.stop()


def test_worker_gives_up_on_a_frozen_master(sshd, tmp_path):
    """A master that stops answering (SIGSTOP) fails the worker within frame_timeout, not command_timeout."""
    st = settings(sshd, **FAST)
    client = _pct_ssh.open_master(st, str(tmp_path / "cp"), persist=60, start_timeout=30)
    master_pid = client._call({"op": "ping"})[0]["pid"]
    pending = Pending(lambda: client.exec("sleep 120", timeout=3600))
    time.sleep(0.5)
    os.kill(master_pid, signal.SIGSTOP)
    try:
        pending.thread.join(_pct_ssh.frame_timeout(st) + SLACK_S)
        assert not pending.thread.is_alive(), "the worker still waits on a frozen master"
        assert pending.error is not None and pending.error.kind == "master" and "sent nothing" in pending.error.msg
    finally:
        os.kill(master_pid, signal.SIGKILL)
        os.kill(master_pid, signal.SIGCONT)


def test_worker_fails_at_once_when_its_master_is_killed(sshd, tmp_path):
    st = settings(sshd, **FAST)
    cp = str(tmp_path / "cp")
    client = _pct_ssh.open_master(st, cp, persist=60, start_timeout=30)
    master_pid = client._call({"op": "ping"})[0]["pid"]
    pending = Pending(lambda: client.exec("sleep 120", timeout=3600))
    time.sleep(0.5)
    os.kill(master_pid, signal.SIGKILL)
    pending.thread.join(SLACK_S)
    assert not pending.thread.is_alive()
    assert pending.error is not None and pending.error.kind == "master" and "went away" in pending.error.msg
    fresh = _pct_ssh.open_master(st, cp, persist=5, start_timeout=30)
    assert fresh.exec("echo again").stdout == b"again\n"
    fresh.stop()
