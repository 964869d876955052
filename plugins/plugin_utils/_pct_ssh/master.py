# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The control master: one process per (host, port, user, credentials) holding the SSH transport.

Workers send one request per unix-socket connection (``wire`` frames); each runs in its own thread
while the connection's thread sends the worker a heartbeat every few seconds.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
import typing as t

from . import wire
from .errors import SessionError
from .session import DirectSession
from .settings import Settings, heartbeat_period

DEAD_DRAIN_S = 10.0  # after the connection died: how long the master waits for its requests' error replies to go out

Reply = t.Tuple[t.Dict[str, t.Any], t.Sequence[bytes]]


def unlink_if_ours(path: str, ino: int) -> None:
    try:
        if os.stat(path).st_ino == ino:  # never remove a successor's socket
            os.unlink(path)
    except OSError:
        pass


class Master:
    def __init__(self, session: DirectSession, path: str, persist: float) -> None:
        self.session = session
        self.path = path
        self.persist = persist
        self.active = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()
        self.stopping = False
        self.ino = 0
        self.heartbeat = heartbeat_period(session.settings)

    def answer(self, header: t.Dict[str, t.Any], blobs: t.List[bytes]) -> Reply:
        """The reply to one request; a failure becomes an error reply (never kills the master)."""
        try:
            return self.dispatch(header, blobs)
        except SessionError as e:
            if e.kind not in ("gone", "lost") and not self.session.alive():
                e = SessionError("lost", "the SSH connection died during %s: %s (%s)" % (header.get("op"), self.session.lost_reason(), e.msg))
            return {"error": {"kind": e.kind, "msg": e.msg}}, ()
        except Exception as e:  # noqa: BLE001 - report, never kill the master over one request
            if not self.session.alive():
                msg = "the SSH connection died during %s: %s (%s: %s); it may have run in part and was not retried" % (
                    header.get("op"), self.session.lost_reason(), type(e).__name__, e)
                return {"error": {"kind": "lost", "msg": msg}}, ()
            return {"error": {"kind": "master", "msg": "%s: %s" % (type(e).__name__, e)}}, ()

    def accepted(self, conn: socket.socket) -> None:
        """Serve CONN in its own thread, counted as active from now: a master that is leaving waits for it
        (counted inside the thread, it could exit first and reset a worker that is already connected)."""
        with self.lock:
            self.active += 1
        threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(60)
            header, blobs = wire.recv(conn)
            # the request runs in its own thread; this one tells the worker every few seconds that the
            # master is alive, so the worker's bounded reads tell a long command from a frozen master
            outcome: t.List[Reply] = []
            done = threading.Event()

            def work() -> None:
                try:
                    outcome.append(self.answer(header, blobs))
                finally:
                    done.set()

            threading.Thread(target=work, name="pct_ssh-request", daemon=True).start()
            while not done.wait(self.heartbeat):
                wire.send(conn, {"heartbeat": True})
            reply, data = outcome[0]
            wire.send(conn, reply, *data)
        except (OSError, EOFError, ValueError):
            pass  # the worker went away (or sent garbage): nothing to answer
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def dispatch(self, h: t.Dict[str, t.Any], blobs: t.List[bytes]) -> Reply:
        op = h.get("op")
        s = self.session
        if op == "ping":
            if not s.alive():  # dying: a worker starts a fresh master instead of queueing here
                raise SessionError("gone", s.lost_reason())
            return {"ok": True, "pid": os.getpid()}, ()
        if op == "stop":
            self.stopping = True
            unlink_if_ours(self.path, self.ino)  # new clients start a fresh master at once
            return {"ok": True}, ()
        if op == "exec":
            r = s.exec(
                h["command"],
                stdin=blobs[0] if h.get("has_stdin") else None,
                timeout=float(h["timeout"]),
                pty=bool(h["pty"]),
                stdin_path=h.get("stdin_path"),
                stdout_path=h.get("stdout_path"),
            )
            return {"rc": r.rc, "timed_out": r.timed_out, "signalled": r.signalled}, (r.stdout, r.stderr)
        if op == "mkdtemp":
            return {"path": s.mkdtemp()}, ()
        if op == "put":
            s.put(h["local"], h["remote"])
        elif op == "get":
            s.get(h["remote"], h["local"])
        elif op == "rmtree":
            s.rmtree(h["path"])
        else:
            raise SessionError("master", "unknown request %r" % op)
        return {"ok": True}, ()

    def serve(self, srv: socket.socket) -> None:
        srv.settimeout(0.5)
        while not self.stopping:
            if not self.session.alive():
                break  # clients then start a fresh master with a fresh connection
            with self.lock:
                idle = self.active == 0 and time.monotonic() - self.last > self.persist
            if idle:
                break
            try:
                conn, dummy_addr = srv.accept()
            except socket.timeout:
                continue
            self.accepted(conn)
        self.shutdown(srv)

    def shutdown(self, srv: socket.socket) -> None:
        """Leave without dropping a request: unlink first, then serve what is queued."""
        unlink_if_ours(self.path, self.ino)
        srv.settimeout(0.05)
        while True:
            try:
                conn, dummy_addr = srv.accept()
            except (socket.timeout, OSError):
                break
            self.accepted(conn)
        # a running transfer may take long while the connection lives; once it is dead every request
        # fails within a second (its channel is closed), so the master exits promptly
        deadline = time.monotonic() + 24 * 3600
        while time.monotonic() < deadline:
            with self.lock:
                if self.active == 0:
                    return
            if not self.session.alive():
                deadline = min(deadline, time.monotonic() + DEAD_DRAIN_S)
            time.sleep(0.05)


def _report(**fields: t.Any) -> None:
    """The one line the starting worker waits for (client.start_master)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _bind(path: str) -> t.Tuple[t.Optional[socket.socket], int]:
    """A listening socket on PATH, private to this user; else None (reported) and the exit status."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    except OSError as e:
        srv.close()
        if e.errno == errno.EADDRINUSE:
            _report(ok=True, note="another master serves")
            return None, 0
        _report(ok=False, kind="master", msg="cannot bind %s: %s" % (path, e))
        return None, 1
    finally:
        os.umask(old)
    os.chmod(path, 0o600)  # owner only, whatever the umask did (connecting needs write permission)
    srv.listen(64)
    return srv, 0


def serve_main(path: str, persist: float) -> int:
    """The master's program: log in with the settings read from stdin, report, serve PATH until idle."""
    settings = Settings(**json.loads(sys.stdin.readline()))
    session = DirectSession(settings)
    try:
        session.connect()
    except SessionError as e:
        _report(ok=False, kind=e.kind, msg=e.msg)
        return 1
    srv, status = _bind(path)
    if srv is None:
        session.close()
        return status
    ino = os.stat(path).st_ino
    _report(ok=True, pid=os.getpid())
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    master = Master(session, path, persist)
    master.ino = ino
    try:
        master.serve(srv)
    finally:
        unlink_if_ours(path, ino)
        srv.close()
        session.close()
    return 0
