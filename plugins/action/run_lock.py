# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Controller side of gpuops.repurpose.run_lock: who this run is, and whether a holder's controller is gone.

Only the controller can tell that the ansible-playbook which took a lock was killed
(its PID no longer runs here), so this plugin reads the controller's identity,
asks the module who holds the lock, and passes ``take_over`` when that holder is
a dead run of this same controller. Everything on the target is the module's.
"""

from __future__ import annotations

import os
import random
import time
import typing as t

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import (
    controller_alive,
    controller_identity,
    new_run_id,
    run_to_take_over,
)

MODULE = "gpuops.repurpose.run_lock"


def controller_owner(task_vars: t.Mapping[str, t.Any]) -> dict:
    """The holder fields read on the controller: host, main process, user, AWX job, play."""
    owner = controller_identity(os.getpid(), os.uname().nodename)
    owner.update(
        user=os.environ.get("USER") or os.environ.get("LOGNAME") or "?",
        awx_job_id=str(task_vars.get("awx_job_id", task_vars.get("tower_job_id", "")) or ""),
        play=str(task_vars.get("ansible_play_name", "") or ""),
    )
    return owner


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _VALID_ARGS = frozenset(("path", "state", "run_id", "owner", "timeout", "expiry", "take_over"))

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("state", "acquired") != "acquired":
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
            return result

        identity = controller_owner(task_vars)
        given = args.get("owner") or {}
        if not isinstance(given, dict):
            result.update(failed=True, msg="owner: must be a dict of fields to record about the holder, got %s"
                          % type(given).__name__)
            return result
        owner = dict(identity, **{k: v for k, v in given.items() if not str(k).startswith("controller")})
        args["owner"] = owner
        args["run_id"] = args.get("run_id") or new_run_id(identity["controller_pid"], time.time(),
                                                          random.randrange(1000000))
        if not args.get("take_over"):
            seen = self._execute_module(module_name=MODULE, module_args={"path": args.get("path"), "state": "read"},
                                        task_vars=task_vars)
            if seen.get("failed") or seen.get("unreachable"):
                result.update(seen)
                return result
            me = {"controller": identity["controller"], "run_id": args["run_id"]}
            take_over = run_to_take_over(seen.get("holder"), me, controller_alive)
            if take_over:
                args["take_over"] = take_over
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        return result
