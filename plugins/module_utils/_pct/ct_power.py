# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runner of ``proxmox_ct_power``: ``pct status|start|stop|shutdown|reboot``, idempotent and bounded.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on the PVE host). :func:`power` takes the
AnsibleModule (its params, check mode and ``run_command``) and returns the
module's result; the command lines come from ``_pct.command``, the host side from
``_pct.host``.
"""

from __future__ import annotations

import platform
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import command as _pct
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import host as _pct_host
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.host import PctHost
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

OPERATIONS = ("status", "start", "stop", "shutdown", "reboot")
PCT_DEFAULT_TIMEOUT = 60  # lxc-stop's default, which pct uses without --timeout
# nothing to do when the container is already in the state the operation leads to
_ALREADY = {"start": "running", "stop": "stopped", "shutdown": "stopped"}


def pct_args(operation: str, timeout: t.Optional[int]) -> t.List[str]:
    """The arguments after ``pct OPERATION VMID``."""
    if timeout is not None and operation in ("shutdown", "reboot"):
        return ["--timeout", str(timeout)]
    return []


def host_bound(operation: str, timeout: t.Optional[int], command_timeout: t.Optional[int]) -> int:
    """Seconds pct may run on the host: longer than pct's own bound for shutdown/reboot, so pct ends first."""
    if command_timeout is not None:
        return command_timeout
    if operation in ("shutdown", "reboot"):
        return 2 * ((PCT_DEFAULT_TIMEOUT if timeout is None else timeout) + 5) + 30
    return 300


def validate(p: t.Mapping[str, t.Any]) -> int:
    vmid = _pct.validate_vmid(p["vmid"])
    for name in ("timeout", "command_timeout"):
        if p[name] is not None and p[name] <= 0:
            raise _pct.PctError("%s must be a positive number of seconds, got %d" % (name, p[name]))
    if p["timeout"] is not None and p["operation"] not in ("shutdown", "reboot"):
        raise _pct.PctError("timeout applies to operation shutdown or reboot only, not %s" % p["operation"])
    return vmid


def wait_for_status(pct: PctHost, vmid: int, want: str, within: float) -> str:
    """Poll ``pct status`` until container VMID is WANT or WITHIN seconds have passed; the last status."""
    deadline = Deadline(within)
    while True:
        status = pct.status(vmid)
        if status == want or deadline.expired():
            return status
        time.sleep(min(1.0, max(0.0, deadline.remaining())))


def power(module: t.Any) -> t.Dict[str, t.Any]:
    """Run ``proxmox_ct_power``: returns the module's result, with ``failed=True`` and ``msg`` on failure."""
    p = module.params
    op = p["operation"]
    result = _pct_host.base_result(rc=0)
    try:
        vmid = validate(p)
        pct = PctHost.from_params(module)
        cmd = pct.argv(op, vmid, *pct_args(op, p["timeout"]))
    except _pct.PctError as e:
        return dict(result, failed=True, msg=str(e))
    result["cmd"] = cmd
    try:
        pct.check()
        state = pct.state(vmid)
        status = state.status
        result.update(state.as_result())
        if op == "status":
            result.update(stdout="status: %s\n" % status, stdout_lines=["status: %s" % status])
            return result
        if _ALREADY.get(op) == status:
            return dict(result, msg="container %d is already %s" % (vmid, status))
        if state.lock:
            # pct refuses start/stop/shutdown itself; reboot does not look, and stops a CT it cannot start again
            raise _pct_host.PctHostFailure(_pct.locked_message(vmid, platform.node(), state.lock, _pct.quote(cmd)))
        if module.check_mode:
            result.update(changed=True, msg="would run: %s" % _pct.quote(cmd))
            return result
        bound = host_bound(op, p["timeout"], p["command_timeout"])
        ran = pct.run_captured(cmd, None, bound)
        result.update(ran.as_result())
        refused = pct.refused(ran.stderr)
        if refused:
            raise _pct_host.PctHostFailure(refused, changed=False)
        result["ha_request"] = _pct.ha_request(ran.stdout)
        result["ct_status"] = pct.status(vmid)
        if ran.hung:
            # pct runs the power action as a task worker in its own session: killing pct's process group does
            # not reach it, so it may still be working and holding the config lock
            raise _pct_host.PctHostFailure(
                "`pct %s %d` did not return within command_timeout=%ds: pct was killed, but its task runs in its own "
                "session and may still be working (and holding the config lock); CT %d is %s now. Look at `pct status %d` "
                "and the task log (`pvenode task list`) before acting again" % (op, vmid, bound, vmid, result["ct_status"], vmid),
                timed_out=True,
            )
        want = _ALREADY.get(op)
        if ran.rc == 0 and want and result["ct_status"] != want:
            result["ct_status"] = wait_for_status(pct, vmid, want, max(1.0, bound - ran.elapsed))
            if result["ct_status"] != want:
                how = ("it is HA-managed: pct only asked the HA manager (%r) and returned" % ran.stdout.strip()
                       if result["ha_request"] else "pct returned 0")
                raise _pct_host.PctHostFailure(
                    "`pct %s %d` did not lead to %s: %s, and CT %d was still %s after %d s. See `ha-manager status` "
                    "(an HA resource in the state error or ignored is not acted on)"
                    % (op, vmid, want, how, vmid, result["ct_status"], bound))
        if ran.rc != 0:
            if _ALREADY.get(op) == result["ct_status"] and _pct.classify_failure(ran.stderr) == _pct.FAIL_STOPPED:
                # stopped meanwhile (by a reboot that failed while starting, for example): the goal holds
                result.update(changed=False, msg="container %d is already %s" % (vmid, result["ct_status"]))
                return result
            lock = _pct.locked_by(ran.stderr)
            if lock:  # taken between our look and pct's
                raise _pct_host.PctHostFailure(_pct.locked_message(vmid, platform.node(), lock, _pct.quote(cmd)), lock=lock)
            last = [line for line in ran.stderr.splitlines() if line.strip()]
            raise _pct_host.PctHostFailure("`pct %s %d` failed (rc %d): %s" % (op, vmid, ran.rc, last[-1] if last else "no message"))
    except _pct_host.PctHostFailure as e:
        return _pct_host.failed(result, e)
    return result
