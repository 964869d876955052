# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: pct_ssh
short_description: Run tasks inside a Proxmox VE LXC container through C(pct exec) over SSH
version_added: 1.0.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Connects with paramiko to the Proxmox VE host that runs the container and runs every command
    as C(pct exec VMID -- /bin/sh -c CMD), so any module (M(ansible.builtin.template), M(ansible.builtin.pip),
    M(ansible.builtin.systemd_service), ...) works inside a container that has no sshd of its own.
  - The command is built as an argument list and quoted exactly once for the host's shell, and the VMID is
    validated as an integer, so quotes, C($), backticks, newlines and non-ASCII text in commands and
    paths arrive intact and a VMID such as C(200; reboot) is refused before anything runs.
  - "A non-root host user runs C(pct) through C(sudo -n) (see O(proxmox_become_method)): a missing sudo rule
    fails at once, naming the rule to add, instead of waiting for a password."
  - stdout and stderr are kept apart (no pty unless O(pty) is set), every command is bounded by
    O(command_timeout), and a command killed by a signal is reported as such.
  - Files move by SFTP to a private temporary directory on the host plus C(pct push)/C(pct pull), streamed in
    blocks (no file is read into memory whole); where the host has no SFTP server they are streamed through
    C(cat) inside the container instead. Pipelining is supported.
  - "Every copy is checked, because C(pct push) and C(pct pull) exit 0 when they fail (pve-container gives them no
    exit-code handler): a push is followed by the copy's size read inside the container, a pull by both files'
    SHA-256, and a copy that pct reported only on stderr, or that came out short (a full disk), fails the task naming
    pct's message or the sizes. A failed fetch leaves no file on the controller. The container needs C(stat) and
    C(sha256sum) (coreutils or busybox)."
  - Unprivileged containers work as privileged ones do. C(pct push) creates a file as the container's root (host
    uid 100000 by default), and the task then sets the owner and mode it asks for, inside the container.
  - "A frozen container (a backup in suspend mode freezes it until the backup ends; C(pct status) still says
    C(running) and C(pct exec) would hang) fails at once with its own message: every command line first reads the
    container's cgroup freeze state on the host, in the same round trip."
  - One SSH connection per host and identity is kept open by a small control master process (like
    OpenSSH's ControlPersist) and reused by all tasks, including tasks for other containers on the same host.
    It is found by everything that authenticates it (host, port, user, password digest, key file path and a digest
    of its content, the default keys and the agent socket when they may be used, known_hosts file, host key
    policy, O(proxmox_become_method), O(pct_path), the controller user), so a job with other credentials never
    reuses another's logged-in connection. Its socket (mode 0600) lies in O(control_path_dir) (mode 0700, owned by
    the controller user; a foreign or symlinked directory is refused).
  - "When the controller (C(ansible-playbook)) dies, even by a C(kill -9) of its process group only, each of its task workers
    using this connection ends too (Linux: the kernel's parent-death signal, SIGTERM), instead of going on alone as
    ansible-core's workers, which leave that group, otherwise do; a module that finishes on its own, such as
    M(gpuops.repurpose.training_stop), finishes in the container and leaves its result for the re-run."
  - A stopped container, a frozen one, a missing container (or one on another cluster node), an unreachable host,
    a refused login and an unknown host key each fail with their own message.
  - Option and variable names follow P(community.proxmox.proxmox_pct_remote#connection) where they mean the same,
    so an inventory can switch between the two.
requirements:
  - paramiko (on the controller)
  - C(pct) on the Proxmox VE host, and C(/bin/sh) inside the container
extends_documentation_fragment:
  - gpuops.repurpose.pct_ssh
  - gpuops.repurpose.pct_ssh.session
options:
  vmid:
    description:
      - The VMID of the container (an integer from 100 to 999999999, as in C(pct list)).
      - Must be set; anything that is not such an integer is refused before a command is built.
    type: int
    vars:
      - name: proxmox_vmid
  pct_path:
    description: Path of C(pct) on the Proxmox VE host.
    type: string
    default: /usr/sbin/pct
    vars:
      - name: proxmox_pct_path
  proxmox_become_method:
    description:
      - How a non-root O(pve_user) runs C(pct) on the host. V(sudo) and V(doas) run non-interactively
        (C(sudo -n)); V(none) runs C(pct) directly; any other value is used as a literal command prefix.
      - "With sudo the host needs a rule such as 'pveops ALL=(root) NOPASSWD: /usr/sbin/pct'."
    type: string
    default: sudo
    vars:
      - name: proxmox_become_method
  keep_env:
    description:
      - Pass C(--keep-env 1) (V(true)) or C(--keep-env 0) (V(false)) to C(pct exec). Unset passes nothing, which
        works on every release (Proxmox VE 8 and 9 keep the environment by default).
      - A host whose C(pct) is older than pve-container 5.0.9 (Proxmox VE 8.0 or 8.1 not updated) does not know the
        option; a set value fails there with a message saying so.
    type: boolean
    vars:
      - name: proxmox_keep_env
notes:
  - Commands run as root inside the container (that is what C(pct exec) does). C(become) inside the container
    works for methods that need no password as root (C(sudo), C(su)); a C(become_password) is not supported.
  - The control master is a child Python process of the controller that exits O(control_persist) seconds after
    its last use, or when its SSH connection drops (failing every request still waiting on it, see
    O(server_alive_interval)); the C(reset_connection) meta task ends it at once.
  - A command cut off by a dead connection may have run in part inside the container. A module that must finish
    what it started (M(gpuops.repurpose.training_stop)) does so on its own and leaves its result for the next run.
  - Host keys are checked by default. The simplest safe set-up is O(known_hosts_file) pointing at a file that
    holds the host's key.
seealso:
  - module: gpuops.repurpose.proxmox_ct_exec
  - name: community.proxmox.proxmox_pct_remote
    description: The connection this one follows in option names.
    link: https://docs.ansible.com/ansible/latest/collections/community/proxmox/proxmox_pct_remote_connection.html
"""

EXAMPLES = r"""
# inventories/ct200/hosts.yml: CT200 on pve1.example.internal, reached as the sudo user "pveops".
# The host needs the sudoers rule
#   pveops ALL=(root) NOPASSWD: /usr/sbin/pct
# and the controller needs the host key in the known_hosts file named below.
all:
  children:
    containers:
      hosts:
        ct200:
          ansible_connection: gpuops.repurpose.pct_ssh
          ansible_host: pve1.example.internal
          ansible_port: 22
          ansible_user: pveops
          ansible_ssh_private_key_file: ~/.ssh/id_ed25519_pve
          ansible_pct_ssh_known_hosts_file: ~/.ssh/known_hosts
          proxmox_vmid: 200
          ansible_python_interpreter: /usr/bin/python3
    pve_hosts:
      hosts:
        pve1:
          ansible_host: pve1.example.internal
          # the same pct-only sudo rule is enough here for gpuops.repurpose.proxmox_ct_exec/proxmox_ct_power
          ansible_user: pveops

# A playbook: the tasks run inside CT200.
# - hosts: ct200
#   gather_facts: false
#   tasks:
#     - name: Any module works inside the container
#       ansible.builtin.command: nvidia-smi --query-gpu=memory.used --format=csv
#
#     - name: A long install gets a longer bound than the default hour
#       ansible.builtin.pip:
#         name: sglang
#       vars:
#         ansible_pct_ssh_command_timeout: 7200
"""

import contextlib
import getpass
import hashlib
import os
import stat
import typing as t

from ansible.errors import AnsibleAuthenticationFailure, AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display
from ansible.utils.hashing import secure_hash

from ansible_collections.gpuops.repurpose.plugins.module_utils._pct import command as _pct
from ansible_collections.gpuops.repurpose.plugins.plugin_utils import _pct_ssh, _pct_ssh_vars, _pct_ssh_worker

display = Display()

# in-process sessions for control_persist=0 (one per worker, reused within a task)
_DIRECT: t.Dict[str, _pct_ssh.DirectSession] = {}


@contextlib.contextmanager
def _no_file_left_on_failure(path: str) -> t.Iterator[None]:
    """Remove PATH (a fetch's destination on the controller) when the block fails: no empty or partial file."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


class Connection(ConnectionBase):
    """Tasks inside a Proxmox VE container, through ``pct`` on its host over SSH."""

    transport = "gpuops.repurpose.pct_ssh"
    has_pipelining = True
    # The user commands run as on the target (inside the container: pct exec runs as root). ActionBase takes
    # it for `~`, remote_tmp, async_dir and become decisions; it asks get_option('remote_user') first, which
    # this plugin leaves undefined (the host login is `pve_user`), and then this attribute.
    default_user = "root"

    @property
    def has_tty(self) -> bool:  # type: ignore[override]
        """Only with ``pty`` set: a become plugin that needs a terminal is refused otherwise."""
        try:
            return bool(self.get_option("pty"))
        except KeyError:
            return False

    def __init__(self, *args: t.Any, **kwargs: t.Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: t.Any = None
        self._settings: t.Optional[_pct_ssh.Settings] = None

    # -- settings -------------------------------------------------------------
    def set_options(self, task_keys: t.Any = None, var_options: t.Any = None, direct: t.Any = None) -> None:
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # Ansible passes only the variables our options declare; ssh_only_vars declares ssh's so they reach here.
        # Identical warnings are shown once per run, so each name is warned about once, not per host and task.
        for msg in _pct_ssh_vars.ignored_var_warnings(var_options or {}):
            display.warning(msg)

    def _host(self) -> str:
        return "%s:%s" % (self.get_option("remote_addr"), self.get_option("port"))

    def _vmid(self) -> int:
        value = self.get_option("vmid")
        if value is None:
            raise AnsibleError("pct_ssh: set proxmox_vmid (the container's VMID, e.g. 200) for host %s" % self._host())
        try:
            return _pct.validate_vmid(value, option="proxmox_vmid")
        except _pct.PctError as e:
            raise AnsibleError("pct_ssh: %s" % e) from None

    def _user(self) -> str:
        # like ssh: no login user means the controller's own user name (not necessarily root)
        return self.get_option("pve_user") or getpass.getuser()

    def _prefix(self) -> t.List[str]:
        try:
            return _pct.become_prefix(self._user(), self.get_option("proxmox_become_method"))
        except _pct.PctError as e:
            raise AnsibleError("pct_ssh: %s" % e) from None

    def _build_settings(self) -> _pct_ssh.Settings:
        try:
            alive = _pct_ssh.validate_alive(self.get_option("server_alive_interval"), self.get_option("server_alive_count_max"))
        except _pct_ssh.SessionError as e:
            raise AnsibleError("pct_ssh: %s (ansible_pct_ssh_server_alive_interval / ansible_pct_ssh_server_alive_count_max)" % e.msg) from None
        return _pct_ssh.Settings(
            host=self.get_option("remote_addr"),
            port=int(self.get_option("port") or 22),
            user=self._user(),
            password=self.get_option("password"),
            key_filename=self.get_option("private_key_file"),
            look_for_keys=self.get_option("look_for_keys"),
            connect_timeout=float(self.get_option("timeout")),
            banner_timeout=float(self.get_option("banner_timeout")),
            host_key_checking=self.get_option("host_key_checking"),
            host_key_auto_add=bool(self.get_option("host_key_auto_add")),
            record_host_keys=self.get_option("record_host_keys"),
            known_hosts_file=self.get_option("known_hosts_file"),
            lock_file_timeout=float(self.get_option("lock_file_timeout")),
            proxy_command=self.get_option("proxy_command") or None,
            use_rsa_sha2_algorithms=self.get_option("use_rsa_sha2_algorithms"),
            server_alive_interval=alive[0],
            server_alive_count_max=alive[1],
            # how this login runs pct: a connection opened for one way is not lent to another
            identity_extra={"proxmox_become_method": self.get_option("proxmox_become_method"), "pct_path": self.get_option("pct_path")},
        )

    # -- connection -----------------------------------------------------------
    def _connect(self) -> Connection:
        if self._connected and self._session is not None:
            return self
        # ansible-core's workers setsid out of the controller's process group: a kill -9 of that group (a
        # cancelled job) would leave this worker waiting on its command for good; the kernel ends it instead
        _pct_ssh_worker.tie_worker_to_controller()
        # bad input fails here, before anything reaches the network
        self._vmid()
        self._prefix()
        settings = self._build_settings()
        bad_key = _pct_ssh.key_file_problem(settings.key_filename)
        if bad_key:
            raise AnsibleError("pct_ssh: %s." % bad_key)
        persist = int(self.get_option("control_persist"))
        display.vvv("PCT_SSH CONNECT %s (control_persist=%s)" % (settings.host_label(), persist), host=self._host())
        try:
            if persist > 0:
                start = settings.connect_timeout * 2 + settings.banner_timeout + 15
                self._session = _pct_ssh.open_master(settings, self.get_option("control_path_dir"), persist, start)
            else:
                key = settings.cache_key()
                cached = _DIRECT.get(key)
                if cached is None or not cached.alive():
                    cached = _DIRECT[key] = _pct_ssh.DirectSession(settings).connect()
                self._session = cached
        except _pct_ssh.SessionError as e:
            raise self._failure(e, settings) from None
        self._settings = settings
        self._connected = True
        return self

    def _failure(self, e: _pct_ssh.SessionError, settings: t.Optional[_pct_ssh.Settings] = None) -> AnsibleError:
        s = settings or self._settings or self._build_settings()
        where = "the Proxmox VE host %s:%s" % (s.host, s.port)
        if e.kind == "unreachable":
            return AnsibleConnectionFailure(
                "pct_ssh: cannot reach %s: %s. Check ansible_host/ansible_port and that sshd listens there." % (where, e.msg)
            )
        if e.kind == "auth":
            return AnsibleAuthenticationFailure(
                "pct_ssh: login to %s as %s failed (%s). Check ansible_user and ansible_ssh_private_key_file "
                "(or ansible_password)." % (where, s.user or "(default user)", e.msg)
            )
        if e.kind in ("hostkey_unknown", "hostkey_mismatch"):
            return AnsibleConnectionFailure("pct_ssh: %s" % e.msg)
        if e.kind == "lost":
            return AnsibleConnectionFailure(
                "pct_ssh: %s (%s). The next task opens a fresh connection; a re-run is safe for modules that finish on "
                "their own (training_stop leaves its result in the container)." % (e.msg, where)
            )
        return AnsibleConnectionFailure("pct_ssh: %s (%s)" % (e.msg, where))

    def is_pipelining_enabled(self, wrap_async: bool = False) -> bool:
        # a pty would echo and mangle the module fed on stdin
        if self.get_option("pty"):
            return False
        return super().is_pipelining_enabled(wrap_async)

    def _run(
        self, line: str, stdin: t.Optional[bytes] = None, timeout: t.Optional[float] = None, pty: bool = False, **kw: t.Any
    ) -> _pct_ssh.ExecResult:
        """Run host shell text LINE; reconnect once if the connection had gone before it ran."""
        self._connect()
        timeout = float(timeout if timeout is not None else self.get_option("command_timeout"))
        display.vvv("PCT_SSH EXEC %s" % line, host=self._host())
        for attempt in (1, 2):
            try:
                return self._session.exec(line, stdin=stdin, timeout=timeout, pty=pty, **kw)
            except _pct_ssh.SessionError as e:
                if e.kind == "gone" and attempt == 1:
                    self._connected = False
                    self._session = None
                    _DIRECT.pop(self._build_settings().cache_key(), None)
                    self._connect()
                    continue
                raise self._failure(e) from None
        raise AssertionError("unreachable")

    def _run_in(self, vmid: int, line: str, **kw: t.Any) -> _pct_ssh.ExecResult:
        """Run host shell text LINE, which runs pct against container VMID, unless the container is frozen: a
        backup in suspend mode freezes it, `pct status` still says running and `pct exec` would hang until the
        backup ends, so the host's cgroup files are read first (no extra round trip) and a frozen CT fails here."""
        res = self._run(_pct.with_utf8_ctype(_pct.then(_pct.frozen_guard(vmid), line)), **kw)
        if res.rc == _pct.FROZEN_RC and _pct.FROZEN_MARK in to_text(res.stderr, errors="surrogate_or_replace"):
            raise AnsibleConnectionFailure("pct_ssh: %s" % _pct.frozen_message(vmid, self._host()))
        return res

    def _diagnose(self, vmid: int, res: _pct_ssh.ExecResult) -> None:
        """Raise the specific failure when pct or sudo (not the command) failed.

        The command's own stderr could mimic pct's messages, so a suspicious
        failure is confirmed with ``pct status`` before the container is blamed.
        """
        stderr = to_text(res.stderr, errors="surrogate_or_replace")
        unknown = _pct.keep_env_unknown(stderr, self._host())
        if unknown:
            raise AnsibleConnectionFailure("pct_ssh: %s (proxmox_keep_env)." % unknown)
        if _pct.classify_failure(stderr) is None:
            return
        status_line = _pct.quote(_pct.pct_argv("status", vmid, pct_path=self.get_option("pct_path"), prefix=self._prefix()))
        st = self._run(status_line, timeout=60)
        err = to_text(st.stderr, errors="surrogate_or_replace").strip()
        if st.rc == 0:
            try:
                state = _pct.parse_pct_status(to_text(st.stdout, errors="surrogate_or_replace"))
            except _pct.PctError:
                return
            if state == "running":
                return  # the command itself failed; its rc and output go back to Ansible
            raise AnsibleConnectionFailure(
                "pct_ssh: container %d on %s is %s. Start it first (`pct start %d` on the host, or the "
                "gpuops.repurpose.proxmox_ct_exec module with ensure_running: true)." % (vmid, self._host(), state, vmid)
            )
        kind = _pct.classify_failure(err)
        if kind == _pct.FAIL_SUDO:
            raise AnsibleConnectionFailure(
                "pct_ssh: host user %s may not run pct through %s without a password on %s (%s). Add the rule "
                "`%s` (for example in /etc/sudoers.d/pct), or connect as root."
                % (
                    self._user(),
                    self.get_option("proxmox_become_method"),
                    self._host(),
                    err.splitlines()[0] if err else "no output",
                    _pct.missing_rule_hint(self._user(), self.get_option("proxmox_become_method"), self.get_option("pct_path")),
                )
            )
        if kind == _pct.FAIL_MISSING:
            node = None
            # /etc/pve/.vmlist is root:www-data 0440 (pmxcfs): only root can read where the container lives
            if self._user() == "root":
                vl = self._run("cat /etc/pve/.vmlist", timeout=30)
                if vl.rc == 0:
                    node = _pct.parse_vmlist(to_text(vl.stdout, errors="surrogate_or_replace"), vmid)
            where = (
                "it is on cluster node %s: point ansible_host at that node" % node
                if node
                else "check proxmox_vmid against `pct list`, or whether it lives on another cluster node (as root on "
                "any node, /etc/pve/.vmlist names the node of every guest)"
            )
            raise AnsibleConnectionFailure("pct_ssh: container %d does not exist on %s (%s); %s." % (vmid, self._host(), err, where))
        if kind == _pct.FAIL_NO_BECOME:
            raise AnsibleConnectionFailure("pct_ssh: %s (%s)." % (
                _pct.no_become_message(self._host(), self._user(), self.get_option("proxmox_become_method"), self.get_option("pct_path")), err))
        if kind == _pct.FAIL_PCT_NOT_FOUND:
            raise AnsibleConnectionFailure(
                "pct_ssh: %s cannot run %s (%s). Is %s a Proxmox VE host? Set proxmox_pct_path if pct lives elsewhere."
                % (self._host(), self.get_option("pct_path"), err, self._host())
            )
        if kind == _pct.FAIL_NOT_ROOT:
            raise AnsibleConnectionFailure(
                "pct_ssh: pct refused host user %s on %s (%s). Connect as root or set proxmox_become_method." % (self._user(), self._host(), err)
            )

    def _pct(self, argv: t.List[str], what: str, vmid: int, **kw: t.Any) -> _pct_ssh.ExecResult:
        res = self._run_in(vmid, _pct.quote(argv), **kw)
        if res.timed_out:
            raise AnsibleError("pct_ssh: %s in container %d did not finish within command_timeout=%ss" % (what, vmid, self.get_option("command_timeout")))
        if res.rc != 0:
            self._diagnose(vmid, res)
            raise AnsibleError(
                "pct_ssh: %s in container %d failed (rc %s): %s"
                % (what, vmid, res.rc, to_text(res.stderr or res.stdout, errors="surrogate_or_replace").strip())
            )
        return res

    # -- ConnectionBase API ------------------------------------------------------
    def exec_command(self, cmd: str, in_data: t.Optional[bytes] = None, sudoable: bool = True) -> t.Tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        if sudoable and self.become and self.become.expect_prompt():
            raise AnsibleError(
                "pct_ssh: become with a password inside the container is not supported. pct exec already runs as the "
                "container's root, so become_user works without become_password (sudo/su as root need none)."
            )
        vmid = self._vmid()
        try:
            argv = _pct.shell_exec_argv(
                vmid, cmd, keep_env=self.get_option("keep_env"), pct_path=self.get_option("pct_path"), prefix=self._prefix()
            )
        except _pct.PctError as e:
            raise AnsibleError("pct_ssh: %s" % e) from None
        res = self._run_in(vmid, _pct.quote(argv), stdin=in_data, pty=bool(self.get_option("pty")))
        if res.timed_out:
            raise AnsibleError(
                "pct_ssh: command in container %d on %s did not finish within command_timeout=%ss; the channel was closed. "
                "Raise ansible_pct_ssh_command_timeout or run the task with async. Command: %s"
                % (vmid, self._host(), self.get_option("command_timeout"), cmd[:200])
            )
        if res.rc != 0:
            self._diagnose(vmid, res)
        stderr = res.stderr
        if res.signalled:
            stderr += b"\npct_ssh: the command was killed by a signal (the SSH server reported no exit status)\n"
        return res.rc, res.stdout, stderr

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        display.vvv("PCT_SSH PUT %s TO %s" % (in_path, out_path), host=self._host())
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound("file or module does not exist: %s" % in_path)
        vmid = self._vmid()
        if self._by_sftp(lambda: self._put_sftp(vmid, in_path, out_path)):
            return
        script = 'cat > "$1" && shift && exec "$@"'
        argv = self._exec_argv(vmid, ["/bin/sh", "-c", script, "sh", out_path] + _pct.SIZE_PROBE + [out_path])
        self._pushed(_pct.quote(argv), "writing %s" % out_path, vmid, in_path, stdin_path=in_path)

    def _by_sftp(self, copy: t.Callable[[], None]) -> bool:
        """Run COPY, an SFTP transfer, unless transfer_method is cat; False when the cat fallback is to run."""
        method = self.get_option("transfer_method")
        if method == "cat":
            return False
        try:
            copy()
            return True
        except _pct_ssh.SessionError as e:
            if e.kind != "sftp_unavailable" or method == "sftp":
                raise self._failure(e) from None
            display.vvv("PCT_SSH no SFTP on the host (%s): streaming through cat" % e.msg, host=self._host())
        return False

    def _exec_argv(self, vmid: int, argv: t.List[str]) -> t.List[str]:
        return _pct.exec_argv(vmid, argv, pct_path=self.get_option("pct_path"), prefix=self._prefix())

    def _copy_failed(self, res: _pct_ssh.ExecResult, what: str, vmid: int, problem: t.Optional[str]) -> None:
        """Fail the copy WHAT naming PROBLEM (pct's message, or what the checks found), if there is one."""
        if res.timed_out:
            raise AnsibleError("pct_ssh: %s in container %d did not finish within command_timeout=%ss" % (what, vmid, self.get_option("command_timeout")))
        if problem is not None:
            if res.rc != 0:
                self._diagnose(vmid, res)
            raise AnsibleError("pct_ssh: %s in container %d on %s failed: %s" % (what, vmid, self._host(), problem))

    def _pushed(self, line: str, what: str, vmid: int, in_path: str, **kw: t.Any) -> None:
        """Run LINE, a copy of IN_PATH whose last command prints the copy's size; fail unless it is whole."""
        res = self._run_in(vmid, line, **kw)
        stdout, stderr = to_text(res.stdout, errors="surrogate_or_replace"), to_text(res.stderr, errors="surrogate_or_replace")
        self._copy_failed(res, what, vmid, _pct.copy_problem(res.rc, stderr, os.path.getsize(in_path), _pct.parse_size(stdout)))

    def _put_sftp(self, vmid: int, in_path: str, out_path: str) -> None:
        self._connect()
        tmpdir = self._session.mkdtemp()
        try:
            tmp = tmpdir + "/file"
            self._session.put(in_path, tmp)
            perms = stat.S_IMODE(os.stat(in_path).st_mode)
            push = _pct.transfer_argv("push", vmid, tmp, out_path, perms=perms, pct_path=self.get_option("pct_path"), prefix=self._prefix())
            probe = self._exec_argv(vmid, _pct.SIZE_PROBE + [out_path])
            self._pushed(_pct.then(_pct.quote(push), _pct.quote(probe)), "pct push to %s" % out_path, vmid, in_path)
        finally:
            self._cleanup(tmpdir)

    def _cleanup(self, tmpdir: str) -> None:
        try:
            self._session.rmtree(tmpdir)
        except _pct_ssh.SessionError as e:
            display.warning("pct_ssh: could not remove the temporary directory %s on %s: %s" % (tmpdir, self._host(), e.msg))

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        display.vvv("PCT_SSH FETCH %s TO %s" % (in_path, out_path), host=self._host())
        vmid = self._vmid()
        if self._by_sftp(lambda: self._fetch_sftp(vmid, in_path, out_path)):
            return
        # pct exec passes cat's exit status on, so a short read fails here; a failed fetch leaves no file behind
        with _no_file_left_on_failure(out_path):
            self._pct(self._exec_argv(vmid, ["cat", "--", in_path]), "reading %s" % in_path, vmid, stdout_path=out_path)

    def _fetch_sftp(self, vmid: int, in_path: str, out_path: str) -> None:
        self._connect()
        tmpdir = self._session.mkdtemp()
        try:
            tmp = tmpdir + "/file"
            user = None if self._user() == "root" else self._user()  # so the SFTP login can read what root pulled
            # the source's digest first (its absence fails here with the reason), then the pull, then the
            # pulled file's digest: pct pull exits 0 when it fails, leaving an empty file
            source = self._exec_argv(vmid, _pct.DIGEST_PROBE + [in_path])
            pull = _pct.transfer_argv("pull", vmid, in_path, tmp, user=user, pct_path=self.get_option("pct_path"), prefix=self._prefix())
            line = _pct.then(_pct.quote(source), _pct.quote(pull), _pct.quote(_pct.DIGEST_PROBE + [tmp]))
            res = self._run_in(vmid, line)
            digests = _pct.parse_digests(to_text(res.stdout, errors="surrogate_or_replace"))
            stderr = to_text(res.stderr, errors="surrogate_or_replace")
            self._copy_failed(res, "pct pull of %s" % in_path, vmid, _pct.pull_problem(res.rc, stderr, digests))
            with _no_file_left_on_failure(out_path):
                self._session.get(tmp, out_path)
                if secure_hash(out_path, hash_func=hashlib.sha256) != digests[0]:
                    raise AnsibleError("pct_ssh: fetching %s from container %d: the copy on the controller differs from the source" % (in_path, vmid))
        finally:
            self._cleanup(tmpdir)

    def reset(self) -> None:
        """End the shared connection (``meta: reset_connection``); the next task opens a fresh one."""
        settings = self._build_settings()
        _pct_ssh.MasterClient(_pct_ssh.control_path(settings, self.get_option("control_path_dir"))).stop()
        direct = _DIRECT.pop(settings.cache_key(), None)
        if direct is not None:
            direct.close()
        self._session = None
        self._connected = False

    def close(self) -> None:
        # the shared connection outlives the task on purpose (control_persist)
        self._session = None
        self._connected = False
