# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real tmux server: a pane kept after its process exited (remain-on-exit) is no pane of the job, and a live
one is listed with its window."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._tmux import tmux_panes

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"), pytest.mark.processes]


def test_a_dead_pane_is_left_out_and_a_live_one_is_listed(tmp_path):
    socket = str(tmp_path / "tmux.sock")

    def tmux(*args):
        return subprocess.run(["tmux", "-S", socket, *args], capture_output=True, text=True, timeout=10, check=True)

    tmux("new-session", "-d", "-s", "dflash", "-x", "80", "-y", "20", "sleep 1")
    tmux("set-option", "-t", "=dflash:", "remain-on-exit", "on")
    tmux("new-window", "-d", "-n", "train", "-t", "=dflash:", "sleep 60")
    try:
        deadline = time.monotonic() + 10
        while tmux("list-panes", "-s", "-t", "=dflash", "-F", "#{pane_dead}").stdout.split().count("1") < 1:
            assert time.monotonic() < deadline, "the first pane never died"
            time.sleep(0.1)
        panes, note = tmux_panes("dflash", socket)
        live = tmux("list-panes", "-s", "-t", "=dflash", "-F", "#{pane_dead} #{pane_id}").stdout.split("\n")
        assert [p.pane_id for p in panes] == [line.split()[1] for line in live if line.startswith("0 ")]
        assert len(panes) == 1 and note == ""
        assert panes[0].window_name == "train" and not panes[0].dead  # what the launch record keeps
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, timeout=10, check=False)
