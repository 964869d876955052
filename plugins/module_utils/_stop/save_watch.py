# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A rung's grace for a checkpoint save: is a save the job began after the signal still being written?

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9).

A rung waits past its timeout only for a save that started after its signal:
a live member writing a file under the progress paths that it opened after
the signal, with that file's mtime after the signal. Once such a save was
seen, the rung keeps waiting while files there change within ``stall``
seconds, or while a member still holds a file it opened after the signal (a
save pausing between writes). Files that merely change (a job ignoring the
signal that keeps writing its log or its periodic checkpoints into files it
already had open) never extend a rung. A job whose step counter (from its
tmux pane) advances more than ``STEP_SLACK`` past the step seen at the signal
is still training, not shutting down, and gets no grace at all in that rung.
Never past ``max_grace`` from the rung's start.
"""

from __future__ import annotations

import os
import stat
import time
import typing as t
from dataclasses import dataclass

PROGRESS_SAMPLE = 0.5
PROGRESS_MAX_FILES = 10000
# The step line a rank prints for the step in flight when the signal lands is not "still training";
# more than this many steps past the one seen at the signal is.
STEP_SLACK = 1
# File timestamps come from the kernel's coarse clock (up to a tick behind time.time()).
MTIME_SLACK_NS = 50_000_000


@dataclass(frozen=True)
class ProgressScan:
    """One look at ``progress_paths``: what changed-or-not is judged on, and the files' identities."""

    signature: frozenset  # (path, inode, size, mtime_ns) of every entry seen
    files: frozenset  # (st_dev, st_ino) of the regular files seen
    file_mtimes: frozenset = frozenset()  # ((st_dev, st_ino), mtime_ns) of the regular files seen

    def modified_since(self, wall_ns: int) -> set[tuple[int, int]]:
        """The regular files written (or created) at or after ``wall_ns`` (ns since the epoch)."""
        return {ident for ident, mtime_ns in self.file_mtimes if mtime_ns >= wall_ns}


def progress_scan(paths: t.Sequence[str], limit: int = PROGRESS_MAX_FILES) -> ProgressScan:
    """Every file and directory under ``paths`` (bounded by ``limit`` entries).

    Symlinks are followed (a checkpoint directory is often a link to the run's
    storage) with each directory walked once, so a link cycle ends. Within a
    directory the newest entries are walked first: when ``limit`` cuts the walk
    short it leaves out old checkpoints, never the one being written.
    """
    seen: set[tuple[str, int, int, int]] = set()
    files: dict[tuple[int, int], int] = {}
    walked: set[tuple[int, int]] = set()
    stack: list[tuple[str, os.stat_result]] = []
    stats_left = 4 * limit  # listing a huge directory costs stats too; bounded all the same
    for path in reversed(list(paths)):
        try:
            stack.append((path, os.stat(path)))
        except OSError:
            continue
    while stack and len(seen) < limit:
        path, st = stack.pop()
        seen.add((path, st.st_ino, st.st_size, st.st_mtime_ns))
        if stat.S_ISREG(st.st_mode):
            files[(st.st_dev, st.st_ino)] = st.st_mtime_ns
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in walked:
            continue
        walked.add((st.st_dev, st.st_ino))
        try:
            names = os.listdir(path)
        except OSError:
            continue
        entries = []
        for name in names[:stats_left]:
            child = os.path.join(path, name)
            try:
                entries.append((child, os.stat(child)))
            except OSError:  # gone meanwhile, or a dangling link
                continue
        stats_left -= min(len(names), stats_left)
        # oldest first on the stack, so the newest is popped (walked) first
        entries.sort(key=lambda entry: (entry[1].st_mtime_ns, entry[0]))
        stack.extend(entries)
    return ProgressScan(frozenset(seen), frozenset(files), frozenset(files.items()))


