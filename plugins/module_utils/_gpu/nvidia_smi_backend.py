# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The ``nvidia-smi`` backend of ``gpu_free_wait``: finds and runs ``nvidia-smi`` (bounded), samples the GPUs.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets). The NVML backend and the choice between the two are in ``_gpu.nvml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.model import (
    GpuError,
    GpuInfo,
    GpuProcess,
    GpuTimeout,
    Sample,
)
from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.nvidia_smi import (
    apps_query_argv,
    check_nvidia_smi,
    gpu_query_argv,
    parse_apps_csv,
    parse_gpu_csv,
)


def resolve_nvidia_smi(path: str) -> str:
    """An executable path for ``nvidia_smi_path`` (a bare name is looked up on PATH)."""
    if "/" not in path:
        found = shutil.which(path) or shutil.which(path, path="/usr/bin:/usr/local/bin:/usr/sbin:/bin")
        if not found:
            raise GpuError("nvidia-smi not found on PATH (%s): install the NVIDIA driver utilities, "
                           "or set nvidia_smi_path" % os.environ.get("PATH", ""))
        return found
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise GpuError("nvidia_smi_path %s is not an executable file" % path)
    return path


Runner = t.Callable[[t.Sequence[str], float], t.Tuple[int, str, str]]


def hung_msg(program: str, timeout: float) -> str:
    return "%s did not answer within %g s (hung driver or lost GPU?)" % (program, timeout)


def no_process_list(exc: GpuError) -> tuple[None, str]:
    """The process list is advisory: (None, why); but a call that proves the driver hung raises, as the memory
    query's would."""
    if isinstance(exc, GpuTimeout) and exc.proves_hang:
        raise exc
    return None, "no process list: %s" % exc


def run_command(argv: t.Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run with ``LC_ALL=C`` (numbers and messages as parsed), bounded by ``timeout``."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise GpuTimeout(hung_msg(argv[0], timeout), timeout) from exc
    except OSError as exc:
        raise GpuError("cannot run %s: %s" % (argv[0], exc)) from exc
    return (proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


class NvidiaSmiBackend:
    """Samples through ``nvidia-smi`` CSV queries.

    The process list is a second call, made only when the memory alone says
    busy. While the GPUs are busy it is started alongside the memory query
    (the next sample will likely need it), so a sample costs one call's time,
    not two; an unused prefetch is ended, never left behind.
    """

    name = "nvidia_smi"

    def __init__(self, path: str, runner: Runner = run_command,
                 call_timeout: t.Union[float, t.Callable[[], float]] = 30.0) -> None:
        self.path = path
        self.runner = runner
        # a number, or a callable giving the bound for the next call (the wait's time left, so one call to a
        # hung driver never runs past the whole wait's timeout)
        self._call_timeout = call_timeout
        self._prefetch: t.Optional[subprocess.Popen] = None
        self._want_processes = False

    @property
    def call_timeout(self) -> float:
        bound = self._call_timeout
        return float(bound() if callable(bound) else bound)

    def gpus(self) -> list[GpuInfo]:
        rc, out, err = self.runner(gpu_query_argv(self.path), self.call_timeout)
        check_nvidia_smi(rc, out, err)
        return parse_gpu_csv(out)

    def _apps_result(self, rc: int, out: str, err: str) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        try:
            check_nvidia_smi(rc, out, err)
            return tuple(parse_apps_csv(out)), ""
        except GpuError as exc:
            return None, "no process list: %s" % exc

    def processes(self) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        """The process list, or (None, why) when it cannot be had: it is advisory, but a call that hangs is the
        same driver as the memory query's, and GpuTimeout is raised as that one raises it."""
        self._want_processes = True
        try:
            return self._apps_result(*self.runner(apps_query_argv(self.path), self.call_timeout))
        except GpuError as exc:
            return no_process_list(exc)

    def _start_prefetch(self) -> None:
        if self.runner is not run_command:
            return
        try:
            self._prefetch = subprocess.Popen(apps_query_argv(self.path), stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              env=dict(os.environ, LC_ALL="C", LANG="C"))
        except OSError:
            self._prefetch = None

    def _take_prefetch(self, proc: subprocess.Popen) -> tuple[t.Optional[tuple[GpuProcess, ...]], str]:
        self._want_processes = True
        if self._prefetch is proc:
            self._prefetch = None
        bound = self.call_timeout
        try:
            out, err = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            self._end(proc)
            return no_process_list(GpuTimeout(hung_msg(self.path, bound), bound))
        return self._apps_result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    @staticmethod
    def _end(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.communicate()
        except (OSError, ValueError):
            pass

    def sample(self) -> Sample:
        start = time.monotonic()
        now = time.time()
        self.close()  # an unused prefetch from the previous sample
        if self._want_processes:
            self._start_prefetch()
        self._want_processes = False
        prefetch = self._prefetch
        gpus = self.gpus()
        fetch = (lambda: self._take_prefetch(prefetch)) if prefetch is not None else self.processes
        return Sample(at=now, gpus=tuple(gpus), processes=None, backend=self.name,
                      took=time.monotonic() - start, fetch=fetch)

    def close(self) -> None:
        if self._prefetch is not None:
            self._end(self._prefetch)
            self._prefetch = None
