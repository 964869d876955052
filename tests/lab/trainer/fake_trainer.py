# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A torchrun-like fake trainer: the job ``training_stop`` has to stop, in the lab and in tests.

Standard library only (it is copied into the lab container and runs on its python3).

Shape, as torchrun's: one *launcher* process that spawns ``--nproc`` *workers*,
each in its own session (``start_new_session=True``, so Ctrl-C in a terminal
reaches only the launcher, and a worker loses its parent link when the launcher
dies). Rank 0 prints ``step 682 | 21.5 Ktok/s | loss 1.234`` every
``--step-seconds`` and writes the checkpoints. Each worker holds fake GPU
``rank`` through ``tests/lab/fakegpu/fakegpu.py`` unless ``--no-gpu``.

Checkpoints (``--ckpt-dir``): ``ckpt-step000682.bin`` is written as
``ckpt-step000682.bin.tmp``, fsynced, then renamed; afterwards ``latest`` is
replaced atomically with the file's name. A checkpoint is a JSON header line,
a payload, and a ``sha256:`` trailer over both, so :func:`verify_checkpoint`
proves it intact. A process killed mid-save leaves only a ``.tmp`` file and an
intact ``latest``.

Behaviours (``--behaviour``):

graceful
    SIGINT/SIGTERM to a worker: rank 0 saves a checkpoint, every worker exits 0.
    SIGINT/SIGTERM to the launcher: SIGTERM to every worker, wait up to
    ``--teardown-seconds`` (torchrun: 30), SIGKILL the rest with torchrun's
    "Unable to shutdown process ..." line, exit. A worker that
    dies on its own makes the launcher tear the others down and exit 1.
slow_checkpoint
    As graceful, but the shutdown save takes ``--checkpoint-seconds`` (default
    20, by the clock however loaded the machine) and the ``.tmp`` file keeps
    growing while it runs.
stubborn
    Workers ignore SIGINT and SIGTERM (as if blocked in an NCCL collective) and
    keep stepping; the launcher forwards SIGTERM and then waits for them forever.
    Only SIGKILL ends it.
orphans
    The launcher exits on SIGINT/SIGTERM without touching its workers; they are
    reparented and train on (they still stop gracefully on SIGINT/SIGTERM).
respawn
    A supervising launcher: it ignores SIGINT (logged), restarts any worker that
    dies (one line per restart in ``CKPT_DIR/restarts.log``), and stops
    restarting and tears down like graceful only on SIGTERM.

With ``GPUOPS_LAB_SIGNAL_AUDIT=DIR`` in the environment (the lab sets it) the launcher and every
worker record each signal they receive in ``DIR/launcher.PID.jsonl`` / ``DIR/worker-N.PID.jsonl``
(``signal_audit.py``), so a test compares what each process got with what the stop report says.

Lines the launcher and workers print start with ``[launcher]`` / ``[rank N]``
except the step lines, which look like the real ones.