@dataclass(frozen=True)
class Grace:
    """What a rung watches for a save, and how long it may wait for one past its timeout."""

    paths: t.Sequence[str] = ()  # training_stop's progress_paths
    stall: float = 10.0  # a save with no change for this long is over (or hung)
    max_grace: float = 600.0  # never wait past this from the rung's start
    step_probe: t.Callable[[], t.Optional[int]] | None = None  # the job's current step (tmux pane), or None
    wall: t.Callable[[], float] = time.time  # the clock file mtimes are compared with

    @property
    def watches(self) -> bool:
        return bool(self.paths) or self.step_probe is not None


NO_GRACE = Grace()  # a rung that watches nothing ends at its timeout


class SaveWatch:
    """One rung's watch, begun just before its signal and sampled while it waits."""

    def __init__(self, holds: t.Callable[[], set[tuple[int, int, int]]], grace: Grace) -> None:
        # holds(): (pid, st_dev, st_ino) of the files the live members hold open for writing
        self.holds, self.grace = holds, grace
        self.baseline = progress_scan(grace.paths).signature if grace.paths else None
        self.held_before = holds() if self.baseline is not None else set()
        self.inodes_before = {ino for _pid, _dev, ino in self.held_before}
        self.step_at_signal = grace.step_probe() if grace.step_probe is not None else None
        self.steps: list[t.Any] = [self.step_at_signal, self.step_at_signal] if grace.step_probe is not None else []
        self.signal_wall_ns = int(grace.wall() * 1e9) - MTIME_SLACK_NS
        self.every = min(PROGRESS_SAMPLE, max(0.05, grace.stall / 2))
        self.next_sample = 0.0
        self.last_change: float | None = None
        self.save_seen = False  # a member wrote a file under paths that it opened after this signal
        self.training = False  # the step counter kept advancing after this signal
        self.held_open = False  # waited for because a member kept a file it opened after the signal open

    def start(self, now: float) -> None:
        """The signal is sent and the wait begins: the first sample is due one interval from now."""
        self.next_sample = now + self.every

    def due(self, now: float) -> bool:
        return now >= self.next_sample

    def sample(self, now: float) -> None:
        """Look at the job's step and files once."""
        self.next_sample = now + self.every
        self._sample_step()
        if self.baseline is not None:
            self._sample_files(now)

    def _sample_step(self) -> None:
        step = self.grace.step_probe() if self.grace.step_probe is not None else None
        if step is None:
            return
        if self.step_at_signal is None:
            self.step_at_signal = step
        self.steps = [self.step_at_signal, step]
        if step - self.step_at_signal > STEP_SLACK:
            self.training = True

    def _sample_files(self, now: float) -> None:
        scan = progress_scan(self.grace.paths)
        fresh = scan.modified_since(self.signal_wall_ns)
        opened_after = {(pid, dev, ino) for pid, dev, ino in self.holds() - self.held_before if (dev, ino) in scan.files}
        if any((dev, ino) in fresh for _pid, dev, ino in opened_after):
            self.save_seen = True
        # a file the job already held open for writing at the signal (its log) changing is not a save
        changed = any(entry[1] not in self.inodes_before for entry in scan.signature - self.baseline)
        if self.training:
            self.last_change = None  # still training: whatever it writes is not a shutdown save
        elif self.save_seen and changed:
            self.last_change = now
        elif self.save_seen and opened_after:
            # The save still holds a file it opened after the signal: pausing longer than stall between
            # writes (the next shard serialized, an fsync under I/O load) is still a save in progress.
            # max_grace bounds this like any progress.
            self.last_change = now
            self.held_open = True
        self.baseline = scan.signature

    def grace_end(self, rung_start: float, timeout: float) -> float | None:
        """Until when the rung may wait for a save in progress; None when none is (or the cap is reached)."""
        if self.last_change is None:
            return None
        return min(rung_start + max(self.grace.max_grace, timeout), self.last_change + self.grace.stall)
