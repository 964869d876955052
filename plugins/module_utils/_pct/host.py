# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Running ``pct`` on the Proxmox VE host, shared by the proxmox_ct_exec and proxmox_ct_power runners
(``_pct.ct_exec``, ``_pct.ct_power``): the become prefix, the bounded run, the result both return.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on the PVE host).

Least privilege: the modules run as whatever user logged in. root runs pct as
is; any other user runs it through ``sudo -n`` (``pct_become_method``), so the
only rule a site grants is ``pveops ALL=(root) NOPASSWD: /usr/sbin/pct``, the
same one the pct_ssh connection needs. The command lines come from the one
builder in ``_pct.command``.
"""

from __future__ import annotations

import math
import os
import platform
import pwd
import time
import typing as t

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import command as _pct

STATUS_TIMEOUT = 60


class PctHostFailure(Exception):
    """Ends a module with fail_json(msg, **result)."""

    def __init__(self, msg: str, **result: t.Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.result = result


def login_user(uid: t.Optional[int] = None) -> str:
    """The name of UID (default: this process's effective user), or the number when it has no name."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def prefix_for(uid: int, method: str) -> t.List[str]:
    """The argv prefix that runs pct for UID: nothing for root, else METHOD (``sudo -n`` by default)."""
    return _pct.become_prefix("root" if uid == 0 else login_user(uid), method)


class Captured(t.NamedTuple):
    """What one bounded command on the host gave: the text it printed, how long it ran, whether it hung."""

    rc: int
    stdout: str
    stderr: str
    elapsed: float
    hung: bool

    def as_result(self) -> t.Dict[str, t.Any]:
        """The keys both modules return for the command they ran (it ran, so it counts as a change)."""
        return dict(changed=True, rc=self.rc, stdout=self.stdout, stderr=self.stderr, stdout_lines=self.stdout.splitlines(),
                    stderr_lines=self.stderr.splitlines(), elapsed=round(self.elapsed, 3))


def base_result(**extra: t.Any) -> t.Dict[str, t.Any]:
    """The result of a pct module before anything ran (the keys it always returns)."""
    return dict(changed=False, stdout="", stderr="", stdout_lines=[], stderr_lines=[], cmd=[], ct_status="unknown",
                lock=None, frozen=False, timed_out=False, elapsed=0.0, **extra)


def failed(result: t.Dict[str, t.Any], failure: PctHostFailure) -> t.Dict[str, t.Any]:
    """RESULT with what FAILURE adds, marked failed with its message."""
    return dict(result, **failure.result, failed=True, msg=failure.msg)


class CtState(t.NamedTuple):
    """A container as its PVE host sees it: pct's status, its config lock (None without one), and whether its
    cgroup is frozen (pct says running then)."""

    status: str
    lock: t.Optional[str]
    frozen: bool

    def as_result(self) -> t.Dict[str, t.Any]:
        return dict(ct_status=self.status, lock=self.lock, frozen=self.frozen)


def is_frozen(vmid: int, root: str = _pct.CGROUP_ROOT) -> bool:
    """Whether container VMID's cgroup is frozen, read from the cgroup files (world-readable: no pct, no root)."""
    for path in _pct.freeze_state_files(vmid, root):
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                if _pct.frozen_in(path, handle.read()):
                    return True
        except OSError:
            continue
    return False


# The options every module that runs pct has (their docs: the gpuops.repurpose.pct doc fragment).
PCT_ARGUMENT_SPEC: t.Dict[str, t.Dict[str, t.Any]] = dict(
    vmid=dict(type="int", required=True),
    pct_path=dict(type="path", default=_pct.DEFAULT_PCT_PATH),
    pct_become_method=dict(type="str", default="sudo"),
)


class PctHost(t.NamedTuple):
    """How this host runs pct for a module: its path, the become prefix for this user, the method's name (for
    messages), and the module whose ``run_command`` runs it."""

    module: t.Any
    path: str
    prefix: t.List[str]
    method: str

    @classmethod
    def from_params(cls, module: t.Any) -> PctHost:
        """From the module's ``pct_path`` and ``pct_become_method``; ``_pct.PctError`` for a bad method."""
        method = module.params["pct_become_method"]
        return cls(module, module.params["pct_path"], prefix_for(os.geteuid(), method), method)

    def argv(self, sub: str, vmid: int, *args: str) -> t.List[str]:
        return _pct.pct_argv(sub, vmid, *args, pct_path=self.path, prefix=self.prefix)

    def exec_argv(self, vmid: int, argv: t.List[str], keep_env: t.Optional[bool] = None) -> t.List[str]:
        return _pct.exec_argv(vmid, argv, keep_env=keep_env, pct_path=self.path, prefix=self.prefix)

    def run(self, argv: t.List[str], stdin: t.Optional[bytes], timeout: float) -> t.Tuple[int, bytes, bytes, bool]:
        """Run ARGV on the host under a host-side ``timeout -s KILL`` (it kills its whole process group).

        Returns (rc, stdout, stderr, hung). Nothing is expanded:
        ``expand_user_and_vars=False`` keeps ``~`` and ``$X`` in arguments literal.
        """
        limit = max(1, int(math.ceil(timeout)))
        started = time.monotonic()
        rc, out, err = self.module.run_command(
            ["timeout", "-s", "KILL", "%ds" % limit] + argv,
            data=stdin,
            binary_data=True,
            encoding=None,
            expand_user_and_vars=False,
            environ_update=dict(_pct.UTF8_CTYPE) if _pct.needs_utf8(argv) else None,
        )
        # GNU timeout sends the signal to its whole process group, itself included: SIGKILL ends it too, so
        # run_command sees -9 (a shell would show 128+9)
        hung = rc in (-9, 137) and time.monotonic() - started >= limit - 0.5
        return rc, out, err, hung

    def run_captured(self, argv: t.List[str], stdin: t.Optional[bytes], timeout: float) -> Captured:
        """:meth:`run`, timed, with its output decoded (undecodable bytes replaced)."""
        started = time.monotonic()
        rc, out, err, hung = self.run(argv, stdin, timeout)
        return Captured(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - started,
                        hung)

    def check(self) -> None:
        """Fail early, with where to run, when there is no pct here."""
        if not os.path.exists(self.path):
            raise PctHostFailure("%s not found: run this module on the Proxmox VE host (or set pct_path)" % self.path)

    def refused(self, stderr: str) -> t.Optional[str]:
        """The message for a become method that refused to run pct (or is not installed), or None when STDERR is
        something else."""
        kind = _pct.classify_failure(stderr)
        if kind == _pct.FAIL_NO_BECOME:
            return _pct.no_become_message(platform.node(), login_user(), self.method, self.path)
        if kind != _pct.FAIL_SUDO:
            return None
        user = login_user()
        first = stderr.strip().splitlines()[0] if stderr.strip() else "no output"
        return (
            "host user %s may not run %s through %s without a password (%s). Add the rule `%s` "
            "(for example in /etc/sudoers.d/pct), set pct_become_method, or log in as root"
            % (user, self.path, self.method, first, _pct.missing_rule_hint(user, self.method, self.path))
        )

    def status(self, vmid: int) -> str:
        """``pct status VMID`` -> running/stopped/...; raise ``PctHostFailure`` naming what went wrong."""
        try:
            return _pct.parse_pct_status(self._status_output(vmid))
        except _pct.PctError as e:
            raise PctHostFailure(str(e)) from None

    def state(self, vmid: int) -> CtState:
        """Container VMID's :class:`CtState` (``pct status --verbose`` and its cgroup); raise ``PctHostFailure``."""
        try:
            fields = _pct.parse_status_verbose(self._status_output(vmid, "--verbose"))
        except _pct.PctError as e:
            raise PctHostFailure(str(e)) from None
        status = fields["status"]
        return CtState(status, fields.get("lock") or None, status == "running" and is_frozen(vmid))

    def _status_output(self, vmid: int, *args: str) -> str:
        """The output of ``pct status VMID ARGS``; raise ``PctHostFailure`` naming what went wrong."""
        rc, out, err, hung = self.run(self.argv("status", vmid, *args), None, STATUS_TIMEOUT)
        text = err.decode("utf-8", "replace").strip()
        if hung:
            raise PctHostFailure("`pct status %d` did not answer within %d s" % (vmid, STATUS_TIMEOUT))
        if rc != 0:
            refused = self.refused(text)
            if refused:
                raise PctHostFailure(refused)
            if _pct.classify_failure(text) == _pct.FAIL_MISSING:
                raise PctHostFailure("container %d does not exist on this host (%s); check vmid against `pct list`"
                                     % (vmid, text), ct_status="missing")
            raise PctHostFailure("`pct status %d` failed (rc %d): %s" % (vmid, rc, text))
        return out.decode("utf-8", "replace")
