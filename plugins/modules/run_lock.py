#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: run_lock
short_description: Take, release or read a run lock on the target, so two runs of a play cannot interleave
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - A lock file on the target (JSON) names the run that holds it, so two runs of the same play (two AWX jobs,
    two operators) cannot interleave on one host or container. A play takes it in one task
    (O(state=acquired)) and releases it in a later one (O(state=released)), usually in an C(always) section.
  - A second run waits at most O(timeout) seconds for the lock, then fails naming the holder (run id, AWX job
    id, user, controller host and ansible-playbook PID, since when).
  - A lock is taken over, and the result says why, when it is stale. Past O(expiry) seconds; an unreadable
    lock file (a crash while writing never wedges the target); or a holder whose controller process is gone.
    The action plugin proves that last one on the controller. When the holder was started on this same
    controller host and its ansible-playbook process no longer runs (same PID and start time), the run was
    killed part-way and its lock is taken over at once, so a re-run after a partial failure is never blocked.
  - Every check-and-set happens under C(flock) on a sibling C(.guard) file, so two runs racing for a free or
    stale lock cannot both win. A run releases only its own lock; another run's lock is left alone.
  - The action plugin records the controller's identity in the lock (C(controller), C(controller_pid),
    C(controller_started), C(user), C(awx_job_id), C(play)), read on the controller, and makes up O(run_id) when
    it is not given.
  - For one process at a time rather than one run, see O(gpuops.repurpose.training_stop#module:lock_timeout),
    which holds a C(flock) for the module's own life.
requirements:
  - A POSIX target with C(flock) on its filesystem (C(fcntl)); a holder is judged alive through C(/proc), so Linux
    for the take-over of a lock whose holder died.
options:
  path:
    description:
      - The lock file on the target. Its directory is created when missing. A path on tmpfs (under C(/run)) is
        cleared by a restart of the host or container, which ends any run that held it.
    type: path
    required: true
  state:
    description:
      - V(acquired) takes the lock (waiting at most O(timeout)); taking a lock this O(run_id) already holds
        changes nothing.
      - V(released) removes the lock if O(run_id) holds it, and leaves another run's lock alone.
      - V(read) reports the holder and changes nothing.
    type: str
    choices: [acquired, released, read]
    default: acquired
  run_id:
    description:
      - Names this run in the lock. Required for O(state=released).
      - For O(state=acquired) the action plugin makes one up when it is not given
        (C(<controller pid>-<UTC time>-<nonce>)) and returns it as RV(run_id); pass that to the later tasks.
    type: str
  owner:
    description:
      - More fields to record about the holder (they show in RV(holder) and in a waiting run's message).
      - The action plugin adds the controller's identity; C(user), C(awx_job_id) and C(play) given here win.
    type: dict
    default: {}
  timeout:
    description: Seconds a run waits for another run's lock before it fails naming the holder (>= 0).
    type: float
    default: 300
  expiry:
    description:
      - Seconds after which a lock is stale and may be taken over by any run (> 0). Longer than a run
        can take, since a live run's lock expiring lets a second run in.
    type: float
    default: 7200
  take_over:
    description:
      - The run id of a holder known to be dead; its lock is taken over at once. The action plugin sets it
        when the holder's controller process is proven gone on this controller. A live holder is never taken
        over because of it.
    type: str
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.ACTION
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  action:
    support: full
  check_mode:
    support: full
    details: In check mode nothing is written and nothing waited for; RV(would_wait) says a real run would wait.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Taking a lock that O(run_id) already holds, or releasing one it does not hold, changes nothing.
  platform:
    support: full
    platforms: posix
seealso:
  - module: gpuops.repurpose.training_stop
notes:
  - The role C(gpuops.repurpose.stop_training) takes this lock around its stop-verify-kill ladder and releases it
    whatever happens.
  - Runs on the target with the standard library only (Python 3.9 or later); the controller's identity is read
    on the controller by the action plugin.
"""

EXAMPLES = r"""
- name: Take the run lock on the container (waits at most 5 minutes)
  gpuops.repurpose.run_lock:
    path: /run/gpuops-repurpose/stop_training.lock
    timeout: 300
  register: run_lock

- name: Work that must not interleave with another run
  block:
    - name: Stop the training job
      gpuops.repurpose.training_stop:
        tmux_session: dflash
  always:
    - name: Release the run lock (only if this run holds it)
      gpuops.repurpose.run_lock:
        path: /run/gpuops-repurpose/stop_training.lock
        state: released
        run_id: "{{ run_lock.run_id }}"
      when: run_lock.acquired | default(false)

- name: Who holds the lock?
  gpuops.repurpose.run_lock:
    path: /run/gpuops-repurpose/stop_training.lock
    state: read
  register: seen

- name: Say who holds it
  ansible.builtin.debug:
    msg: "{{ seen.description }}"
"""

RETURN = r"""
run_id:
  description: The run the task acted for (made up by the action plugin when O(run_id) was not given).
  returned: state is acquired or released
  type: str
  sample: 4242-20261201T080102-123456
acquired:
  description: Whether this run holds the lock now (false in check mode, where nothing is written).
  returned: state is acquired
  type: bool
released:
  description: Whether this run's lock was removed.
  returned: state is released
  type: bool
holder:
  description:
    - The lock's holder. After O(state=acquired), this run's record; when the lock is held by another run,
      that run's record; after O(state=read), the current holder, or null when the lock is free.
    - "An unreadable lock file shows as C(unknown: true)."
  returned: always
  type: dict
  sample:
    run_id: 4242-20261201T080102-123456
    controller: ctl1.example.internal
    controller_pid: 4242
    controller_started: 81234567
    user: awx
    awx_job_id: "77"
    play: Repurpose CT200
    acquired_at: 1796112062.5
    acquired_at_iso: "2026-12-01T08:01:02Z"
    expires_at: 1796119262.5
description:
  description: The holder in one line for an operator (C(nobody) when the lock is free).
  returned: state is read, and in check mode when held by another run
  type: str
  sample: run 4242-20261201T080102-123456, AWX job 77, by awx on controller ctl1.example.internal (ansible-playbook pid 4242)
waited:
  description: Seconds this run waited while another run held the lock; 0 when the lock was free.
  returned: state is acquired
  type: float
waited_for_other_run:
  description: True when the lock was taken only after another run released it.
  returned: when it waited
  type: bool
reentered:
  description: True when O(run_id) already held the lock (nothing changed).
  returned: when it already held it
  type: bool
taken_over:
  description: The stale lock this run took over, and why (expired, unreadable, or its controller process gone).
  returned: when a stale lock was taken over
  type: dict
  sample:
    holder: {run_id: 4242-20261201T080102-123456, controller: ctl1.example.internal, controller_pid: 4242}
    reason: its ansible-playbook process (pid 4242 on ctl1.example.internal) is gone
would_wait:
  description: In check mode, true when another run holds the lock, so a real run would wait for it.
  returned: in check mode, when held by another run
  type: bool
msg:
  description: Why the lock was not taken or not released (names the holder).
  returned: when the lock is held by another run, or on release of a lock this run does not hold
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._lock import (
    LockError,
    LockHeld,
    acquire,
    read,
    release,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["acquired", "released", "read"], default="acquired"),
            run_id=dict(type="str"),
            owner=dict(type="dict", default={}),
            timeout=dict(type="float", default=300),
            expiry=dict(type="float", default=7200),
            take_over=dict(type="str"),
        ),
        required_if=[("state", "acquired", ["run_id"]), ("state", "released", ["run_id"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "read":
            module.exit_json(**read(params["path"]))
        if params["state"] == "released":
            module.exit_json(run_id=params["run_id"], **release(params["path"], params["run_id"], module.check_mode))
        result = acquire(params["path"], params["run_id"], params["owner"], params["timeout"], params["expiry"],
                         params["take_over"] or "", module.check_mode)
    except LockHeld as exc:
        module.fail_json(msg=str(exc), run_id=params["run_id"], acquired=False, holder=exc.holder, waited=exc.waited)
    except LockError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(run_id=params["run_id"], **result)


if __name__ == "__main__":
    main()
