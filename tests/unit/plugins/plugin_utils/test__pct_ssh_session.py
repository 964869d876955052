"""The SSH session layer of pct_ssh against a real throwaway sshd (no pct involved).

Covers what must hold before any container is involved: stdout/stderr apart,
no stall with both streams busy, stdin fed while reading, the timeout bound,
a signal reported as such, host key policy, login and reachability errors,
SFTP transfers, and the shared control master.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import struct
import threading
import tracemalloc

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._pct_ssh import sftp_read

pytestmark = pytest.mark.processes


def settings(server, **kw) -> _pct_ssh.Settings:
    base = dict(
        host="127.0.0.1",
        port=server.port,
        user="root",
        key_filename=server.key,
        look_for_keys=False,
        known_hosts_file=server.known_hosts,
        connect_timeout=5,
    )
    base.update(kw)
    return _pct_ssh.Settings(**base)


@pytest.fixture(scope="module")
def session(sshd):
    s = _pct_ssh.DirectSession(settings(sshd)).connect()
    yield s
    s.close()


def test_stdout_and_stderr_apart_with_rc(session):
    r = session.exec("printf 'out \\303\\251\\n'; printf 'err\\n' >&2; exit 3")
    assert (r.rc, r.stdout, r.stderr) == (3, "out \u00e9\n".encode(), b"err\n")
    assert not r.timed_out and not r.signalled


def test_busy_stderr_cannot_stall_stdout(session):
    # 4 MiB on each stream, interleaved: larger than any SSH window, so a
    # reader that drained one stream first would deadlock here
    cmd = "head -c 4194304 /dev/zero | tr '\\0' e >&2 & head -c 4194304 /dev/zero | tr '\\0' o; wait"
    r = session.exec(cmd, timeout=60)
    assert r.rc == 0
    assert len(r.stdout) == 4194304 and set(r.stdout) == {ord("o")}
    assert len(r.stderr) == 4194304 and set(r.stderr) == {ord("e")}


def test_stdin_is_fed_while_output_is_read(session):
    data = os.urandom(3 * 1024 * 1024)
    r = session.exec("cat", stdin=data, timeout=60)
    assert r.rc == 0 and r.stdout == data


def test_command_that_ignores_its_input_still_reports(session):
    # like a missing interpreter under pipelining: exits before reading the module
    r = session.exec("echo gone >&2; exit 7", stdin=os.urandom(8 * 1024 * 1024), timeout=60)
    assert (r.rc, r.stderr) == (7, b"gone\n")


def test_no_stdin_means_eof(session):
    r = session.exec("cat; echo done", timeout=10)
    assert r.rc == 0 and r.stdout == b"done\n"


def test_timeout_bounds_a_hanging_command(session, tmp_path):
    r = session.exec("echo started; exec sleep 30", timeout=1)
    assert r.timed_out
    assert r.stdout == b"started\n"


def test_signal_is_reported_not_hidden(session):
    r = session.exec("kill -9 $$", timeout=10)
    assert r.signalled and r.rc == -1


def test_streams_files_both_ways(session, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(5 * 1024 * 1024 + 7))
    dst = tmp_path / "dst.bin"
    r = session.exec("cat > %s" % dst, stdin_path=str(src), timeout=60)
    assert r.rc == 0 and dst.read_bytes() == src.read_bytes()
    back = tmp_path / "back.bin"
    r = session.exec("cat %s" % dst, stdout_path=str(back), timeout=60)
    assert r.rc == 0 and r.stdout == b"" and back.read_bytes() == src.read_bytes()


def test_sftp_roundtrip_in_private_tmpdir(session, tmp_path):
    src = tmp_path / "\u00e9t\u00e9 'x'.bin"
    src.write_bytes(os.urandom(2 * 1024 * 1024 + 1))
    d = session.mkdtemp()
    try:
        assert d.startswith("/tmp/.pct_ssh-")
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
        session.put(str(src), d + "/file")
        assert hashlib.sha256(open(d + "/file", "rb").read()).digest() == hashlib.sha256(src.read_bytes()).digest()
        out = tmp_path / "out.bin"
        session.get(d + "/file", str(out))
        assert out.read_bytes() == src.read_bytes()
        with pytest.raises(_pct_ssh.SessionError) as exc:
            session.put(str(src), d + "/file")  # exclusive create: never write through an existing path
        assert exc.value.kind == "transfer"
    finally:
        session.rmtree(d)
    assert not os.path.exists(d)


@pytest.mark.parametrize(("size", "reads"), [
    (0, []),
    (1, [(0, 1)]),
    (16, [(0, 8), (8, 8)]),
    (17, [(0, 8), (8, 8), (16, 1)]),
])
def test_read_requests_cover_the_file_in_order(size, reads):
    assert list(sftp_read.read_requests(size, 8)) == reads


def _peak_mib(transfer) -> float:
    """The peak of Python's allocations (every thread's) while TRANSFER runs, in MiB."""
    tracemalloc.start()
    try:
        transfer()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_download_holds_a_bounded_part_of_the_file_in_memory(session, tmp_path):
    """Whatever the machine's load: paramiko's whole-file prefetch, which get replaced, could end up holding
    most of a file (CI: 264 MiB for 200 MiB) when its sending thread was starved."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(48 * 2**20 + 5))
    d = session.mkdtemp()
    try:
        session.put(str(src), d + "/file")
        out = tmp_path / "out.bin"
        peak = _peak_mib(lambda: session.get(d + "/file", str(out)))
        assert peak < 8, "get held %.1f MiB" % peak  # 2 MiB of reads in flight
        assert out.read_bytes() == src.read_bytes()
    finally:
        session.rmtree(d)


