# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SSH sessions to a Proxmox VE host for the ``pct_ssh`` connection plugin.

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. It runs on the controller only. It imports nothing from Ansible or from
the collection, so the same file also runs as a script: the *control master*
(``python _pct_ssh.py --serve``), which keeps one paramiko connection per PVE
host open across tasks, the way OpenSSH's ControlPersist does.

Why a control master: Ansible forks a fresh worker process for every task, so
a connection cached in the plugin dies with the task. The master holds the SSH
transport; a worker talks to it over a private unix socket and pays neither
the SSH handshake nor the paramiko import (about 0.2 s per task together).

Two implementations of one small interface (``exec``, ``mkdtemp``, ``put``,
``get``, ``rmtree``, ``close``): ``DirectSession`` (paramiko, in this process)
and ``MasterClient`` (the same calls, answered by the master). Failures raise
``SessionError`` with a ``kind`` the plugin turns into its own messages.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import typing as t

CHUNK = 1024 * 1024  # file transfer block: bounded memory for any file size
GET_DEPTH = 64  # a download's read requests in flight: 2 MiB ahead of the local writes (SFTP_READ each)
SFTP_READ = 32768  # bytes one SFTP read asks for: what every server answers in full (paramiko's MAX_REQUEST_SIZE)
# use_rsa_sha2_algorithms false: the algorithm names disabled (as OpenSSH spells them; names paramiko does not
# know are ignored by its disabled_algorithms)
RSA_SHA2 = ("rsa-sha2-512", "rsa-sha2-256", "rsa-sha2-512-cert-v01@openssh.com", "rsa-sha2-256-cert-v01@openssh.com")
DEAD_DRAIN_S = 10.0  # after the connection died: how long the master waits for its requests' error replies to go out
PROTOCOL = 2  # part of the control socket's name: a changed plugin never talks to an older master (2: heartbeat frames)
KINDS = (
    "unreachable",  # TCP/banner level: host down, wrong port, DNS
    "auth",  # login refused
    "hostkey_unknown",  # not in known_hosts and not allowed to add it
    "hostkey_mismatch",  # known_hosts has a different key: possible MITM
    "sftp_unavailable",  # no SFTP subsystem on the host: use the cat fallback
    "transfer",  # an SFTP read/write failed
    "master",  # the control master could not be started or reached
    "gone",  # the connection broke before the request ran: safe to retry
    "lost",  # the connection died while the request ran: it may have run in part, never retried
    "busy",  # the server kept refusing another session (sshd MaxSessions)
    "config",  # bad settings
)


class SessionError(Exception):
    """A failure talking to the PVE host; ``kind`` is one of ``KINDS``."""

    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind
        self.msg = msg


@dataclasses.dataclass
class Settings:
    """Everything needed to open the SSH connection (not what runs over it)."""

    host: str
    port: int = 22
    user: t.Optional[str] = None
    password: t.Optional[str] = None
    key_filename: t.Optional[str] = None
    look_for_keys: bool = True
    connect_timeout: float = 10.0
    banner_timeout: float = 30.0
    host_key_checking: bool = True
    host_key_auto_add: bool = False
    record_host_keys: bool = True
    known_hosts_file: str = "~/.ssh/known_hosts"
    lock_file_timeout: float = 60.0
    proxy_command: t.Optional[str] = None
    use_rsa_sha2_algorithms: bool = True
    # OpenSSH's ServerAliveInterval/ServerAliveCountMax: a probe every interval; a host that leaves one
    # unanswered for interval * count_max seconds is dead (see dead_after). 0 turns probing off.
    server_alive_interval: int = 5
    server_alive_count_max: int = 3
    # what the caller does with the login that must not be shared either (how pct is run: become method, path)
    identity_extra: t.Dict[str, t.Any] = dataclasses.field(default_factory=dict)

    def cache_key(self, env: t.Optional[t.Mapping[str, str]] = None) -> str:
        """The name of 'the same connection': everything that authenticates it (secrets only as a digest).

        A shared connection is a logged-in session: whoever reaches it acts as
        its user. So two callers share it only when they would log in with the
        same credentials and the same host key policy: the settings, this
        controller user, the content of the key file (a replaced key at the same
        path is another identity), of the default keys paramiko would try, and
        the agent (when it may be used).
        """
        raw = json.dumps([PROTOCOL, dataclasses.asdict(self), credential_identity(self, env)], sort_keys=True)
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]

    def host_label(self) -> str:
        return "%s@%s:%d" % (self.user or "(default user)", self.host, self.port)


