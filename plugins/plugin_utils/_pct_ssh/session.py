# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``DirectSession``: one paramiko SSH connection in this process, watched for a host that went silent."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import typing as t

from . import login, sftp_read
from .command import CHUNK, pump
from .errors import ExecResult, SessionError
from .settings import Settings

TMP_PREFIX = "/tmp/.pct_ssh-"


def _probe(transport: t.Any) -> None:
    """One keepalive that wants an answer (returns when answered, or when the transport dies)."""
    try:
        transport.global_request("keepalive@openssh.com", wait=True)
    except Exception:  # noqa: BLE001 - a probe on a dying transport: the watchdog judges by is_active()
        pass


class DirectSession:
    """A paramiko SSH connection in this process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client: t.Any = None
        self._pool: t.List[t.Any] = []
        self._pool_lock = threading.Lock()
        self._closing = threading.Event()
        self.dead_reason = ""  # why the watchdog closed the transport ("" while alive or closed by us)

    # -- connection ---------------------------------------------------------
    def connect(self) -> DirectSession:
        s = self.settings
        self.client = login.login(s)
        if s.server_alive_interval > 0:
            transport = self.client.get_transport()
            # paramiko's own keepalive keeps NAT and firewall state fresh, but asks for no answer, so it never
            # notices a host that went silent (a frozen sshd, a cut cable): the watchdog does that
            transport.set_keepalive(s.server_alive_interval)
            threading.Thread(target=self._watchdog, args=(transport,), name="pct_ssh-watchdog", daemon=True).start()
        return self

    def _watchdog(self, transport: t.Any) -> None:
        """Close TRANSPORT when the host leaves a keepalive unanswered for interval * count_max seconds.

        Like OpenSSH's ServerAliveInterval: a ``keepalive@openssh.com`` global
        request that wants a reply (sshd answers it, with a failure, which is
        enough); paramiko's wait for the reply is unbounded, so it runs in its
        own thread and this one bounds it. Closing the transport wakes every
        reader of its channels, so each pending request fails at once.
        """
        s = self.settings
        interval = float(s.server_alive_interval)
        grace = interval * max(1, s.server_alive_count_max)
        while not self._closing.wait(interval):
            if not transport.is_active():
                return
            probe = threading.Thread(target=_probe, args=(transport,), name="pct_ssh-probe", daemon=True)
            probe.start()
            probe.join(grace)
            if self._closing.is_set() or not transport.is_active():
                return
            if probe.is_alive():
                self.dead_reason = "%s answered no keepalive for %gs (server_alive_interval=%d, server_alive_count_max=%d)" % (
                    s.host_label(), grace, s.server_alive_interval, s.server_alive_count_max)
                transport.close()
                return

    def alive(self) -> bool:
        tr = self.client.get_transport() if self.client else None
        return bool(tr and tr.is_active())

    def lost_reason(self) -> str:
        """Why the connection is gone, for messages."""
        return self.dead_reason or "the connection to %s was closed (host or network)" % self.settings.host_label()

    def close(self) -> None:
        self._closing.set()
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for sftp in pool:
            sftp.close()
        if self.client is not None:
            self.client.close()
            self.client = None

    def _transport(self) -> t.Any:
        if not self.alive():
            raise SessionError("gone", "the SSH connection to %s is closed" % self.settings.host_label())
        return self.client.get_transport()

    def _open_channel(self, wait: float) -> t.Any:
        """A new session channel; while the server refuses one (sshd MaxSessions), wait up to WAIT seconds."""
        import paramiko

        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            try:
                return self._transport().open_session(timeout=max(1.0, min(deadline - time.monotonic(), 30.0)))
            except SessionError:
                raise
            except (paramiko.ChannelException, paramiko.SSHException) as e:
                # a refusal is a ChannelException, but paramiko hands it to only one of the
                # threads waiting; the others see a bare "Unable to open channel"
                if not self.alive():
                    raise SessionError("gone", "could not open an SSH channel: %s" % e) from None
                if time.monotonic() + delay >= deadline:
                    raise SessionError(
                        "busy",
                        "%s refused another SSH session for %ds (%s): raise MaxSessions in its sshd_config or lower forks"
                        % (self.settings.host_label(), wait, e),
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except Exception as e:  # SSHException/EOFError/socket errors: the connection is gone, nothing ran
                raise SessionError("gone", "could not open an SSH channel: %s" % e) from None

    # -- commands -----------------------------------------------------------
    def exec(
        self,
        command: str,
        stdin: t.Optional[bytes] = None,
        timeout: float = 3600.0,
        pty: bool = False,
        stdin_path: t.Optional[str] = None,
        stdout_path: t.Optional[str] = None,
    ) -> ExecResult:
        """Run COMMAND (host shell text); stdout and stderr read together, all bounded by TIMEOUT.

        STDIN (bytes) or STDIN_PATH (a local file, streamed) feed the command;
        STDOUT_PATH streams stdout to a local file instead of memory.
        """
        chan = self._open_channel(min(timeout, 60.0))
        try:
            with contextlib.ExitStack() as files:
                src = files.enter_context(open(stdin_path, "rb")) if stdin_path else None
                sink = files.enter_context(open(stdout_path, "wb")) if stdout_path else None
                if pty:
                    chan.get_pty(term="vt100", width=0, height=0)
                chan.exec_command(command)
                result = pump(chan, stdin, src, sink, timeout)
            if result is None:
                raise SessionError(
                    "lost",
                    "the SSH connection died while the command ran: %s. The command may have run in part on the host; "
                    "it was not retried" % self.lost_reason(),
                )
            return result
        except SessionError:
            raise
        except Exception as e:  # paramiko on a transport that died between open and exec
            if self.alive():
                raise
            raise SessionError("lost", "the SSH connection died while starting the command: %s (%s: %s)" % (self.lost_reason(), type(e).__name__, e)) from None
        finally:
            chan.close()

    # -- files (SFTP) -------------------------------------------------------
    def _sftp_channel(self) -> t.Any:
        """A new channel running the host's SFTP server; SessionError 'sftp_unavailable' when it has none."""
        chan = self._open_channel(60.0)
        try:
            chan.invoke_subsystem("sftp")
            return chan
        except Exception as e:
            chan.close()
            raise SessionError("sftp_unavailable", "SFTP is not available on %s: %s" % (self.settings.host_label(), e)) from None

    def _sftp(self) -> t.Any:
        """An SFTP client from the idle pool, or a new one.

        Reusing a client saves starting sftp-server on the host for every
        transfer (three per module upload); a client serves one request at a
        time, so parallel tasks open their own and only one is kept idle.
        """
        import paramiko

        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        chan = self._sftp_channel()
        try:
            return paramiko.SFTPClient(chan)
        except Exception as e:
            chan.close()
            raise SessionError("sftp_unavailable", "SFTP is not available on %s: %s" % (self.settings.host_label(), e)) from None

    def _release(self, sftp: t.Any) -> None:
        with self._pool_lock:
            if len(self._pool) < 1 and not sftp.get_channel().closed:  # an idle client holds one of sshd's MaxSessions
                self._pool.append(sftp)
                return
        sftp.close()

    @contextlib.contextmanager
    def _sftp_client(self) -> t.Iterator[t.Any]:
        sftp = self._sftp()
        try:
            yield sftp
        finally:
            self._release(sftp)

    def mkdtemp(self) -> str:
        """A fresh private (0700) directory in the host's /tmp."""
        with self._sftp_client() as sftp:
            last: t.Optional[BaseException] = None
            for _dummy in range(5):
                path = TMP_PREFIX + os.urandom(12).hex()
                try:
                    sftp.mkdir(path, mode=0o700)
                    sftp.chmod(path, 0o700)  # the server applies its umask to mkdir's mode
                    return path
                except (OSError, EOFError) as e:
                    last = e
        raise SessionError("transfer", "cannot create a temporary directory in /tmp on the host: %s" % last)

    def put(self, local: str, remote: str) -> None:
        """Upload LOCAL to REMOTE in blocks; REMOTE must not exist yet (never write through a planted path)."""
        with self._sftp_client() as sftp:
            try:
                with open(local, "rb") as src, sftp.open(remote, "wbx") as dst:
                    dst.set_pipelined(True)
                    while True:
                        block = src.read(CHUNK)
                        if not block:
                            break
                        dst.write(block)
                size = os.path.getsize(local)
                got = sftp.stat(remote).st_size
            except (OSError, EOFError) as e:
                raise SessionError("transfer", "SFTP upload of %s to the host's %s failed: %s" % (local, remote, e)) from None
        if got != size:
            raise SessionError("transfer", "SFTP wrote %s bytes of %s to %s" % (got, size, remote))

    def get(self, remote: str, local: str) -> None:
        """Download REMOTE to LOCAL with GET_DEPTH reads in flight (:class:`sftp_read.Reader`).

        On a channel of its own: a failed download leaves answers in flight, so the channel goes with it.
        """
        chan = self._sftp_channel()
        try:
            reader = sftp_read.Reader(chan)
            size = reader.open(remote)
            with open(local, "wb") as dst:
                written = reader.read_into(size, dst)
            reader.close()
        except (OSError, EOFError, ValueError, struct.error) as e:  # struct.error: a malformed answer
            raise SessionError("transfer", "SFTP download of the host's %s to %s failed: %s" % (remote, local, e or type(e).__name__)) from None
        finally:
            chan.close()
        if written != size:
            raise SessionError("transfer", "SFTP read %s bytes of %s from %s" % (written, size, remote))

    def rmtree(self, path: str) -> None:
        """Remove the one-level temporary directory PATH and its files."""
        if not path.startswith(TMP_PREFIX):
            raise SessionError("config", "refusing to remove %r: not a pct_ssh temporary directory" % path)
        with self._sftp_client() as sftp:
            try:
                for name in sftp.listdir(path):
                    sftp.remove(path + "/" + name)
                sftp.rmdir(path)
            except (OSError, EOFError) as e:
                raise SessionError("transfer", "cannot remove the temporary directory %s on the host: %s" % (path, e)) from None
