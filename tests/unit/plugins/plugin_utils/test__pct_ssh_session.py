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
import threading
import time
import tracemalloc

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh


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
    assert list(_pct_ssh.read_requests(size, 8)) == reads


def _starved_prefetch(monkeypatch):
    """paramiko's prefetch thread sends 4 read requests, then loses the CPU for 0.3 s (a loaded machine),
    then sends the rest: the reader answers those 4 meanwhile, and paramiko calls the prefetch done."""
    import paramiko.sftp_file

    original = paramiko.sftp_file.SFTPFile._prefetch_thread

    def starved(self, chunks, max_concurrent_requests):
        def paced():
            for n, chunk in enumerate(chunks):
                if n == 4:
                    time.sleep(0.3)
                yield chunk
        return original(self, paced(), max_concurrent_requests)
    monkeypatch.setattr(paramiko.sftp_file.SFTPFile, "_prefetch_thread", starved)


def _peak_mib(transfer) -> float:
    """The peak of Python's allocations (every thread's) while TRANSFER runs, in MiB."""
    tracemalloc.start()
    try:
        transfer()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_download_holds_its_requests_in_flight_when_paramiko_would_end_its_prefetch_early(session, tmp_path, monkeypatch):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(48 * 2**20 + 5))
    _starved_prefetch(monkeypatch)
    d = session.mkdtemp()
    try:
        session.put(str(src), d + "/file")

        def whole_file_prefetch():  # what get did before: one prefetch of the whole file
            with session._sftp_client() as sftp, sftp.open(d + "/file", "rb") as fh:
                fh.prefetch(fh.stat().st_size)
                while fh.read(_pct_ssh.CHUNK):
                    pass
                # its starved thread still sends reads: let it finish before the connection closes under it
                for thread in threading.enumerate():
                    if thread.name.endswith("(starved)"):
                        thread.join(30)
        # the injected race is real: a whole-file prefetch ends up holding most of the file
        assert _peak_mib(whole_file_prefetch) > 32
        out = tmp_path / "out.bin"
        peak = _peak_mib(lambda: session.get(d + "/file", str(out)))
        assert peak < 8, "get held %.1f MiB" % peak  # 2 MiB in flight, 1 MiB blocks
        assert out.read_bytes() == src.read_bytes()
    finally:
        session.rmtree(d)


def test_rmtree_refuses_foreign_paths(session):
    with pytest.raises(_pct_ssh.SessionError, match="refusing"):
        session.rmtree("/tmp")


def test_no_sftp_subsystem_is_its_own_kind(sshd_nosftp):
    s = _pct_ssh.DirectSession(settings(sshd_nosftp)).connect()
    try:
        with pytest.raises(_pct_ssh.SessionError) as exc:
            s.mkdtemp()
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
    import threading

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


class _ShortAnswers:
    """An SFTP client's request/answer calls over a bytes CONTENT, answering every read with at most MOST
    bytes, in order, and EOF past the end: a server that answers short, which OpenSSH's sftp-server never does."""

    def __init__(self, content: bytes, most: int) -> None:
        self.content, self.most = content, most
        self.queue: list = []
        self.number = 0

    def _async_request(self, fileobj, kind, handle, offset, length):
        import paramiko
        from paramiko.sftp import CMD_DATA, CMD_READ, CMD_STATUS, SFTP_EOF

        assert kind == CMD_READ and handle == b"h"
        msg = paramiko.Message()
        data = self.content[int(offset):int(offset) + min(length, self.most)]
        if data:
            msg.add_string(data)
        else:
            msg.add_int(SFTP_EOF)
            msg.add_string("End of file")
        msg.rewind()
        self.number += 1
        self.queue.append((fileobj, CMD_DATA if data else CMD_STATUS, msg, self.number))
        return self.number

    def _read_response(self):
        fileobj, kind, msg, num = self.queue.pop(0)
        fileobj._async_response(kind, msg, num)

    def _convert_status(self, msg):
        import paramiko

        paramiko.SFTPClient._convert_status(self, msg)


def test_a_short_answer_is_asked_again_for_the_rest_and_eof_early_is_an_error(tmp_path):
    content = os.urandom(200_000)
    out = tmp_path / "out.bin"
    with open(out, "wb") as dst:
        assert _pct_ssh._pipelined_read(_ShortAnswers(content, 10_000), b"h", len(content), dst, depth=4) == len(content)
    assert out.read_bytes() == content
    with open(out, "wb") as dst, pytest.raises(EOFError):  # the file is shorter than the size it was read for
        _pct_ssh._pipelined_read(_ShortAnswers(content, 40_000), b"h", len(content) + 5, dst)


def test_a_file_shorter_when_read_than_when_sized_is_a_transfer_error(session, tmp_path, monkeypatch):
    """The file shrank between the size check and the reads (it is being rewritten on the host): never a
    short copy taken for the whole file."""
    import paramiko

    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * 2**20 + 7))  # two windows and a bit
    d = session.mkdtemp()
    try:
        session.put(str(src), d + "/file")
        real_stat = paramiko.SFTPClient.stat

        def stat_before_it_shrank(self, path):
            attrs = real_stat(self, path)
            attrs.st_size += 2**20  # what it held when sized
            return attrs
        monkeypatch.setattr(paramiko.SFTPClient, "stat", stat_before_it_shrank)
        with pytest.raises(_pct_ssh.SessionError) as exc:
            session.get(d + "/file", str(tmp_path / "out.bin"))
        assert exc.value.kind == "transfer"
        monkeypatch.undo()
        session.get(d + "/file", str(tmp_path / "out.bin"))  # and unchanged, the same file downloads whole
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
    finally:
        session.rmtree(d)
