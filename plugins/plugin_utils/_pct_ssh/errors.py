# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the session interface returns and raises: ``ExecResult`` and ``SessionError`` with its ``KINDS``."""

from __future__ import annotations

import dataclasses

KINDS = (
    "unreachable",  # TCP/banner level: host down, wrong port, DNS
    "auth",  # login refused
    "hostkey_unknown",  # not in known_hosts and not allowed to add it
    "hostkey_mismatch",  # known_hosts has a different key: possible MITM
    "sftp_unavailable",  # no SFTP subsystem on the host: use the cat fallback
    "transfer",  # an SFTP read/write failed
    "master",  # the control master could not be started or reached
    "gone",  # the connection broke before the request ran: safe to retry
    "lost",  # the connection died while the request ran: it may have run in part, never retried
    "busy",  # the server kept refusing another session (sshd MaxSessions)
    "config",  # bad settings
)


class SessionError(Exception):
    """A failure talking to the PVE host; ``kind`` is one of ``KINDS``."""

    def __init__(self, kind: str, msg: str) -> None:
        super().__init__(msg)
        self.kind = kind
        self.msg = msg


@dataclasses.dataclass
class ExecResult:
    rc: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    signalled: bool = False  # the server sent no exit status: killed by a signal