def test_rmtree_refuses_foreign_paths(session):
    with pytest.raises(_pct_ssh.SessionError, match="refusing"):
        session.rmtree("/tmp")


@pytest.mark.parametrize("transfer", ["mkdtemp", "get"])
def test_no_sftp_subsystem_is_its_own_kind(sshd_nosftp, tmp_path, transfer):
    """Both ways to SFTP (paramiko's client, and the download's own reads) say so: the plugin falls back to cat."""
    s = _pct_ssh.DirectSession(settings(sshd_nosftp)).connect()
    try:
        with pytest.raises(_pct_ssh.SessionError) as exc:
            s.mkdtemp() if transfer == "mkdtemp" else s.get("/etc/hostname", str(tmp_path / "out"))
        assert exc.value.kind == "sftp_unavailable"
    finally:
        s.close()


def test_unknown_host_key_rejected_by_default(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.DirectSession(settings(sshd, known_hosts_file=str(empty))).connect()
    assert exc.value.kind == "hostkey_unknown"
    assert "SHA256:" in exc.value.msg and "host_key_auto_add" in exc.value.msg
    assert empty.read_text() == ""


def test_auto_add_records_the_key(sshd, tmp_path):
    kh = tmp_path / "sub" / "known_hosts"
    s = _pct_ssh.DirectSession(settings(sshd, known_hosts_file=str(kh), host_key_auto_add=True)).connect()
    s.close()
    line = kh.read_text().split()
    assert line[0] == "[127.0.0.1]:%d" % sshd.port
    assert line[1:] == open(sshd.known_hosts).read().split()[1:]
    # and the recorded key is now trusted without auto-add
    _pct_ssh.DirectSession(settings(sshd, known_hosts_file=str(kh))).connect().close()


def test_changed_host_key_is_a_mismatch(sshd, tmp_path):
    import paramiko

    other = paramiko.Ed25519Key.from_private_key_file(sshd.key)  # any other ed25519 key
    kh = tmp_path / "known_hosts"
    kh.write_text("[127.0.0.1]:%d ssh-ed25519 %s\n" % (sshd.port, other.get_base64()))
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.DirectSession(settings(sshd, known_hosts_file=str(kh), host_key_auto_add=True)).connect()
    assert exc.value.kind == "hostkey_mismatch"


def test_wrong_key_is_an_auth_failure(sshd, tmp_path):
    import paramiko

    wrong = tmp_path / "wrong"
    paramiko.Ed25519Key.from_private_key_file(sshd.key)  # proves the format; generate a different one
    os.system("ssh-keygen -q -t ed25519 -N '' -f %s" % wrong)
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.DirectSession(settings(sshd, key_filename=str(wrong))).connect()
    assert exc.value.kind == "auth"


def test_closed_port_is_unreachable(sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.DirectSession(settings(sshd, port=port)).connect()
    assert exc.value.kind == "unreachable"


def test_control_master_is_shared_and_stoppable(sshd, tmp_path):
    cp = str(tmp_path / "cp")
    st = settings(sshd)
    a = _pct_ssh.open_master(st, cp, persist=30, start_timeout=30)
    b = _pct_ssh.open_master(st, cp, persist=30, start_timeout=30)
    assert a.path == b.path
    assert stat.S_IMODE(os.stat(cp).st_mode) == 0o700
    pid_a = a._call({"op": "ping"})[0]["pid"]
    assert b._call({"op": "ping"})[0]["pid"] == pid_a
    r = b.exec("printf o; printf e >&2; exit 4", stdin=b"")
    assert (r.rc, r.stdout, r.stderr) == (4, b"o", b"e")
    data = os.urandom(1024 * 1024)
    assert b.exec("cat", stdin=data).stdout == data
    src = tmp_path / "f"
    src.write_bytes(data)
    d = b.mkdtemp()
    b.put(str(src), d + "/file")
    b.get(d + "/file", str(tmp_path / "g"))
    b.rmtree(d)
    assert (tmp_path / "g").read_bytes() == data
    b.stop()
    # the master is gone: a fresh one starts on demand
    c = _pct_ssh.open_master(st, cp, persist=1, start_timeout=30)
    assert c._call({"op": "ping"})[0]["pid"] != pid_a
    c.stop()


def test_control_master_reports_login_failure(sshd, tmp_path):
    wrong = tmp_path / "wrong"
    os.system("ssh-keygen -q -t ed25519 -N '' -f %s" % wrong)
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.open_master(settings(sshd, key_filename=str(wrong)), str(tmp_path / "cp"), persist=5, start_timeout=30)
    assert exc.value.kind == "auth"


def test_parallel_requests_wait_for_a_free_session(sshd_two_sessions):
    """More parallel tasks than sshd's MaxSessions queue up instead of failing."""
    s = _pct_ssh.DirectSession(settings(sshd_two_sessions)).connect()
    results = []

    def one(i):
        results.append(s.exec("sleep 0.3; echo %d" % i, timeout=60))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    s.close()
    assert sorted(int(r.stdout) for r in results) == list(range(6))
    assert all(r.rc == 0 for r in results)


def _master_pid(client) -> int:
    return client._call({"op": "ping"})[0]["pid"]


def _login_user(client) -> str:
    """The user the master's SSH connection is logged in as, asked of the server."""
    return client.exec("id -un").stdout.decode().strip()


def test_control_master_is_keyed_by_identity(sshd, tmp_path):
    """Another key, a replaced key at the same path, another pct become method or agent: never the same master."""
    other = tmp_path / "other_key"
    os.system("ssh-keygen -q -t ed25519 -N '' -f %s" % other)
    with open(os.path.join(sshd.dir, "authorized_keys"), "a") as fh:
        fh.write((tmp_path / "other_key.pub").read_text())
    key_copy = tmp_path / "key_at_one_path"
    key_copy.write_bytes(open(sshd.key, "rb").read())
    key_copy.chmod(0o600)
    cp = str(tmp_path / "cp")
    started = []
    try:
        a = _pct_ssh.open_master(settings(sshd, key_filename=str(key_copy)), cp, persist=30, start_timeout=30)
        started.append(a)
        assert _pct_ssh.open_master(settings(sshd, key_filename=str(key_copy)), cp, persist=30, start_timeout=30).path == a.path
        b = _pct_ssh.open_master(settings(sshd, key_filename=str(other)), cp, persist=30, start_timeout=30)
        started.append(b)
        assert b.path != a.path and _master_pid(b) != _master_pid(a)
        # the same path, another key inside: another identity
        key_copy.write_bytes(other.read_bytes())
        c = _pct_ssh.open_master(settings(sshd, key_filename=str(key_copy)), cp, persist=30, start_timeout=30)
        started.append(c)
        assert c.path not in (a.path, b.path)
        d = _pct_ssh.open_master(
            settings(sshd, key_filename=str(key_copy), identity_extra={"proxmox_become_method": "doas"}), cp, persist=30, start_timeout=30
        )
        started.append(d)
        assert d.path not in (a.path, b.path, c.path)
        assert len({_master_pid(x) for x in started}) == 4
        assert all(_login_user(x) == "root" for x in started)
    finally:
        for x in started:
            x.stop()
    s = settings(sshd)
    assert s.cache_key(env={"SSH_AUTH_SOCK": "/run/user/1/agent"}) != s.cache_key(env={"SSH_AUTH_SOCK": "/run/user/2/agent"})
    with_password = settings(sshd, password="x")  # the agent is not offered with a password: not part of the identity
    assert with_password.cache_key(env={"SSH_AUTH_SOCK": "/a"}) == with_password.cache_key(env={"SSH_AUTH_SOCK": "/b"})
    assert with_password.cache_key() != settings(sshd, password="y").cache_key()


def test_control_socket_and_directory_are_private(sshd, tmp_path):
    cp = tmp_path / "cp"
    cp.mkdir(mode=0o755)
    cp.chmod(0o755)
    m = _pct_ssh.open_master(settings(sshd), str(cp), persist=30, start_timeout=30)
    try:
        assert stat.S_IMODE(os.stat(cp).st_mode) == 0o700
        st = os.lstat(m.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    finally:
        m.stop()
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.open_master(settings(sshd), str(foreign), persist=5, start_timeout=30)
    assert exc.value.kind == "config" and "belongs to uid 65534" in exc.value.msg and "control_path_dir" in exc.value.msg
    link = tmp_path / "link"
    link.symlink_to(cp)
    with pytest.raises(_pct_ssh.SessionError) as exc:
        _pct_ssh.open_master(settings(sshd), str(link), persist=5, start_timeout=30)
    assert "not a directory" in exc.value.msg


class _ShortSftpServer:
    """An SFTP version 3 server for one file of CONTENT, on one end of a socket pair, that claims the file holds
    SIZE bytes and answers every read with at most MOST bytes, and EOF past the end: a server that answers short,
    which OpenSSH's sftp-server never does. Written with struct alone, apart from the code under test."""

    def __init__(self, content: bytes, size: int, most: int) -> None:
        self.content, self.size, self.most = content, size, most
        self.client, self.server = socket.socketpair()
        self.reads = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            block = self.server.recv(n - len(data))
            if not block:
                raise EOFError
            data += block
        return data

    def reply(self, kind: int, body: bytes) -> None:
        self.server.sendall(struct.pack(">IB", len(body) + 1, kind) + body)

    def serve(self) -> None:
        try:
            while True:
                (length,) = struct.unpack(">I", self.recv_exact(4))
                self.answer(self.recv_exact(length))
        except (EOFError, OSError):
            self.server.close()

    def answer(self, raw: bytes) -> None:
        kind, rid = raw[0], raw[1:5]
        if kind == 1:  # INIT
            self.reply(2, struct.pack(">I", 3))
        elif kind == 3:  # OPEN
            self.reply(102, rid + struct.pack(">I", 1) + b"h")
        elif kind == 8:  # FSTAT: the size flag, then the size
            self.reply(105, rid + struct.pack(">IQ", 1, self.size))
        elif kind == 5:  # READ: handle, offset, length
            offset, length = struct.unpack(">QI", raw[10:22])
            data = self.content[offset:offset + min(length, self.most)]
            self.reads += 1
            if data:
                self.reply(103, rid + struct.pack(">I", len(data)) + data)
            else:
                self.reply(101, rid + struct.pack(">II", 1, 11) + b"End of file" + struct.pack(">I", 0))
        elif kind == 4:  # CLOSE
            self.reply(101, rid + struct.pack(">II", 0, 2) + b"OK" + struct.pack(">I", 0))


def _download(server: _ShortSftpServer, dst, depth: int = sftp_read.GET_DEPTH) -> int:
    reader = sftp_read.Reader(server.client)
    try:
        written = reader.read_into(reader.open("/f"), dst, depth=depth)
        reader.close()
        return written
    finally:
        server.client.close()


def test_a_short_answer_is_asked_again_for_the_rest(tmp_path):
    content = os.urandom(200_000)
    server = _ShortSftpServer(content, len(content), most=10_000)
    out = tmp_path / "out.bin"
    with open(out, "wb") as dst:
        assert _download(server, dst, depth=4) == len(content)
    assert out.read_bytes() == content
    assert server.reads > len(content) // sftp_read.SFTP_READ + 1  # the short answers were asked again


def test_an_end_of_file_before_the_size_is_an_error(tmp_path):
    """The file shrank between being sized and being read (rewritten on the host): never a short copy taken
    for the whole file."""
    content = os.urandom(200_000)
    server = _ShortSftpServer(content, len(content) + 5, most=40_000)
    with open(tmp_path / "out.bin", "wb") as dst, pytest.raises(EOFError):
        _download(server, dst)


def test_a_file_shorter_when_read_than_when_sized_is_a_transfer_error(session, tmp_path, monkeypatch):
    """On a real server: get reports the short read as a transfer error, and downloads the unchanged file whole."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * 2**20 + 7))
    d = session.mkdtemp()
    try:
        session.put(str(src), d + "/file")
        real_open = sftp_read.Reader.open

        def sized_before_it_shrank(self, path):
            return real_open(self, path) + 2**20  # what it held when sized
        monkeypatch.setattr(sftp_read.Reader, "open", sized_before_it_shrank)
        with pytest.raises(_pct_ssh.SessionError) as exc:
            session.get(d + "/file", str(tmp_path / "out.bin"))
        assert exc.value.kind == "transfer"
        monkeypatch.undo()
        session.get(d + "/file", str(tmp_path / "out.bin"))
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    finally:
        session.rmtree(d)