def dead_after(settings: Settings) -> t.Optional[float]:
    """Worst case, in seconds, between a host going silent and its connection being declared dead.

    A probe goes out ``server_alive_interval`` seconds after the last answer and
    may stay unanswered for ``interval * count_max`` seconds: interval * (count_max + 1)
    in all. A host that closes the TCP connection (sshd killed, host rebooted with
    its network up) is noticed at once. None when probing is off.
    """
    if settings.server_alive_interval <= 0:
        return None
    return float(settings.server_alive_interval * (max(1, settings.server_alive_count_max) + 1))


def heartbeat_period(settings: Settings) -> float:
    """How often a control master tells a waiting worker that it is still alive and working."""
    interval = settings.server_alive_interval
    return float(min(5, interval)) if interval > 0 else 5.0


def frame_timeout(settings: Settings) -> float:
    """Longest a worker waits for the next frame (reply or heartbeat) from its control master.

    Several missed heartbeats, so a busy master is never taken for a hung one,
    yet a frozen or vanished master is given up on within seconds.
    """
    return heartbeat_period(settings) * (max(1, settings.server_alive_count_max) + 1) + 5.0


def validate_alive(interval: t.Any, count_max: t.Any) -> t.Tuple[int, int]:
    """Check the server-alive options; SessionError('config') names the option and the fix."""
    try:
        i, c = int(interval), int(count_max)
    except (TypeError, ValueError):
        raise SessionError("config", "server_alive_interval and server_alive_count_max must be integers, got %r and %r" % (interval, count_max)) from None
    if i < 0:
        raise SessionError("config", "server_alive_interval must be >= 0 seconds (0 turns keepalive probes off), got %d" % i)
    if c < 1:
        raise SessionError("config", "server_alive_count_max must be >= 1 (unanswered probes before the host is declared dead), got %d" % c)
    return i, c


PUBLIC_KEY_STARTS = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-", "---- BEGIN SSH2 PUBLIC KEY", "-----BEGIN PUBLIC KEY")


def key_file_problem(path: t.Optional[str]) -> t.Optional[str]:
    """Why the private key file PATH cannot be the login's key (missing, unreadable, a public key), or None.

    paramiko reports these while connecting, as errors that read like a host that cannot be reached."""
    if not path:
        return None
    full = os.path.expanduser(path)
    try:
        with open(full, "rb") as handle:
            head = handle.read(64).lstrip()
    except FileNotFoundError:
        return "ansible_ssh_private_key_file=%s does not exist on the controller" % path
    except IsADirectoryError:
        return "ansible_ssh_private_key_file=%s is a directory, not a key file" % path
    except OSError as exc:
        return "ansible_ssh_private_key_file=%s cannot be read on the controller (%s)" % (path, exc.strerror)
    if head.decode("ascii", "replace").startswith(PUBLIC_KEY_STARTS):
        private = full[:-4] if full.endswith(".pub") else "the file without .pub"
        return "ansible_ssh_private_key_file=%s is a public key; point it at the private key (%s)" % (path, private)
    return None


@dataclasses.dataclass
class ExecResult:
    rc: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    signalled: bool = False  # the server sent no exit status: killed by a signal


# the keys paramiko's look_for_keys tries (paramiko.client.SSHClient._auth)
DEFAULT_KEY_FILES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")


def file_digest(path: str) -> str:
    """sha256 of a file's content; a marker for a missing or unreadable one (then it cannot authenticate)."""
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError as e:
        return "unreadable:%s" % (e.errno,)