Resuming (the way back, as a real trainer's ``--resume-from``/``--data`` do): ``--resume-from PATH``
verifies that checkpoint (a torn or corrupt one ends the launcher with exit status 2 before any worker
starts, as ``torch.load`` raising would) and starts at its step + 1; ``--data PATH`` must exist (a file
or a directory, else exit status 2: the job that dies at start) and rank 0 prints ``data PATH``.

CLI::

    fake_trainer.py --behaviour {graceful,slow_checkpoint,stubborn,orphans,respawn}
                    --nproc 8 --ckpt-dir DIR [--data PATH] [--resume-from CKPT] [--step-start 682] [--step-seconds 1]
                    [--checkpoint-seconds S] [--ckpt-every N] [--teardown-seconds 30]
                    [--gpu-mib MIB] [--no-gpu]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time

from signal_audit import SignalAudit  # next to this file (a script's own directory is on its path)

BEHAVIOURS = ("graceful", "slow_checkpoint", "stubborn", "orphans", "respawn")
HERE = os.path.dirname(os.path.abspath(__file__))
CKPT_PAYLOAD = 256 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="graceful")
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--data", default=None, help="the training set (a file or a directory); must exist")
    parser.add_argument("--resume-from", default=None, help="a checkpoint to resume from (its step + 1)")
    parser.add_argument("--step-start", type=int, default=682)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint-seconds", type=float, default=None,
                        help="how long the shutdown save takes (slow_checkpoint: 20, else 0)")
    parser.add_argument("--ckpt-every", type=int, default=0, help="also save every N steps (0: only on shutdown)")
    parser.add_argument("--teardown-seconds", type=float, default=30.0, help="launcher's wait for workers (torchrun: 30)")
    parser.add_argument("--gpu-mib", type=int, default=90000, help="fake GPU memory each worker holds")
    parser.add_argument("--no-gpu", action="store_true", help="do not hold fake GPUs (host-side tests)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.checkpoint_seconds is None:
        args.checkpoint_seconds = 20.0 if args.behaviour == "slow_checkpoint" else 0.0
    if args.data is not None and not os.path.exists(args.data):
        parser.exit(2, "fake_trainer: --data %s: no such file or directory\n" % args.data)
    if args.resume_from is not None:
        try:
            args.step_start = verify_checkpoint(args.resume_from) + 1
        except (OSError, ValueError) as exc:
            parser.exit(2, "fake_trainer: --resume-from: cannot load %s: %s\n" % (args.resume_from, exc))
    return args


# ---------------------------------------------------------------- checkpoints

def checkpoint_name(step: int) -> str:
    return "ckpt-step%06d.bin" % step


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(ckpt_dir: str, step: int, seconds: float = 0.0) -> str:
    """Save atomically; with ``seconds`` the ``.tmp`` file grows steadily for that long."""
    os.makedirs(ckpt_dir, exist_ok=True)
    final = os.path.join(ckpt_dir, checkpoint_name(step))
    tmp = final + ".tmp"
    digest = hashlib.sha256()
    chunks = max(1, int(seconds / 0.1)) if seconds > 0 else 1
    block = bytes((step + i) % 251 for i in range(CKPT_PAYLOAD // chunks))
    with open(tmp, "wb") as handle:
        header = json.dumps({"step": step, "pid": os.getpid(), "time": time.time()}).encode() + b"\n"
        handle.write(header)
        digest.update(header)
        started = time.monotonic()
        for chunk in range(chunks):
            handle.write(block)
            digest.update(block)
            handle.flush()
            # paced against one clock: a sleep that overruns (a loaded or CPU-throttled machine)
            # shortens the next, so the save takes ``seconds``, not chunks x the scheduler's delay
            ahead = started + seconds * (chunk + 1) / chunks - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        handle.write(b"\nsha256:" + digest.hexdigest().encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, final)
    latest_tmp = os.path.join(ckpt_dir, "latest.tmp")
    with open(latest_tmp, "w", encoding="utf-8") as handle:
        handle.write(os.path.basename(final) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(latest_tmp, os.path.join(ckpt_dir, "latest"))
    _fsync_dir(ckpt_dir)
    return final


def checkpoint_header(path: str) -> dict:
    """The JSON line a save starts with: its step, the writer's pid and the wall time it began."""
    with open(path, "rb") as handle:
        return json.loads(handle.readline())


def verify_checkpoint(path: str) -> int:
    """The step of an intact checkpoint; ValueError when torn or corrupt."""
    with open(path, "rb") as handle:
        data = handle.read()
    body, sep, trailer = data.rstrip(b"\n").rpartition(b"\nsha256:")
    if not sep:
        raise ValueError("%s: no sha256 trailer (torn write)" % path)
    if hashlib.sha256(body).hexdigest().encode() != trailer:
        raise ValueError("%s: checksum mismatch" % path)
    return int(checkpoint_header(path)["step"])


def latest_checkpoint(ckpt_dir: str) -> tuple[str, int] | None:
    """(path, step) of the checkpoint ``latest`` names, verified; None when there is none."""
    try:
        with open(os.path.join(ckpt_dir, "latest"), encoding="utf-8") as handle:
            name = handle.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(ckpt_dir, name)
    return path, verify_checkpoint(path)


# ---------------------------------------------------------------- signals

class Wakeup:
    """Signals wake a select() at once (no polling latency): handlers record, the loop acts."""

    def __init__(self) -> None:
        self.read_fd, write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self.received: list[int] = []

    def handler(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def wait(self, seconds: float) -> None:
        if seconds > 0:
            select.select([self.read_fd], [], [], seconds)
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass

    def take(self) -> list[int]:
        got, self.received = self.received, []
        return got


def say(who: str, text: str) -> None:
    sys.stdout.write("[%s] %s\n" % (who, text))
    sys.stdout.flush()


# ---------------------------------------------------------------- worker

def hold_gpu(rank: int, mib: int) -> object:
    """Hold fake GPU ``rank`` for the life of this process (see tests/lab/fakegpu/)."""
    # loaded by path: found next to the trainer, in the tree or in the lab's /opt/lab
    for candidate in (os.path.join(HERE, "..", "fakegpu", "fakegpu.py"), "/opt/lab/fakegpu/fakegpu.py"):
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("fakegpu", candidate)
            fakegpu = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(fakegpu)
            return fakegpu.hold(rank, mib)
    raise SystemExit("fake_trainer: no fakegpu.py next to the trainer or in /opt/lab/fakegpu")


def worker(args: argparse.Namespace) -> int:
    who = "rank %d" % args.rank
    wake = Wakeup()
    audit = SignalAudit("worker-%d" % args.rank)
    catch = (signal.SIGINT, signal.SIGTERM)
    for signum in catch:
        if args.behaviour == "stubborn":
            audit.handle(signum, signal.SIG_IGN)
        else:
            audit.handle(signum, wake.handler)
    audit.install()
    gpu = None if args.no_gpu else hold_gpu(args.rank, args.gpu_mib)
    step = args.step_start
    say(who, "pid %d up (session %d)" % (os.getpid(), os.getsid(0)))
    if args.rank == 0 and args.data:
        say(who, "data %s" % args.data)
    if args.rank == 0 and args.resume_from:
        say(who, "resumed from %s at step %d" % (args.resume_from, args.step_start))
    next_at = time.monotonic() + args.step_seconds
    while True:
        wake.wait(next_at - time.monotonic())
        got = wake.take()
        if got:
            say(who, "got %s: shutting down" % signal.Signals(got[0]).name)
            if args.rank == 0:
                say(who, "saving checkpoint at step %d" % step)
                path = write_checkpoint(args.ckpt_dir, step, args.checkpoint_seconds)
                say(who, "saved %s" % path)
            del gpu
            return 0
        if time.monotonic() >= next_at:
            next_at += args.step_seconds
            if args.rank == 0:
                sys.stdout.write("step %d | 21.5 Ktok/s | loss %.3f\n" % (step, 2.0 / (1 + step / 1000.0)))
                sys.stdout.flush()
                if args.ckpt_every and step % args.ckpt_every == 0:
                    write_checkpoint(args.ckpt_dir, step)
            step += 1


# ---------------------------------------------------------------- launcher

def spawn_worker(args: argparse.Namespace, argv: list[str], rank: int) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(rank)] + argv
    # torchrun starts each worker in its own session: a terminal's Ctrl-C never reaches them
    return subprocess.Popen(cmd, start_new_session=True)


def teardown(workers: dict[int, subprocess.Popen], seconds: float | None) -> None:
    """torchrun's shutdown: SIGTERM every worker, wait ``seconds`` (None: forever), SIGKILL the rest."""
    for proc in workers.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = None if seconds is None else time.monotonic() + seconds
    while any(proc.poll() is None for proc in workers.values()):
        if deadline is not None and time.monotonic() >= deadline:
            for proc in workers.values():
                if proc.poll() is None:
                    # torch/distributed/elastic/multiprocessing/api.py, SubprocessContext._close
                    say("launcher", "Unable to shutdown process %d via SIGTERM, forcefully exiting via SIGKILL"
                        % proc.pid)
                    proc.kill()
            break
        time.sleep(0.05)
    for proc in workers.values():
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def launcher(args: argparse.Namespace, argv: list[str]) -> int:
    who = "launcher"
    os.makedirs(args.ckpt_dir, exist_ok=True)
    wake = Wakeup()
    audit = SignalAudit("launcher")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        audit.handle(signum, wake.handler)
    audit.install()
    say(who, "pid %d behaviour %s nproc %d" % (os.getpid(), args.behaviour, args.nproc))
    workers = {rank: spawn_worker(args, argv, rank) for rank in range(args.nproc)}
    restarts_log = os.path.join(args.ckpt_dir, "restarts.log")
    while True:
        wake.wait(1.0)
        stop = [s for s in wake.take() if s != signal.SIGCHLD]
        if stop:
            name = signal.Signals(stop[0]).name
            if args.behaviour == "orphans":
                say(who, "got %s: exiting, workers left running" % name)
                return 0
            if args.behaviour == "respawn" and signal.SIGTERM not in stop:
                say(who, "got %s: ignored (supervisor restarts workers)" % name)
            else:
                forever = args.behaviour == "stubborn"
                say(who, "got %s: stopping workers (wait %s)" % (name, "forever" if forever else args.teardown_seconds))
                if forever:
                    # stubborn: the signals that follow are received but change nothing
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        audit.handle(signum, signal.SIG_IGN)
                teardown(workers, None if forever else args.teardown_seconds)
                say(who, "all workers gone")
                return 0
        for rank, proc in list(workers.items()):
            if proc.poll() is None:
                continue
            say(who, "worker rank %d (pid %d) exited with %s" % (rank, proc.pid, proc.returncode))
            if args.behaviour == "respawn":
                if any(s == signal.SIGTERM for s in wake.received):
                    break  # a stop arrived meanwhile: never restart after it
                workers[rank] = spawn_worker(args, argv, rank)
                with open(restarts_log, "a", encoding="utf-8") as handle:
                    handle.write("%f rank %d pid %d -> %d\n" % (time.time(), rank, proc.pid, workers[rank].pid))
                say(who, "restarted rank %d as pid %d" % (rank, workers[rank].pid))
            else:
                del workers[rank]
                say(who, "a worker failed: tearing the group down")
                teardown(workers, args.teardown_seconds)
                return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return launcher(args, argv)


if __name__ == "__main__":
    sys.exit(main())
