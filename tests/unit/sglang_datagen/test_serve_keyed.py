"""The role's keyed launcher (files/serve_keyed.py): real processes, the real sglang-router, loopback only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness import StandinProcess, free_ports

from tests.support.net import http
from tests.support.paths import ROOT
from tests.support.wait import wait_for

LAUNCHER = ROOT / "roles" / "sglang_datagen" / "files" / "serve_keyed.py"
KEY = "k3y-Zm9vYmFyYmF6cXV4LXRoaXMtaXMtbm90LXJlYWw"

import serve_keyed  # noqa: E402  (the node-side script; tests/conftest.py puts its directory on sys.path)

pytestmark = pytest.mark.processes


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "api-key.env"
    path.write_text(f"SGLANG_DATAGEN_API_KEY={KEY}\n")
    path.chmod(0o600)
    return path


def launcher(key_file: Path, *command: str, router: bool = False, **popen) -> subprocess.Popen:
    argv = [sys.executable, str(LAUNCHER), "--key-file", str(key_file), *(["--router"] if router else []), "--",
            *command]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def tree_cmdlines(root: int) -> list[str]:
    """The argv of ROOT and every process below it, as ps shows them (the test's stand-in worker is given the
    key on its own command line, so the whole machine's listing would find it there)."""
    listing = subprocess.run(["ps", "-eo", "pid=,ppid=,args=", "ww"], capture_output=True, text=True,
                             check=True).stdout
    rows = [line.split(None, 2) for line in listing.splitlines() if line.strip()]
    tree, grew = {root}, True
    while grew:
        below = {int(pid) for pid, ppid, *_rest in rows if int(ppid) in tree}
        grew = not below <= tree
        tree |= below
    return [row[2] if len(row) > 2 else "" for row in rows if int(row[0]) in tree]


def test_redact_replaces_every_occurrence():
    assert serve_keyed.redact(b"a KEY b 'KEY'\n", b"KEY") == b"a <redacted> b '<redacted>'\n"


def test_only_the_router_module_runs_in_process():
    python = "/opt/datagen/venv/bin/python"
    got = serve_keyed.router_child_argv([python, "-m", "sglang_router.launch_router", "--port", "30000"])
    assert got == [python, str(LAUNCHER), "--run-router", "--", "--port", "30000"]
    assert serve_keyed.router_child_argv(["/usr/local/bin/my-router", "--port", "30000"]) is None
    assert serve_keyed.router_child_argv([python, "-m", "sglang.launch_server"]) is None


def test_server_output_reaches_the_journal_with_the_key_redacted_and_its_exit_status(key_file):
    # what SGLang's engine.py logs at start-up, on stdout and stderr, then a failure exit
    script = textwrap.dedent(f"""
        import sys
        print("server_args=ServerArgs(api_key={KEY!r}, port=31000)", flush=True)
        sys.stderr.write("Bearer {KEY} refused\\n")
        sys.stderr.write("no newline at the end {KEY}")
        sys.exit(3)
    """)
    proc = launcher(key_file, sys.executable, "-c", script)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 3
    assert KEY.encode() not in out
    assert out.count(b"<redacted>") == 3, out
    assert b"server_args=ServerArgs(api_key='<redacted>', port=31000)" in out


def test_a_stop_signal_reaches_every_server_process_once(key_file, tmp_path):
    """systemd (KillMode=mixed) signals the launcher only: the server and its own child each get SIGTERM once,
    the launcher waits for them and ends as the server did."""
    seen, ready = tmp_path / "seen", tmp_path / "ready"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        def note(signum, frame):
            with open({str(seen)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}} {{signum}}\\n")
            os._exit(0)
        signal.signal(signal.SIGTERM, note)
        child = os.fork()
        if child == 0:
            while True:
                time.sleep(1)
        open({str(ready)!r}, "w").close()
        os.waitpid(child, 0)
        time.sleep(0.5)
        sys.exit(0)
    """)
    proc = launcher(key_file, sys.executable, "-c", script)
    wait_for(ready.exists, 20, "the server and its child started")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    lines = seen.read_text().splitlines()
    assert len(lines) == 2 and len({line.split()[0] for line in lines}) == 2, lines
    assert all(line.endswith(f" {int(signal.SIGTERM)}") for line in lines)


def test_a_server_killed_by_a_signal_ends_the_launcher_by_the_same_signal(key_file):
    proc = launcher(key_file, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("content", ["", "SGLANG_DATAGEN_API_KEY=\n"])
def test_no_key_is_refused_naming_the_file(tmp_path, content):
    path = tmp_path / "api-key.env"
    path.write_text(content)
    proc = launcher(path, sys.executable, "-c", "print('started')")
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 2
    assert str(path).encode() in out and b"started" not in out


def test_the_real_router_takes_the_key_in_process_never_in_argv(key_file):
    """sglang-router 0.3.2 started as the role's router unit does: clients and its worker list need the key,
    it sends the key to the worker (which requires it), and no process's argv nor its output holds it."""
    with StandinProcess(["--api-key", KEY], model="m") as worker:
        port, metrics = free_ports(2)
        router_url = f"http://127.0.0.1:{port}"
        proc = launcher(key_file, sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                        "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
                        "--policy", "round_robin", "--worker-urls", worker.url, router=True)
        try:
            def listed() -> bool:
                reply = http(router_url + "/workers", key=KEY, timeout=5)
                return reply.status == 200 and any(w["is_healthy"] for w in reply.json()["workers"])

            wait_for(listed, 60, "the router listing the worker healthy")
            assert http(router_url + "/workers", timeout=5).status == 401
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert http(router_url + "/v1/chat/completions", body=chat, timeout=30).status == 401
            assert http(router_url + "/v1/chat/completions", key=KEY, body=chat, timeout=30).status == 200
            argvs = tree_cmdlines(proc.pid)
            assert any("sglang::router" in argv for argv in argvs), argvs  # the router runs below the launcher
            assert not [argv for argv in argvs if KEY in argv], argvs
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                assert KEY.encode() not in fh.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out = proc.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out = proc.communicate(timeout=10)[0]
        assert KEY.encode() not in out


def test_a_custom_router_command_gets_the_key_as_a_flag(key_file, tmp_path):
    """Not the router module: the only way left is --api-key in argv (documented)."""
    args = tmp_path / "args"
    script = f"import sys; open({str(args)!r}, 'w').write(repr(sys.argv[1:]))"
    proc = launcher(key_file, sys.executable, "-c", script, "--port", "1", router=True)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert args.read_text() == repr(["--port", "1", "--api-key", KEY])
