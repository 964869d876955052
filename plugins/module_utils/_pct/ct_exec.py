# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runner of ``proxmox_ct_exec``: one command in a container through ``pct exec``, bounded.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on the PVE host). :func:`exec_in_container`
takes the AnsibleModule (its params, check mode and ``run_command``) and returns
the module's result; the command lines come from ``_pct.command``, the host side from
``_pct.host``.
"""

from __future__ import annotations

import platform
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import command as _pct
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import host as _pct_host
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.host import PctHost
from ansible_collections.gpuops.repurpose.plugins.module_utils._pct.host import PctHostFailure as ExecFailure
from ansible_collections.gpuops.repurpose.plugins.module_utils._wait import Deadline

HOST_MARGIN = 30  # the in-container timeout acts first; this only guards against a hung pct/lxc-attach


def start_and_wait(pct: PctHost, vmid: int, timeout: int) -> None:
    deadline = Deadline(timeout)
    rc, out, err, hung = pct.run(pct.argv("start", vmid), None, max(1.0, deadline.remaining()))
    if hung or rc != 0:
        raise ExecFailure("`pct start %d` failed (rc %s): %s" % (vmid, rc, err.decode("utf-8", "replace").strip()), ct_status="stopped")
    probe = pct.exec_argv(vmid, ["true"])
    while True:
        rc, dummy_out, err, dummy_hung = pct.run(probe, None, max(1.0, min(deadline.remaining(), 10)))
        if rc == 0:
            return
        if deadline.expired():
            raise ExecFailure(
                "container %d was started but did not accept commands within start_timeout=%ds: %s"
                % (vmid, timeout, err.decode("utf-8", "replace").strip()),
                ct_status=pct.status(vmid),
                started=True,
            )
        time.sleep(min(0.2, deadline.remaining()))


def path_exists(pct: PctHost, vmid: int, path: str, keep_env: t.Optional[bool]) -> bool:
    rc, dummy_out, err, hung = pct.run(pct.exec_argv(vmid, ["test", "-e", path], keep_env=keep_env), None, 60)
    if hung or rc not in (0, 1):
        raise ExecFailure("could not check %s inside container %d (rc %s): %s" % (path, vmid, rc, err.decode("utf-8", "replace").strip()))
    return rc == 0


def exec_in_container(module: t.Any) -> t.Dict[str, t.Any]:
    """Run ``proxmox_ct_exec``: returns the module's result, with ``failed=True`` and ``msg`` on failure."""
    p = module.params
    result = _pct_host.base_result(started=False)
    try:
        vmid = _pct.validate_vmid(p["vmid"])
        pct = PctHost.from_params(module)
        argv = p["argv"] if p["argv"] is not None else [p["executable"], "-c", p["command"]]
        inner = _pct.wrap_argv(argv, chdir=p["chdir"], env=p["env"], timeout=p["timeout"], kill_after=p["kill_after"])
        cmd = pct.exec_argv(vmid, inner, keep_env=p["keep_env"])
        if p["start_timeout"] <= 0:
            raise _pct.PctError("start_timeout must be a positive number of seconds, got %d" % p["start_timeout"])
    except _pct.PctError as e:
        return dict(result, failed=True, msg=str(e))
    result["cmd"] = cmd
    try:
        pct.check()
        result.update(execute(pct, vmid, cmd, p))
    except ExecFailure as e:
        return _pct_host.failed(result, e)
    return result


def execute(pct: PctHost, vmid: int, cmd: t.List[str], p: t.Mapping[str, t.Any]) -> t.Dict[str, t.Any]:
    state = pct.state(vmid)
    status = state.status
    out: t.Dict[str, t.Any] = state.as_result()
    if state.frozen:
        raise ExecFailure(_pct.frozen_message(vmid, platform.node(), state.lock), **out)
    if status != "running":
        if not p["ensure_running"]:
            raise ExecFailure(
                "container %d is %s; nothing was run. Start it, or set ensure_running: true" % (vmid, status), ct_status=status
            )
        if pct.module.check_mode:
            out.update(changed=True, msg="would start container %d and run the command" % vmid)
            return out
        start_and_wait(pct, vmid, p["start_timeout"])
        out.update(started=True, changed=True, ct_status=pct.status(vmid))

    for path, want, verb in ((p["creates"], False, "exists"), (p["removes"], True, "does not exist")):
        if path and path_exists(pct, vmid, path, p["keep_env"]) != want:
            out.update(rc=0, msg="skipped, since %s %s" % (path, verb))
            return out

    if pct.module.check_mode:
        out.update(changed=True, msg="would run: %s" % _pct.quote(cmd))
        return out

    stdin = None
    if p["stdin"] is not None:
        stdin = (p["stdin"] + ("\n" if p["stdin_add_newline"] else "")).encode("utf-8")
    limit = p["timeout"] + p["kill_after"] + HOST_MARGIN
    ran = pct.run_captured(cmd, stdin, limit)
    out.update(ran.as_result())
    unknown_option = _pct.keep_env_unknown(ran.stderr, platform.node())
    if ran.hung:
        out.update(failed=True, timed_out=True, msg="pct exec did not return within %ds; killed it (and its process group) on the host" % limit)
    elif ran.rc in _pct.TIMEOUT_RCS and ran.elapsed >= p["timeout"] - 0.5:
        out.update(
            failed=True,
            timed_out=True,
            msg="command timed out after %ds inside container %d and was killed with its process group (SIGTERM, then SIGKILL after %ds)"
            % (p["timeout"], vmid, p["kill_after"]),
        )
    elif ran.rc == 127 and "timeout" in ran.stderr and "not found" in ran.stderr:
        out.update(failed=True, msg="GNU timeout is missing inside container %d: install coreutils there" % vmid)
    elif ran.rc == _pct.CHDIR_FAILED_RC and "cannot enter directory" in ran.stderr:
        out.update(failed=True, msg="chdir %s does not exist inside container %d; nothing was run" % (p["chdir"], vmid))
    elif unknown_option:
        out.update(failed=True, msg=unknown_option)
    elif ran.rc != 0:
        kind = _pct.classify_failure(ran.stderr)
        if kind == _pct.FAIL_STOPPED:
            out["ct_status"] = pct.status(vmid)
        out.update(failed=True, msg="non-zero return code")
    return out
