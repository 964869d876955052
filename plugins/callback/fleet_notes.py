# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet_notes
type: notification
short_description: Say what an interrupted or unreachable repurpose run leaves behind
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
requirements:
  - Nothing beyond ansible-core; runs on the controller (enable it in C(ansible.cfg), C(callbacks_enabled)).
description:
  - Two things the plays themselves cannot print, for C(playbooks/repurpose_ct200.yml) and the other playbooks of
    the collection.
  - B(An interrupted run.) On SIGINT (Ctrl-C) or SIGTERM to C(ansible-playbook), before it exits, it names the hosts
    whose stop-verify-kill ladder (M(gpuops.repurpose.training_stop)) had started. That ladder goes on in the
    container by itself and records its outcome, and a re-run of the same command reports it.
  - B(Unreachable hosts.) The plays print the fleet summary from a task. When every host of a play is unreachable
    or failed, ansible-core runs no later play, so no summary task runs. At the end of such a run this callback
    prints the fleet lines it can give from the run's own record, one per host that was unreachable, and the
    C(--limit) that re-runs them.
  - Both go to standard error, so that a machine-readable standard output (a JSON stdout callback) stays whole.
  - Enabled by the collection's C(ansible.cfg) (C(callbacks_enabled = gpuops.repurpose.fleet_notes)); elsewhere, for
    example in AWX, set E(ANSIBLE_CALLBACKS_ENABLED=gpuops.repurpose.fleet_notes).
"""

EXAMPLES = r"""
# ansible.cfg
# [defaults]
# callbacks_enabled = gpuops.repurpose.fleet_notes

# Ctrl-C while the ladder runs on ct200 prints, before ansible-playbook exits:
#   SIGINT: interrupted. The stop ladder had started on ct200: it goes on in the container by itself (a closed
#   connection does not stop it half-way) and records how it ended. Run the same command again: it reports what
#   that ladder stopped, and by which rung, then carries on.

# Every container unreachable (no later play, no summary task) ends with:
#   FLEET (from the run's record: no play was left to print the summary): 1 host(s) unreachable
#     ct200: unreachable, nothing was done there: Failed to connect to the host via ssh: ...
#     re-run them, once reachable: --limit ct200
"""

import os
import signal
import typing as t

from ansible.plugins.callback import CallbackBase

LADDER_ACTIONS = frozenset({"gpuops.repurpose.training_stop", "training_stop"})
FLEET_SUMMARY_MARK = "FLEET"  # the fleet summary task's first word (roles/stop_training/tasks/fleet_summary.yml)


def interrupted_message(signal_name: str, ladder_hosts: t.Sequence[str]) -> str:
    """What an interrupted run says before it exits."""
    if not ladder_hosts:
        return ("%s: interrupted before any stop ladder started: nothing was signalled by this run. "
                "Run the same command again." % signal_name)
    return ("%s: interrupted. The stop ladder had started on %s: it goes on in the container by itself (a closed "
            "connection does not stop it half-way) and records how it ended. Run the same command again: it reports "
            "what that ladder stopped, and by which rung, then carries on." % (signal_name, ", ".join(ladder_hosts)))


def unreachable_lines(unreachable: t.Mapping[str, str], summary_printed: bool) -> t.List[str]:
    """The fleet lines for the unreachable hosts when no fleet summary was printed (none when one was)."""
    if summary_printed or not unreachable:
        return []
    hosts = sorted(unreachable)
    lines = ["FLEET (from the run's record: no play was left to print the summary): %d host(s) unreachable"
             % len(hosts)]
    lines += ["  %s: unreachable, nothing was done there: %s" % (host, unreachable[host]) for host in hosts]
    lines.append("  re-run them, once reachable: --limit %s" % ",".join(hosts))
    return lines


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "gpuops.repurpose.fleet_notes"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        self._pid = os.getpid()  # worker processes fork with these handlers: only this process speaks
        self._ladder_hosts: t.List[str] = []
        self._unreachable: t.Dict[str, str] = {}
        self._summary_printed = False
        self._previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        for signum in self._previous:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: t.Any) -> None:
        if os.getpid() == self._pid:
            self._display.display(interrupted_message(signal.Signals(signum).name, self._ladder_hosts), stderr=True)
        previous = self._previous.get(signum)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signum)

    def v2_runner_on_start(self, host: t.Any, task: t.Any) -> None:
        if task.action in LADDER_ACTIONS and host.get_name() not in self._ladder_hosts:
            self._ladder_hosts.append(host.get_name())

    def v2_runner_on_ok(self, result: t.Any) -> None:
        msg = result._result.get("msg")
        if isinstance(msg, list) and msg and str(msg[0]).startswith(FLEET_SUMMARY_MARK):
            self._summary_printed = True
        elif isinstance(msg, str) and msg.startswith(FLEET_SUMMARY_MARK):
            self._summary_printed = True

    def v2_runner_on_unreachable(self, result: t.Any) -> None:
        self._unreachable[result._host.get_name()] = str(result._result.get("msg", "")).strip()[:300]

    def v2_playbook_on_stats(self, stats: t.Any) -> None:
        # on stderr, like the interrupt note: stdout stays the stdout callback's alone (a json callback's output
        # must stay one JSON document)
        for line in unreachable_lines(self._unreachable, self._summary_printed):
            self._display.display(line, stderr=True)