def credential_identity(settings: Settings, env: t.Optional[t.Mapping[str, str]] = None) -> t.Dict[str, t.Any]:
    """What authenticates a login with SETTINGS beyond the settings themselves (digests only)."""
    env = os.environ if env is None else env
    ident: t.Dict[str, t.Any] = {"euid": os.geteuid()}
    if settings.key_filename:
        ident["key"] = file_digest(settings.key_filename)
    if settings.look_for_keys:
        home = os.path.expanduser("~")
        ident["default_keys"] = {
            name: file_digest(os.path.join(home, d, name))
            for d in (".ssh", "ssh")
            for name in DEFAULT_KEY_FILES
            if os.path.exists(os.path.join(home, d, name))
        }
    if settings.password is None:  # the agent is only offered without a password (DirectSession.connect)
        ident["agent"] = env.get("SSH_AUTH_SOCK", "")
    return ident


def known_hosts_name(host: str, port: int) -> str:
    """The host name as OpenSSH writes it in known_hosts."""
    return host if port == 22 else "[%s]:%d" % (host, port)


def fingerprint_sha256(key: t.Any) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def _flock_within(handle: t.IO[t.Any], timeout: float, interval: float = 0.05) -> bool:
    """Take an exclusive flock within ``timeout`` seconds; False when another holder keeps it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def _append_known_host(path: str, line: str, timeout: float) -> None:
    """Append one known_hosts line under an exclusive lock (bounded wait)."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        if not _flock_within(lock, timeout):
            raise SessionError("config", "could not lock %s within lock_file_timeout=%ss" % (path, timeout))
        try:
            with open(path, "a") as fh:
                fh.write(line + "\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
        try:
            import paramiko
        except ImportError as e:
            raise SessionError("config", "the pct_ssh connection needs the Python library paramiko: %s" % e) from None

        s = self.settings
        client = paramiko.SSHClient()
        if s.host_key_checking:
            for path in ("/etc/ssh/ssh_known_hosts", s.known_hosts_file):
                path = os.path.expanduser(path)
                if os.path.exists(path):
                    try:
                        client.load_system_host_keys(path)
                    except (OSError, paramiko.hostkeys.InvalidHostKey) as e:
                        raise SessionError("config", "cannot read known_hosts file %s: %s" % (path, e)) from None

        outer = self

        class _Policy(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client, hostname, key):  # noqa: N805 (paramiko's signature)
                outer._missing_host_key(client, hostname, key)

        client.set_missing_host_key_policy(_Policy())
        kwargs: t.Dict[str, t.Any] = {}
        if s.proxy_command:
            cmd = s.proxy_command.replace("%h", s.host).replace("%p", str(s.port)).replace("%r", s.user or "")
            kwargs["sock"] = paramiko.ProxyCommand(cmd)
        if not s.use_rsa_sha2_algorithms:
            kwargs["disabled_algorithms"] = {"pubkeys": list(RSA_SHA2), "keys": list(RSA_SHA2)}
        key_filename = os.path.expanduser(s.key_filename) if s.key_filename else None
        try:
            client.connect(
                s.host,
                port=s.port,
                username=s.user,
                password=s.password,
                passphrase=s.password if key_filename else None,
                key_filename=key_filename,
                look_for_keys=s.look_for_keys,
                allow_agent=s.password is None,
                timeout=s.connect_timeout,
                banner_timeout=s.banner_timeout,
                auth_timeout=s.connect_timeout,
                **kwargs,
            )
        except SessionError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise SessionError(
                "hostkey_mismatch",
                "the host key of %s changed: expected %s, got %s. This can be an attack; if the host was reinstalled, "
                "remove its old line from %s"
                % (known_hosts_name(s.host, s.port), fingerprint_sha256(e.expected_key), fingerprint_sha256(e.key), s.known_hosts_file),
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise SessionError("auth", "login as %s failed: %s" % (s.user or "(default user)", e or type(e).__name__)) from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            client.close()
            raise SessionError("unreachable", "%s: %s" % (type(e).__name__, e)) from None
        self.client = client
        if s.server_alive_interval > 0:
            transport = client.get_transport()
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

    def _missing_host_key(self, client: t.Any, hostname: str, key: t.Any) -> None:
        s = self.settings
        name = known_hosts_name(s.host, s.port)
        fp = fingerprint_sha256(key)
        if s.host_key_checking and not s.host_key_auto_add:
            raise SessionError(
                "hostkey_unknown",
                "the host key of %s (%s %s) is not in %s. Check the fingerprint on the host "
                "(ssh-keygen -lf /etc/ssh/ssh_host_%s_key.pub), then add it, e.g. `ssh-keyscan -p %d %s >> %s`, "
                "or set ansible_pct_ssh_host_key_auto_add=true to accept and record it"
                % (name, key.get_name(), fp, s.known_hosts_file, key.get_name().replace("ssh-", ""), s.port, s.host, s.known_hosts_file),
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        if s.host_key_checking and s.record_host_keys:
            _append_known_host(s.known_hosts_file, "%s %s %s" % (name, key.get_name(), key.get_base64()), s.lock_file_timeout)

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
        src: t.Optional[t.BinaryIO] = open(stdin_path, "rb") if stdin_path else None
        sink: t.Optional[t.BinaryIO] = open(stdout_path, "wb") if stdout_path else None
        try:
            if pty:
                chan.get_pty(term="vt100", width=0, height=0)
            chan.exec_command(command)
            result = _pump(chan, stdin, src, sink, timeout)
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
            if src:
                src.close()
            if sink:
                sink.close()

    # -- files (SFTP) -------------------------------------------------------
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
        chan = self._open_channel(60.0)
        try:
            chan.invoke_subsystem("sftp")
            return paramiko.SFTPClient(chan)
        except Exception as e:
            chan.close()
            raise SessionError("sftp_unavailable", "SFTP is not available on %s: %s" % (self.settings.host_label(), e)) from None

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

    def _release(self, sftp: t.Any) -> None:
        with self._pool_lock:
            if len(self._pool) < 1 and not sftp.sock.closed:  # an idle client holds one of sshd's MaxSessions
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
                path = "/tmp/.pct_ssh-%s" % os.urandom(12).hex()
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
        """Download REMOTE to LOCAL with GET_DEPTH read requests in flight (:func:`_pipelined_read`)."""
        with self._sftp_client() as sftp:
            try:
                size = sftp.stat(remote).st_size
                with sftp.open(remote, "rb") as src, open(local, "wb") as dst:
                    written = _pipelined_read(sftp, src.handle, size, dst)
            except (OSError, EOFError) as e:
                raise SessionError("transfer", "SFTP download of the host's %s to %s failed: %s" % (remote, local, e)) from None
        if written != size:
            raise SessionError("transfer", "SFTP read %s bytes of %s from %s" % (written, size, remote))

    def rmtree(self, path: str) -> None:
        """Remove the one-level temporary directory PATH and its files."""
        if not path.startswith("/tmp/.pct_ssh-"):
            raise SessionError("config", "refusing to remove %r: not a pct_ssh temporary directory" % path)
        with self._sftp_client() as sftp:
            try:
                for name in sftp.listdir(path):
                    sftp.remove(path + "/" + name)
                sftp.rmdir(path)
            except (OSError, EOFError) as e:
                raise SessionError("transfer", "cannot remove the temporary directory %s on the host: %s" % (path, e)) from None


def read_requests(size: int, block: int = SFTP_READ) -> t.Iterator[t.Tuple[int, int]]:
    """(offset, length) of the reads that cover SIZE bytes in order, BLOCK bytes each (none for 0)."""
    return ((offset, min(block, size - offset)) for offset in range(0, size, block))


class _Answers:
    """Where paramiko's SFTP client hands the answer to a request sent with this as its file object."""

    def __init__(self) -> None:
        self.by_request: t.Dict[int, t.Tuple[int, t.Any]] = {}

    def _async_response(self, kind: int, msg: t.Any, num: int) -> None:
        self.by_request[num] = (kind, msg)


def _pipelined_read(sftp: t.Any, handle: bytes, size: int, dst: t.BinaryIO, depth: int = GET_DEPTH) -> int:
    """Read SIZE bytes of the open remote HANDLE into DST with DEPTH requests in flight; the bytes written.

    Not paramiko's prefetch: it calls itself done whenever every read request sent so far is answered,
    though its thread has more to send. A reader that catches up with a starved thread (a loaded
    machine) then reads the rest one request at a time, while every answer to what the thread still
    sends piles up unread: the whole file in memory (seen in CI: 264 MiB for 200 MiB). This sends the
    requests itself, from this thread, never more than DEPTH ahead, through the same client calls
    paramiko's prefetch makes (``_async_request``, ``_read_response``, ``_convert_status``).
    """
    from paramiko.sftp import CMD_DATA, CMD_READ, CMD_STATUS, int64

    answers = _Answers()
    todo = read_requests(size)
    retry: t.Deque[t.Tuple[int, int]] = collections.deque()  # what a short answer left out
    in_flight: t.Deque[t.Tuple[int, int, int]] = collections.deque()  # (request, offset, length), oldest first
    written = position = 0
    while True:
        while len(in_flight) < depth:
            nxt = retry.popleft() if retry else next(todo, None)
            if nxt is None:
                break
            num = sftp._async_request(answers, CMD_READ, handle, int64(nxt[0]), int(nxt[1]))
            in_flight.append((num, nxt[0], nxt[1]))
        if not in_flight:
            return written
        num, offset, length = in_flight.popleft()
        while num not in answers.by_request:
            sftp._read_response()
        kind, msg = answers.by_request.pop(num)
        if kind == CMD_STATUS:
            sftp._convert_status(msg)  # EOFError (the file is shorter than its size) or OSError
            raise OSError("the server answered a read with no data")
        if kind != CMD_DATA:
            raise OSError("the server answered a read with SFTP message type %d" % kind)
        data = msg.get_string()
        if not data:
            raise OSError("the server answered a read at offset %d with no data" % offset)
        if offset != position:  # only after a short answer: a seek flushes DST's buffer
            dst.seek(offset)
        dst.write(data)
        position = offset + len(data)
        written += len(data)
        if len(data) < length:  # a server may answer short: ask again for the rest
            retry.append((offset + len(data), length - len(data)))


def _connection_lost(chan: t.Any) -> bool:
    """The channel was torn down with its transport (not closed by the command ending)."""
    transport = chan.get_transport()
    return not (transport is not None and transport.is_active())


def _probe(transport: t.Any) -> None:
    """One keepalive that wants an answer (returns when answered, or when the transport dies)."""
    try:
        transport.global_request("keepalive@openssh.com", wait=True)
    except Exception:  # noqa: BLE001 - a probe on a dying transport: the watchdog judges by is_active()
        pass


def _pump(
    chan: t.Any, stdin: t.Optional[bytes], src: t.Optional[t.BinaryIO], sink: t.Optional[t.BinaryIO], timeout: float
) -> t.Optional[ExecResult]:
    """Feed stdin and drain stdout+stderr together until exit or TIMEOUT; None when the connection died meanwhile.

    Reading both streams in one loop is what keeps a chatty stderr from
    stalling stdout (and the reverse); writing stdin in the same loop keeps a
    command that answers before it has read all its input from deadlocking.
    A transport that dies (closed by the host, or by the keepalive watchdog)
    closes the channel without an EOF: that is checked on every turn, so the
    wait ends within a second of it instead of at TIMEOUT.
    """
    deadline = time.monotonic() + timeout
    out: t.List[bytes] = []
    err: t.List[bytes] = []
    pending = memoryview(stdin) if stdin else memoryview(b"")
    feeding = stdin is not None or src is not None
    if stdin is not None and not stdin and src is None:
        chan.shutdown_write()
        feeding = False
    elif stdin is None and src is None:
        chan.shutdown_write()  # no stdin: the command must see EOF, not wait
        feeding = False
    fd = chan.fileno()
    while True:
        progressed = False
        while chan.recv_ready():
            block = chan.recv(CHUNK)
            if sink is not None:
                sink.write(block)
            else:
                out.append(block)
            progressed = True
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(CHUNK))
            progressed = True
        if feeding and chan.send_ready():
            if not pending and src is not None:
                pending = memoryview(src.read(CHUNK))
                if not pending:
                    src = None
            if pending:
                try:
                    n = chan.send(pending[:65536])
                except OSError:  # the command exited without reading all its input: its rc tells
                    n, pending, src = 0, memoryview(b""), None
                pending = pending[n:]
                progressed = True
            if not pending and src is None:
                if not chan.closed:
                    chan.shutdown_write()
                feeding = False
        if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
            # data is complete; the exit status follows (or never comes if killed)
            chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), 5.0)))
            if not chan.exit_status_ready() and _connection_lost(chan):
                return None
            break
        if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready() and _connection_lost(chan):
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ExecResult(-1, b"".join(out), b"".join(err), timed_out=True)
        if not progressed:
            wait = min(remaining, 0.005 if feeding else 1.0)
            select.select([fd], [], [], wait)
    rc = chan.exit_status if chan.exit_status_ready() else -1
    return ExecResult(rc, b"".join(out), b"".join(err), signalled=rc == -1)


