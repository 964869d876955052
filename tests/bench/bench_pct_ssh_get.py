# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Benchmark: one SFTP download from a throwaway sshd on loopback, pct_ssh's get against paramiko's own, side by side.

    .venv/bin/python -m tests.bench.bench_pct_ssh_get [--mib 200] [--rounds 3] [--json FILE] [--check]

Contenders, run interleaved round by round so machine load hits both alike, over one SSH connection:
  pct_ssh_get        DirectSession.get: its own SFTP reads on a channel of their own, GET_DEPTH in flight
  paramiko_getfo     paramiko's SFTPClient.getfo (prefetch of the whole file): the baseline pct_ssh's get
                     replaced, since a prefetch that ends early holds the rest of the file in memory

Reported per contender: the median seconds and MiB/s, and the peak of Python's allocations during the
download (tracemalloc, every thread). Goal: pct_ssh_get within 1.25x of paramiko_getfo's time
(``--check``: exit 1 when missed). Needs root and OpenSSH's sshd (tests/support/sshd.py); no lab.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from tests.bench.goals import finish, goal_flags
from tests.support import paths
from tests.support.sshd import sshd_usable, start_sshd, stop_sshd

paths.add_import_dirs()

from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh  # noqa: E402 - after the path

GOAL = 1.25


def timed(download) -> tuple:
    """(seconds, peak MiB of Python's allocations) of one DOWNLOAD."""
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        download()
        return time.monotonic() - t0, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main() -> int:
    ap = goal_flags(argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not sshd_usable():
        sys.exit("needs root and OpenSSH's sshd for a throwaway server")
    with tempfile.TemporaryDirectory(prefix="bench_pct_ssh_get_") as tmpdir:
        server = start_sshd(os.path.join(tmpdir, "sshd"))
        try:
            settings = _pct_ssh.Settings(host="127.0.0.1", port=server.port, user="root", key_filename=server.key,
                                         look_for_keys=False, known_hosts_file=server.known_hosts)
            session = _pct_ssh.DirectSession(settings).connect()
            src = Path(tmpdir, "src.bin")
            with open(src, "wb") as fh:
                block = os.urandom(2**20)
                for i in range(args.mib):
                    fh.write(block[i:] + block[:i])
            remote = session.mkdtemp() + "/file"
            session.put(str(src), remote)
            out = Path(tmpdir, "out.bin")

            def getfo() -> None:
                with session._sftp_client() as sftp, open(out, "wb") as fh:  # pylint: disable=protected-access
                    sftp.getfo(remote, fh)

            contenders = {"pct_ssh_get": lambda: session.get(remote, str(out)), "paramiko_getfo": getfo}
            seconds: dict = {n: [] for n in contenders}
            peaks: dict = {n: [] for n in contenders}
            for rnd in range(args.rounds):
                for name, download in contenders.items():
                    s, peak = timed(download)
                    assert out.stat().st_size == src.stat().st_size, name
                    seconds[name].append(s)
                    peaks[name].append(peak)
                print("round %d: %s" % (rnd + 1, ", ".join("%s %.2f s" % (n, seconds[n][-1]) for n in contenders)),
                      flush=True)
            session.rmtree(remote.rsplit("/", 1)[0])
            session.close()
        finally:
            stop_sshd(server)
    med = {n: statistics.median(v) for n, v in seconds.items()}
    print("\n%-16s %10s %10s %14s" % ("contender", "median s", "MiB/s", "peak MiB"))
    for n in contenders:
        print("%-16s %10.2f %10.0f %14.1f" % (n, med[n], args.mib / med[n], max(peaks[n])))
    ratio = med["pct_ssh_get"] / med["paramiko_getfo"]
    print("\npct_ssh_get/paramiko_getfo %.2fx" % ratio)
    summary = {"median_s": med, "peak_mib": {n: max(v) for n, v in peaks.items()}, "ratio": ratio,
               "samples": seconds, "mib": args.mib}
    return finish(summary, {"pct_ssh_get within %.2fx of paramiko_getfo" % GOAL: ratio <= GOAL}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
