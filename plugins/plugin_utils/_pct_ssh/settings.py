# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The settings of one SSH login, the name of 'the same connection', and the liveness bounds they imply."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing as t

from .credentials import credential_identity
from .errors import SessionError

PROTOCOL = 2  # part of the control socket's name: a changed plugin never talks to an older master (2: heartbeat frames)


@dataclasses.dataclass
class Settings:
    """Everything needed to open the SSH connection (not what runs over it)."""

    host: str
    port: int = 22
    user: t.Optional[str] = None
    password: t.Optional[str] = None
    key_filename: t.Optional[str] = None
    look_for_keys: bool = True
    connect_timeout: float = 10.0
    banner_timeout: float = 30.0
    host_key_checking: bool = True
    host_key_auto_add: bool = False
    record_host_keys: bool = True
    known_hosts_file: str = "~/.ssh/known_hosts"
    lock_file_timeout: float = 60.0
    proxy_command: t.Optional[str] = None
    use_rsa_sha2_algorithms: bool = True
    # OpenSSH's ServerAliveInterval/ServerAliveCountMax: a probe every interval; a host that leaves one
    # unanswered for interval * count_max seconds is dead (see dead_after). 0 turns probing off.
    server_alive_interval: int = 5
    server_alive_count_max: int = 3
    # what the caller does with the login that must not be shared either (how pct is run: become method, path)
    identity_extra: t.Dict[str, t.Any] = dataclasses.field(default_factory=dict)

    def cache_key(self, env: t.Optional[t.Mapping[str, str]] = None) -> str:
        """The name of 'the same connection': everything that authenticates it (secrets only as a digest).

        A shared connection is a logged-in session: whoever reaches it acts as
        its user. So two callers share it only when they would log in with the
        same credentials and the same host key policy: the settings, this
        controller user, the content of the key file (a replaced key at the same
        path is another identity), of the default keys paramiko would try, and
        the agent (when it may be used).
        """
        raw = json.dumps([PROTOCOL, dataclasses.asdict(self), credential_identity(self, env)], sort_keys=True)
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]

    def host_label(self) -> str:
        return "%s@%s:%d" % (self.user or "(default user)", self.host, self.port)


def dead_after(settings: Settings) -> t.Optional[float]:
    """Worst case, in seconds, between a host going silent and its connection being declared dead.

    A probe goes out ``server_alive_interval`` seconds after the last answer and
    may stay unanswered for ``interval * count_max`` seconds: interval * (count_max + 1)
    in all. A host that closes the TCP connection (sshd killed, host rebooted with
    its network up) is noticed at once. None when probing is off.
    """
    if settings.server_alive_interval <= 0:
        return None
    return float(settings.server_alive_interval * (max(1, settings.server_alive_count_max) + 1))


def heartbeat_period(settings: Settings) -> float:
    """How often a control master tells a waiting worker that it is still alive and working."""
    interval = settings.server_alive_interval
    return float(min(5, interval)) if interval > 0 else 5.0


def frame_timeout(settings: Settings) -> float:
    """Longest a worker waits for the next frame (reply or heartbeat) from its control master.

    Several missed heartbeats, so a busy master is never taken for a hung one,
    yet a frozen or vanished master is given up on within seconds.
    """
    return heartbeat_period(settings) * (max(1, settings.server_alive_count_max) + 1) + 5.0


def validate_alive(interval: t.Any, count_max: t.Any) -> t.Tuple[int, int]:
    """Check the server-alive options; SessionError('config') names the option and the fix."""
    try:
        i, c = int(interval), int(count_max)
    except (TypeError, ValueError):
        raise SessionError("config", "server_alive_interval and server_alive_count_max must be integers, got %r and %r" % (interval, count_max)) from None
    if i < 0:
        raise SessionError("config", "server_alive_interval must be >= 0 seconds (0 turns keepalive probes off), got %d" % i)
    if c < 1:
        raise SessionError("config", "server_alive_count_max must be >= 1 (unanswered probes before the host is declared dead), got %d" % c)
    return i, c