# ---------------------------------------------------------------------------
# control master: one process per (host, port, user, credentials) holding the
# SSH transport; clients send one request per unix-socket connection.
# ---------------------------------------------------------------------------


def _send(sock: socket.socket, header: t.Dict[str, t.Any], *blobs: bytes) -> None:
    header = dict(header, blobs=[len(b) for b in blobs])
    raw = json.dumps(header).encode("utf-8")
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    for b in blobs:
        sock.sendall(b)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        block = sock.recv(min(n, CHUNK))
        if not block:
            raise EOFError("peer closed the socket")
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def _recv(sock: socket.socket) -> t.Tuple[t.Dict[str, t.Any], t.List[bytes]]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    header = json.loads(_recv_exact(sock, n).decode("utf-8"))
    return header, [_recv_exact(sock, size) for size in header.get("blobs", [])]


def control_path(settings: Settings, directory: str) -> str:
    return os.path.join(os.path.expanduser(directory), settings.cache_key() + ".sock")


def private_dir(directory: str) -> str:
    """Create DIRECTORY (mode 0700) or check that it is this user's own and private; return its path.

    The sockets in it are as good as the logins behind them, so the directory
    must be a real directory owned by the user running Ansible and closed to
    everyone else; a foreign or symlinked one is refused rather than used.
    """
    directory = os.path.expanduser(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    hint = "set ansible_pct_ssh_control_path_dir (control_path_dir) to a private directory of your own"
    if not stat.S_ISDIR(st.st_mode):
        raise SessionError("config", "control_path_dir %s is not a directory (a symlink?): %s" % (directory, hint))
    if st.st_uid != os.geteuid():
        raise SessionError("config", "control_path_dir %s belongs to uid %d, not to this user (uid %d): %s" % (directory, st.st_uid, os.geteuid(), hint))
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


class MasterClient:
    """The session interface, answered by a control master over a unix socket.

    Every read on the socket is bounded by FRAME_TIMEOUT: while a request runs
    the master sends a heartbeat frame every few seconds, so a master that
    froze or vanished is given up on within seconds, not at the command's
    own timeout (an hour by default).
    """

    def __init__(self, path: str, request_timeout_margin: float = 30.0, frame_timeout: float = 30.0) -> None:
        self.path = path
        self.margin = request_timeout_margin
        self.frame_timeout = frame_timeout

    def _call(self, header: t.Dict[str, t.Any], *blobs: bytes, timeout: float = 60.0) -> t.Tuple[t.Dict[str, t.Any], t.List[bytes]]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        op = header.get("op")
        try:
            sock.settimeout(min(timeout + self.margin, self.frame_timeout))
            try:
                sock.connect(self.path)
            except OSError as e:
                raise SessionError("gone", "control master %s is not answering: %s" % (self.path, e)) from None
            deadline = time.monotonic() + timeout + self.margin  # the master bounds the request itself; this is the backstop
            try:
                _send(sock, header, *blobs)
                while True:
                    sock.settimeout(max(0.1, min(deadline - time.monotonic(), self.frame_timeout)))
                    reply, data = _recv(sock)
                    if "heartbeat" not in reply:
                        break
                    if time.monotonic() >= deadline:
                        raise socket.timeout("no reply within %gs" % (timeout + self.margin))
            except socket.timeout:
                raise SessionError(
                    "master",
                    "the control master %s sent nothing for %gs during %s (frozen or overloaded); the request may have run in "
                    "part and was not retried" % (self.path, self.frame_timeout, op),
                ) from None
            except (OSError, EOFError, ValueError) as e:
                raise SessionError(
                    "master",
                    "the control master %s went away during %s (%s); the request may have run in part and was not retried"
                    % (self.path, op, e or type(e).__name__),
                ) from None
        finally:
            sock.close()
        if "error" in reply:
            raise SessionError(reply["error"]["kind"], reply["error"]["msg"])
        return reply, data

    def ping(self) -> bool:
        try:
            self._call({"op": "ping"}, timeout=5)
            return True
        except SessionError:
            return False

    def exec(self, command, stdin=None, timeout=3600.0, pty=False, stdin_path=None, stdout_path=None) -> ExecResult:
        header = {
            "op": "exec",
            "command": command,
            "has_stdin": stdin is not None,
            "timeout": timeout,
            "pty": pty,
            "stdin_path": stdin_path,
            "stdout_path": stdout_path,
        }
        reply, data = self._call(header, stdin or b"", timeout=timeout)
        return ExecResult(reply["rc"], data[0], data[1], timed_out=reply["timed_out"], signalled=reply["signalled"])

    def mkdtemp(self) -> str:
        return self._call({"op": "mkdtemp"})[0]["path"]

    def put(self, local: str, remote: str) -> None:
        self._call({"op": "put", "local": os.path.abspath(local), "remote": remote}, timeout=24 * 3600)

    def get(self, remote: str, local: str) -> None:
        self._call({"op": "get", "remote": remote, "local": os.path.abspath(local)}, timeout=24 * 3600)

    def rmtree(self, path: str) -> None:
        self._call({"op": "rmtree", "path": path})

    def stop(self) -> None:
        try:
            self._call({"op": "stop"}, timeout=5)
        except SessionError:
            pass

    def close(self) -> None:
        """Nothing to do: the master outlives the task on purpose."""


def open_master(settings: Settings, directory: str, persist: int, start_timeout: float) -> MasterClient:
    """Reach the control master for SETTINGS, starting it if none answers.

    A lock file serialises the start, so parallel workers for the same host
    share one master instead of racing to create several.
    """
    directory = private_dir(directory)
    path = control_path(settings, directory)
    client = MasterClient(path, frame_timeout=frame_timeout(settings))
    if client.ping():
        return client
    with open(path + ".lock", "a") as lock:
        deadline = time.monotonic() + start_timeout  # one bound for the lock wait and the start
        if not _flock_within(lock, start_timeout, interval=0.02):
            raise SessionError("master", "timed out waiting for another worker starting the control master %s" % path)
        try:
            if client.ping():
                return client
            try:
                os.unlink(path)  # a stale socket of a master that is gone
            except FileNotFoundError:
                pass
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", path, str(persist)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the playbook must not kill a master in use by others
                close_fds=True,
            )
            if proc.stdin is None or proc.stdout is None:  # for the type checker: both are PIPEs
                raise SessionError("master", "could not start the control master")
            proc.stdin.write(json.dumps(dataclasses.asdict(settings)).encode("utf-8") + b"\n")
            proc.stdin.close()
            line = b""
            while not line.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
                    proc.kill()
                    raise SessionError("master", "the control master did not report within %ss" % start_timeout)
                block = os.read(proc.stdout.fileno(), 65536)
                if not block:
                    break
                line += block
            proc.stdout.close()
            try:
                reply = json.loads(line.decode("utf-8"))
            except ValueError:
                proc.wait(5)
                raise SessionError("master", "the control master exited with %s before reporting" % proc.returncode) from None
            if not reply.get("ok"):
                proc.wait(5)
                raise SessionError(reply["kind"], reply["msg"])
            return client
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class _Master:
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

    def answer(self, header: t.Dict[str, t.Any], blobs: t.List[bytes]) -> t.Tuple[t.Dict[str, t.Any], t.Sequence[bytes]]:
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
            header, blobs = _recv(conn)
            # the request runs in its own thread; this one tells the worker every few seconds that the
            # master is alive, so the worker's bounded reads tell a long command from a frozen master
            outcome: t.List[t.Tuple[t.Dict[str, t.Any], t.Sequence[bytes]]] = []
            done = threading.Event()

            def work() -> None:
                try:
                    outcome.append(self.answer(header, blobs))
                finally:
                    done.set()

            threading.Thread(target=work, name="pct_ssh-request", daemon=True).start()
            while not done.wait(self.heartbeat):
                _send(conn, {"heartbeat": True})
            reply, data = outcome[0]
            _send(conn, reply, *data)
        except (OSError, EOFError, ValueError):
            pass  # the worker went away (or sent garbage): nothing to answer
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def dispatch(self, h: t.Dict[str, t.Any], blobs: t.List[bytes]) -> t.Tuple[t.Dict[str, t.Any], t.Sequence[bytes]]:
        op = h.get("op")
        s = self.session
        if op == "ping":
            if not s.alive():  # dying: a worker starts a fresh master instead of queueing here
                raise SessionError("gone", s.lost_reason())
            return {"ok": True, "pid": os.getpid()}, ()
        if op == "stop":
            self.stopping = True
            _unlink_if_ours(self.path, self.ino)  # new clients start a fresh master at once
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
            return {"ok": True}, ()
        if op == "get":
            s.get(h["remote"], h["local"])
            return {"ok": True}, ()
        if op == "rmtree":
            s.rmtree(h["path"])
            return {"ok": True}, ()
        raise SessionError("master", "unknown request %r" % op)

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
        _unlink_if_ours(self.path, self.ino)
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


