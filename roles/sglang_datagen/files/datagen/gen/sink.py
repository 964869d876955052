"""Where a generate run's rows go (private to ``gen.client``): the output, the error rows, the progress file.

Rows are buffered in memory (``AppendLog.add``) and handed to a writer thread every tick; both logs are fsynced
every ``generate.fsync_interval`` seconds, off the event loop, so the requests keep flowing while a write waits
for the disk. A row is finished when its line is in the output: on resume (``gen.journal``) a row that was still
buffered when the process died is simply generated again. The progress file is rewritten every
``generate.progress_interval`` seconds; it is advisory, so a failure to write it is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Dict, Optional

from ..util import write_json
from .journal import AppendLog
from .progress import Progress, summary_line
from .settings import GenerateSettings

LOG_EVERY_S = 60.0  # a progress line in the journal this often, for whoever reads it there

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class OutputSink:
    """The run's output and error logs and its progress file."""

    def __init__(self, output: AppendLog, errors: AppendLog, progress: Progress, progress_path: str,
                 log: Callable[[str], None]) -> None:
        self.out = output
        self.err = errors
        self.progress = progress
        self.progress_path = progress_path
        self.log = log
        self._sync_fut: Optional[asyncio.Future] = None

    @property
    def pending(self) -> int:
        """Bytes of rows buffered, not yet handed to the writer."""
        return self.out.pending

    def add_row(self, line: str) -> None:
        self.out.add(line)

    def error_row(self, row_id: Optional[str], row: Optional[Dict[str, Any]], error: str, attempts: int,
                  server: Optional[str], status: Optional[int] = None, excerpt: Optional[str] = None) -> None:
        """One line in the error log for a row that failed (or an input line that was no row)."""
        rec: Dict[str, Any] = {"id": row_id, "error": error, "attempts": attempts, "server": server,
                               "status": status, "time": round(time.time(), 3)}
        if row is not None:
            rec["source"] = row.get("source")
            rec["category"] = row.get("category")
        if excerpt is not None:
            rec["input"] = excerpt
        self.err.add(_dumps(rec) + "\n")
        self.err.flush()  # rare: straight to the OS, fsync with the next tick
        self.progress.errors += 1

    def write_progress(self) -> None:
        try:
            write_json(self.progress_path, self.progress.snapshot(), durable=False)
        except OSError as exc:  # progress is advisory: a full disk shows up in the output writes
            self.log(f"generate: cannot write progress: {exc}")

    async def keep(self, settings: GenerateSettings, fail: Callable[[str], None]) -> None:
        """Run the housekeeping until cancelled; a failure to write the output calls FAIL instead of stalling."""
        try:
            await self._housekeeping(settings)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a full disk, an I/O error: nothing more can be kept
            fail(f"cannot write {self.out.path}: {exc}")

    async def _housekeeping(self, s: GenerateSettings) -> None:
        """Hand the buffered rows to the writer thread, fsync every ``fsync_interval``, rewrite the progress file."""
        loop = asyncio.get_running_loop()
        tick = min(s.fsync_interval, s.progress_interval, 0.25)
        next_sync = loop.time() + s.fsync_interval
        next_progress = loop.time()
        next_log = loop.time() + LOG_EVERY_S
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            sync = now >= next_sync
            if sync:
                next_sync = now + s.fsync_interval
            data = self.out.take()
            if data or sync:
                # write and fsync off the event loop: an append to a page under writeback waits
                # for the disk, and the requests must keep flowing meanwhile
                self._sync_fut = loop.run_in_executor(None, _write_and_sync, self.out, data, self.err, sync)
                # shielded: cancelling the housekeeping at the end must not cancel a write that has not started
                # (the rows are already out of the buffer); drain() waits for it before the files close
                await asyncio.shield(self._sync_fut)
                self._sync_fut = None
            if now >= next_progress:
                self.write_progress()
                next_progress = now + s.progress_interval
            if now >= next_log:
                self.log(summary_line(self.progress.snapshot()))
                next_log = now + LOG_EVERY_S

    async def drain(self) -> None:
        """Let a write that is running finish before the files close."""
        if self._sync_fut is not None:
            await asyncio.wait([self._sync_fut])


def _write_and_sync(out: AppendLog, data: bytes, err: AppendLog, sync: bool) -> None:
    out.write(data)
    if sync:
        out.sync()
        err.sync()
