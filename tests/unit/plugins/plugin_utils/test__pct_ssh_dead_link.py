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
import socket
import threading
import time
import typing as t

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._pct_ssh import master as pct_ssh_master
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._pct_ssh import wire
from tests.support.procfs import descendants, exited, serving_processes
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes


def settings(server, **kw) -> _pct_ssh.Settings:
    return _pct_ssh.Settings(
        host="127.0.0.1", port=server.port, user="root", key_filename=server.key, look_for_keys=False,
        known_hosts_file=server.known_hosts, connect_timeout=5, **kw,
    )


# the command loop checks the channel once a second; the rest is scheduling slack on a loaded 2-core CI box
NOTICE_S = 1.0
SLACK_S = 4.0
FAST = dict(server_alive_interval=1, server_alive_count_max=2)


def serving_sshd(sshd, client_pid: int) -> t.List[int]:
    """The fixture's sshd processes that hold the server end of CLIENT_PID's connection to it."""
    return serving_processes(client_pid, sshd.port, descendants(sshd.proc.pid))


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
        wait_for(lambda: exited(master_pid), _pct_ssh.DEAD_DRAIN_S + SLACK_S, "the control master to exit", interval=0.05)
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


def test_a_leaving_master_answers_a_worker_that_connected_before_it_left(sshd, tmp_path):
    """A worker already connected when the master leaves (its connection dead) gets the error reply, never a
    reset: the master counts the connection before the thread that serves it runs. The worker here sends its
    request only after the master began to leave."""
    session = _pct_ssh.DirectSession(settings(sshd, **FAST)).connect()
    session.close()  # the master's connection is dead: it is leaving
    path = str(tmp_path / "m.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    master = pct_ssh_master.Master(session, path, persist=60)
    master.ino = os.stat(path).st_ino
    worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    worker.connect(path)  # in the listen queue, not yet accepted
    leaving = threading.Thread(target=master.shutdown, args=(srv,), daemon=True)
    leaving.start()
    time.sleep(0.5)  # the master has accepted the worker and waits for it
    assert leaving.is_alive(), "the master left while a connected worker had no reply"
    wire.send(worker, {"op": "exec", "command": "true", "has_stdin": False, "timeout": 5, "pty": False})
    worker.settimeout(10)
    reply, dummy_data = wire.recv(worker)
    assert reply["error"]["kind"] == "gone", reply  # nothing ran: safe for the worker to retry
    leaving.join(_pct_ssh.DEAD_DRAIN_S + SLACK_S)
    assert not leaving.is_alive()
    assert not os.path.exists(path)  # unlinked first: new workers start a fresh master
    srv.close()
    worker.close()
