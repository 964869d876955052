# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SSH sessions to a Proxmox VE host for the ``pct_ssh`` connection plugin.

This is a PRIVATE plugin_utils package of gpuops.repurpose; its API may change at
any time. It runs on the controller only, and imports nothing from Ansible or from
the collection (only its own modules, relatively), so the same package also runs as
a program: the *control master* (``python -m _pct_ssh --serve``, see ``client``),
which keeps one paramiko connection per PVE host open across tasks, the way
OpenSSH's ControlPersist does.

Why a control master: Ansible forks a fresh worker process for every task, so
a connection cached in the plugin dies with the task. The master holds the SSH
transport; a worker talks to it over a private unix socket and pays neither
the SSH handshake nor the paramiko import (about 0.2 s per task together).

Two implementations of one small interface (``exec``, ``mkdtemp``, ``put``,
``get``, ``rmtree``, ``close``): ``DirectSession`` (paramiko, in this process)
and ``MasterClient`` (the same calls, answered by the master). Failures raise
``SessionError`` with a ``kind`` the plugin turns into its own messages.

The modules, by concern:

- ``errors``: ``SessionError`` and its ``KINDS``, ``ExecResult``;
- ``settings``: ``Settings`` (the login), its cache key and liveness bounds;
- ``credentials``: what authenticates a login beyond its settings; key file checks;
- ``known_hosts``: host key checking and recording;
- ``login``: a logged-in paramiko client;
- ``command``: running one command on a channel;
- ``sftp_read``: a download with a bounded number of reads in flight;
- ``session``: ``DirectSession``;
- ``wire``: the control socket's frames;
- ``client``: ``MasterClient``, finding or starting the master;
- ``master``: the control master program (``__main__``).
"""

from __future__ import annotations

from .client import MasterClient, control_path, open_master, private_dir
from .credentials import key_file_problem
from .errors import KINDS, ExecResult, SessionError
from .master import DEAD_DRAIN_S
from .session import DirectSession
from .settings import Settings, dead_after, frame_timeout, heartbeat_period, validate_alive

__all__ = [
    "DEAD_DRAIN_S",
    "KINDS",
    "DirectSession",
    "ExecResult",
    "MasterClient",
    "SessionError",
    "Settings",
    "control_path",
    "dead_after",
    "frame_timeout",
    "heartbeat_period",
    "key_file_problem",
    "open_master",
    "private_dir",
    "validate_alive",
]
