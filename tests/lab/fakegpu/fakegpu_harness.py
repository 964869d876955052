# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Test helpers around the fake GPUs: a private state dir, its driver daemon, real holder processes.

Used by the host-side tests and the benchmark; everything it starts is ended
by PID in ``close()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import fakegpu  # next to this file: on sys.path as the script directory, or via tests/support/paths.py

HERE = os.path.dirname(os.path.abspath(__file__))
FAKEGPU = os.path.join(HERE, "fakegpu.py")
NVIDIA_SMI = os.path.join(HERE, "nvidia-smi")



class FakeGpus:
    """A fakegpu state dir under ``base`` with its driver daemon; spawns and reaps holder processes."""

    def __init__(self, base: str, release_delay: float = 0.5, count: int = 8, driver: bool = True) -> None:
        self.dir = os.path.join(base, "fakegpu")
        self.env = dict(os.environ, FAKEGPU_DIR=self.dir)
        fakegpu.init(self.dir, count=count, release_delay=release_delay)
        self.procs: list[subprocess.Popen] = []
        self.driver = None
        if driver:
            self.driver = subprocess.Popen([sys.executable, FAKEGPU, "driver"], env=self.env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(self.driver)
            for _attempt in range(500):
                if fakegpu.driver_pid(self.dir) == self.driver.pid:
                    break
                time.sleep(0.01)

    @property
    def device_glob(self) -> str:
        return os.path.join(self.dir, "dev", "nvidia*")

    def config(self, **changes) -> dict:
        return fakegpu.set_config(self.dir, **changes)

    def hold(self, gpus: list[int], mib: int = 80000, argv0: str | None = None, prefix: list[str] | None = None,
             preexec=None) -> subprocess.Popen:
        """A real process holding ``gpus``; returns once the allocation is registered."""
        exe = argv0 or sys.executable
        cmd = list(prefix or []) + [exe, FAKEGPU, "hold", "--mib", str(mib)]
        for gpu in gpus:
            cmd += ["--gpu", str(gpu)]
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=preexec)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if not line.startswith("holding"):
            raise RuntimeError("holder did not start: %r %r" % (line, proc.stderr.read()))
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> float:
        """Kill and reap a holder; returns the wall time just after it was reaped."""
        proc.send_signal(sig)
        proc.wait(timeout=10)
        return time.time()

    def used(self) -> dict[int, int]:
        return fakegpu.used_mib(fakegpu.load_config(self.dir), fakegpu.allocations(self.dir))

    def smi(self, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(prefix or []) + [NVIDIA_SMI, *args], env=self.env, capture_output=True,
                              text=True, timeout=60, check=False)

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in fakegpu.read_events(self.dir) if kind is None or e["event"] == kind]

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


def module_args_file(path: str, **args) -> str:
    with open(path, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    return path
