"""Start an SGLang worker or the sglang-router with the API key out of every process's argv and out of the journal.

Run by the role's worker and router units when the workers require a key (standard library only)::

    serve_keyed.py --key-file HOME/api-key.env -- python -m sglang.launch_server ... --config HOME/sglang-secrets.yaml
    serve_keyed.py --key-file HOME/api-key.env --router -- python -m sglang_router.launch_router ...

Why a launcher at all:

- **argv.** ``ps`` shows every process's argv to every user of the node. A worker reads the key from the 0600
  SGLang config file the role writes (``--config``, merged into its arguments inside the process:
  ``sglang/srt/utils/server_args_config_parser.py``). sglang-router 0.3.2 has no config file and no
  environment variable for it, only ``--api-key``; but ``python -m sglang_router.launch_router`` is
  ``launch_router(parse_router_args(argv))`` (``sglang_router/launch_router.py``), so the router is started
  by that same call here, with the key set on its arguments after parsing. The key reaches it through a
  pipe on its stdin: not in argv, not in its environment. A router command that is not that module can
  only be given ``--api-key`` in argv (the role's docs say so).
- **The journal.** SGLang logs ``server_args=...`` with ``api_key`` in clear at start-up
  (``sglang/srt/entrypoints/engine.py``: only the watermark fields are redacted). Both units' output goes
  through this launcher, which writes every line with the key replaced by ``<redacted>``.

Signals: the units use ``KillMode=mixed``, so systemd signals this launcher only; it passes SIGTERM, SIGINT
and SIGHUP on to the server's whole process group once (what ``KillMode=control-group`` did, without the
second SIGTERM that makes uvicorn give up its graceful shutdown), keeps copying output until the server
exits, and ends as the server ended: same exit status, or killed by the same signal, so ``Restart=on-failure``
and ``systemctl stop`` see the server itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
from typing import IO, List, Optional, Sequence

REDACTED = b"<redacted>"
ROUTER_MODULE = ["-m", "sglang_router.launch_router"]
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def read_api_key(path: str) -> str:
    """The key in the role's ``api-key.env`` (``NAME=KEY``), or in a file that holds only the key."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    return text.split("=", 1)[1].strip() if text and "=" in text.splitlines()[0] else text


def redact(line: bytes, key: bytes) -> bytes:
    return line.replace(key, REDACTED)


def router_child_argv(argv: Sequence[str]) -> Optional[List[str]]:
    """ARGV as a run of this file's in-process router start (``--run-router``), or None when ARGV is not
    ``PYTHON -m sglang_router.launch_router ...`` (a custom router command)."""
    if len(argv) < 3 or list(argv[1:3]) != ROUTER_MODULE:
        return None
    return [argv[0], os.path.abspath(__file__), "--run-router", "--", *argv[3:]]


def copy_redacted(source: IO[bytes], sink: IO[bytes], key: bytes) -> None:
    """Every line of SOURCE to SINK with the key replaced, until SOURCE ends (whole lines: a key is never
    split across two writes)."""
    for line in iter(source.readline, b""):
        sink.write(redact(line, key))
        sink.flush()


def run_router(args: Sequence[str]) -> None:
    """In the router's own process: the key from stdin, then what ``python -m sglang_router.launch_router`` does."""
    key = sys.stdin.readline().strip()
    # stdin back to nothing: the router never reads it, and the pipe must not stay open
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    from sglang_router.launch_router import launch_router, parse_router_args  # the venv's router, on the node

    launch_router(dataclasses.replace(parse_router_args(list(args)), api_key=key))


def launch(argv: List[str], key: str, router: bool) -> int:
    """Start ARGV with output copied through the redaction; return how it ended (a negative signal number
    when a signal killed it, as ``subprocess`` says)."""
    stdin_key = None
    if router:
        in_process = router_child_argv(argv)
        if in_process is None:
            # a custom router command takes the key only as a flag: it shows in ps (documented)
            argv = [*argv, "--api-key", key]
        else:
            argv, stdin_key = in_process, key
    child = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin_key else None, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    if stdin_key is not None and child.stdin is not None:
        child.stdin.write(stdin_key.encode() + b"\n")
        child.stdin.close()

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    assert child.stdout is not None
    copy_redacted(child.stdout, sys.stdout.buffer, key.encode())
    return child.wait()


def end_as(status: int) -> None:
    """Exit as the server did: its exit status, or killed by the signal that killed it."""
    if status >= 0:
        sys.exit(status)
    if -status in FORWARDED:  # its handler here passes it on; the others (SIGKILL...) act as they are
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    sys.exit(128 - status)  # not reached for a deadly signal


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--key-file", help="the role's api-key.env (mode 0600)")
    parser.add_argument("--router", action="store_true", help="COMMAND is the router: give it the key")
    parser.add_argument("--run-router", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.run_router:
        run_router(command)
        return
    if not args.key_file or not command:
        parser.error("--key-file and a command after -- are required")
    key = read_api_key(args.key_file)
    if not key:
        parser.error(f"{args.key_file} holds no key; run the role again to write it")
    end_as(launch(command, key, args.router))


if __name__ == "__main__":
    main()