def _unlink_if_ours(path: str, ino: int) -> None:
    try:
        if os.stat(path).st_ino == ino:  # never remove a successor's socket
            os.unlink(path)
    except OSError:
        pass


def _serve_main(path: str, persist: float) -> int:
    settings = Settings(**json.loads(sys.stdin.readline()))
    session = DirectSession(settings)
    try:
        session.connect()
    except SessionError as e:
        sys.stdout.write(json.dumps({"ok": False, "kind": e.kind, "msg": e.msg}) + "\n")
        return 1
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            sys.stdout.write(json.dumps({"ok": False, "kind": "master", "msg": "cannot bind %s: %s" % (path, e)}) + "\n")
            return 1
        sys.stdout.write(json.dumps({"ok": True, "note": "another master serves"}) + "\n")
        return 0
    finally:
        os.umask(old)
    os.chmod(path, 0o600)  # owner only, whatever the umask did (connecting needs write permission)
    srv.listen(64)
    ino = os.stat(path).st_ino
    sys.stdout.write(json.dumps({"ok": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    master = _Master(session, path, persist)
    master.ino = ino
    try:
        master.serve(srv)
    finally:
        _unlink_if_ours(path, ino)
        srv.close()
        session.close()
    return 0


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--serve":
    sys.exit(_serve_main(sys.argv[2], float(sys.argv[3])))
