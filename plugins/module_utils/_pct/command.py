# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one ``pct`` command builder, shared by the ``pct_ssh`` connection plugin and
the ``proxmox_ct_exec`` module.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets, py>=3.9). Everything here is a
pure function: it validates, builds argv lists and quotes them exactly once for
the host shell with ``shlex.join``; it never runs anything. Bad input raises
``PctError`` with a message that names the option and the fix.

Why argv lists: ``pct exec`` hands its arguments to ``lxc-attach`` without a
shell, so the only shell that ever parses our text is the PVE host's login shell
(when the command travels over SSH). Quoting once for that shell, and never
joining with spaces, is what keeps ``200; reboot`` a (rejected) VMID and a
command with quotes, ``$``, backticks or newlines intact.
"""

from __future__ import annotations

import json
import re
import shlex
import typing as t

VMID_MIN = 100
VMID_MAX = 999999999
DEFAULT_PCT_PATH = "/usr/sbin/pct"
DEFAULT_SHELL = "/bin/sh"

# `pct push/pull --user/--group` take a name or a numeric id
_OWNER_RE = re.compile(r"^(?:[0-9]+|[A-Za-z_][A-Za-z0-9_.-]*\$?)$")
_PERMS_RE = re.compile(r"^0?[0-7]{3,4}$")
_STATUS_RE = re.compile(r"^status:\s*(\S+)\s*$", re.MULTILINE)

# become methods whose non-interactive flag we know; anything else is taken as
# a literal command prefix (the user then owns its non-interactivity)
_BECOME_PREFIXES: t.Dict[str, t.List[str]] = {
    "sudo": ["sudo", "-n"],
    "doas": ["doas", "-n"],
    "none": [],
}


class PctError(ValueError):
    """Invalid input for a ``pct`` command (bad VMID, empty argv, ...)."""


def validate_vmid(value: t.Any, option: str = "vmid") -> int:
    """Return VALUE as an int VMID in 100..999999999, or raise ``PctError``.

    Accepts an int or a string of decimal digits (inventory values are often
    strings); anything else, including ``"200; reboot"``, ``True`` and ``200.0``,
    is refused before any command is built.
    """
    if isinstance(value, bool):
        raise PctError("%s must be an integer VMID between %d and %d, got a boolean %r" % (option, VMID_MIN, VMID_MAX, value))
    if isinstance(value, int):
        vmid = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,10}", value.strip()):
        vmid = int(value.strip())
    else:
        raise PctError(
            "%s must be an integer VMID between %d and %d (the number in `pct list`), got %r" % (option, VMID_MIN, VMID_MAX, value)
        )
    if not VMID_MIN <= vmid <= VMID_MAX:
        raise PctError("%s must be between %d and %d (Proxmox VMID range), got %d" % (option, VMID_MIN, VMID_MAX, vmid))
    return vmid


def _check_argv(argv: t.Sequence[t.Any], option: str) -> t.List[str]:
    if isinstance(argv, (str, bytes)):
        raise PctError("%s must be a list of strings (one per argument), got a single string" % option)
    out = []
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise PctError("%s[%d] must be a string, got %s %r" % (option, i, type(arg).__name__, arg))
        if "\x00" in arg:
            raise PctError("%s[%d] contains a NUL byte, which no program argument can carry" % (option, i))
        out.append(arg)
    if not out:
        raise PctError("%s must not be empty: give the program to run as its first element" % option)
    return out


def _check_path(path: t.Any, option: str) -> str:
    if not isinstance(path, str) or not path:
        raise PctError("%s must be a non-empty path string, got %r" % (option, path))
    if "\x00" in path:
        raise PctError("%s contains a NUL byte" % option)
    return path


def become_prefix(host_user: t.Optional[str], method: str = "sudo") -> t.List[str]:
    """The argv prefix that lets HOST_USER run ``pct`` without a prompt.

    root needs none. ``sudo``/``doas`` get ``-n`` so a missing rule fails at once
    instead of waiting for a password; ``none`` means the user may run pct as is;
    any other value is split as a literal command prefix.
    """
    if host_user in (None, "", "root"):
        return []
    if not isinstance(method, str) or not method.strip():
        raise PctError("pct_become_method must be a non-empty string such as 'sudo', 'doas' or 'none'")
    known = _BECOME_PREFIXES.get(method.strip())
    if known is not None:
        return list(known)
    return shlex.split(method)


def missing_rule_hint(host_user: str, method: str = "sudo", pct_path: str = DEFAULT_PCT_PATH) -> str:
    """The sudoers/doas line a non-root HOST_USER needs; used in error messages."""
    if method.strip() == "doas":
        return "permit nopass %s as root cmd %s" % (host_user, pct_path)
    return "%s ALL=(root) NOPASSWD: %s" % (host_user, pct_path)


def pct_argv(
    sub: str,
    vmid: t.Any,
    *args: str,
    pct_path: str = DEFAULT_PCT_PATH,
    prefix: t.Sequence[str] = (),
) -> t.List[str]:
    """``[prefix...] pct SUB VMID args...`` for the simple subcommands (status, start, config...)."""
    if sub not in ("status", "start", "stop", "shutdown", "reboot", "config", "push", "pull", "exec"):
        raise PctError("unsupported pct subcommand %r" % sub)
    return list(prefix) + [_check_path(pct_path, "pct_path"), sub, str(validate_vmid(vmid))] + list(args)


def exec_argv(
    vmid: t.Any,
    argv: t.Sequence[str],
    keep_env: t.Optional[bool] = None,
    pct_path: str = DEFAULT_PCT_PATH,
    prefix: t.Sequence[str] = (),
) -> t.List[str]:
    """``[prefix...] pct exec VMID [--keep-env 0|1] -- ARGV...``.

    ``keep_env`` None leaves pct's own default (which differs between PVE
    releases); True/False pins it.
    """
    argv = _check_argv(argv, "argv")
    opts: t.List[str] = []
    if keep_env is not None:
        opts = ["--keep-env", "1" if keep_env else "0"]
    return pct_argv("exec", vmid, *opts, "--", *argv, pct_path=pct_path, prefix=prefix)


def shell_exec_argv(
    vmid: t.Any,
    command: str,
    shell: str = DEFAULT_SHELL,
    keep_env: t.Optional[bool] = None,
    pct_path: str = DEFAULT_PCT_PATH,
    prefix: t.Sequence[str] = (),
) -> t.List[str]:
    """``pct exec VMID -- SHELL -c COMMAND``: COMMAND is shell text for the container's shell."""
    if not isinstance(command, str):
        raise PctError("command must be a string, got %s" % type(command).__name__)
    return exec_argv(vmid, [_check_path(shell, "shell"), "-c", command], keep_env=keep_env, pct_path=pct_path, prefix=prefix)


def _format_perms(perms: t.Any) -> str:
    if isinstance(perms, bool):
        raise PctError("perms must be an octal mode like '0644', got %r" % perms)
    if isinstance(perms, int):
        if not 0 <= perms <= 0o7777:
            raise PctError("perms must be between 0 and 07777, got %o" % perms)
        return "%04o" % perms
    if isinstance(perms, str) and _PERMS_RE.match(perms):
        return perms if len(perms) == 4 else "0" + perms
    raise PctError("perms must be an octal mode like '0644', got %r" % (perms,))


def _owner_opts(user: t.Any, group: t.Any, perms: t.Any) -> t.List[str]:
    opts: t.List[str] = []
    for name, value in (("user", user), ("group", group)):
        if value is None:
            continue
        value = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(value, str) or not _OWNER_RE.match(value):
            raise PctError("%s must be a user/group name or numeric id, got %r" % (name, value))
        opts += ["--" + name, value]
    if perms is not None:
        opts += ["--perms", _format_perms(perms)]
    return opts


# The two directions of a file copy, each with the names of its (source, destination) in error messages.
TRANSFER_PATHS = {"push": ("host_path", "ct_path"), "pull": ("ct_path", "host_path")}


def transfer_argv(
    direction: str,
    vmid: t.Any,
    source: str,
    dest: str,
    user: t.Any = None,
    group: t.Any = None,
    perms: t.Any = None,
    pct_path: str = DEFAULT_PCT_PATH,
    prefix: t.Sequence[str] = (),
) -> t.List[str]:
    """``pct push VMID HOST_PATH CT_PATH`` or ``pct pull VMID CT_PATH HOST_PATH`` (DIRECTION), with
    ``[--user U] [--group G] [--perms MODE]`` (for ``pull``, the owner on the host side)."""
    if direction not in TRANSFER_PATHS:
        raise PctError("direction must be one of %s, got %r" % (", ".join(sorted(TRANSFER_PATHS)), direction))
    source_name, dest_name = TRANSFER_PATHS[direction]
    return pct_argv(
        direction,
        vmid,
        _check_path(source, source_name),
        _check_path(dest, dest_name),
        *_owner_opts(user, group, perms),
        pct_path=pct_path,
        prefix=prefix,
    )


# `pct push` and `pct pull` exit 0 when the copy fails: pve-container's pct.pm gives them no exit-code handler,
# so the CLI prints the error on stderr and exits 0 (and a failed pull leaves the destination it created, empty).
# Their exit code proves nothing; every copy is checked by the size (and, for pull, the SHA-256) it left.
SIZE_PROBE = ["stat", "-c", "%s", "--"]
DIGEST_PROBE = ["sha256sum", "--"]


def then(*lines: str) -> str:
    """Host shell text that runs each of LINES only while the ones before it succeed (``a && b``)."""
    return " && ".join(lines)


def not_sudo_noise(stderr: str) -> str:
    """STDERR without sudo's own warnings (``sudo: unable to resolve host ...``), which say nothing of the copy."""
    return "\n".join(line for line in (stderr or "").splitlines() if line.strip() and not line.startswith("sudo: "))


def parse_size(stdout: str) -> t.Optional[int]:
    """The byte count ``stat -c %s`` printed as the last line of STDOUT, or None."""
    lines = (stdout or "").strip().splitlines()
    return int(lines[-1]) if lines and lines[-1].strip().isdigit() else None


def parse_digests(stdout: str) -> t.List[str]:
    """The SHA-256 digests, in order, that ``sha256sum`` printed in STDOUT (one per line; a line starts with a
    backslash when sha256sum escaped a newline or backslash in the file's name)."""
    return [m.group(1) for m in re.finditer(r"^\\?([0-9a-f]{64}) ", stdout or "", re.MULTILINE)]


def copy_problem(rc: int, stderr: str, expected: int, got: t.Optional[int]) -> t.Optional[str]:
    """Why a push (``COPY && SIZE_PROBE``) failed, or None when the copy is whole.

    RC and STDERR are the whole line's; EXPECTED is the source's size, GOT the size the probe printed. pct's own
    message comes first on stderr, so it is the reason; a short copy with nothing said (a full disk under
    ``pct push``) is named by its sizes.
    """
    said = not_sudo_noise(stderr)
    if rc == 0 and not said and got == expected:
        return None
    if said:
        return said
    if got is not None:
        return "the copy has %d bytes, the source %d (truncated: is the destination's disk full?)" % (got, expected)
    return "rc %s and no message" % rc


def pull_problem(rc: int, stderr: str, digests: t.Sequence[str]) -> t.Optional[str]:
    """Why a pull (``SOURCE_DIGEST && PULL && PULLED_DIGEST``) failed, or None when the pulled file is the source.

    DIGESTS are the source's and the pulled file's, in that order, as far as the line got.
    """
    said = not_sudo_noise(stderr)
    if rc == 0 and not said and len(digests) == 2 and digests[0] == digests[1]:
        return None
    if said:
        return said
    if len(digests) == 2:
        return "the pulled copy differs from the source (truncated: is the PVE host's disk full?)"
    return "rc %s and no message" % rc


# pct decodes its arguments with the host locale's charset (pve-common JSONSchema.pm get_options, Encode::Locale):
# under LANG=C (or none) every non-ASCII byte becomes U+FFFD, so `café` would reach the container mangled. A
# command with non-ASCII text runs pct under a UTF-8 character type; only LC_CTYPE, and only then, since pct
# hands its environment on to the command in the container.
UTF8_CTYPE = {"LC_CTYPE": "C.UTF-8"}


def needs_utf8(text: t.Union[str, t.Sequence[str]]) -> bool:
    """Whether TEXT (or any of a list of arguments) has a non-ASCII character, which pct must decode as UTF-8."""
    parts = [text] if isinstance(text, str) else list(text)
    return any(ord(ch) > 127 for part in parts for ch in part)


def with_utf8_ctype(line: str) -> str:
    """Host shell text LINE, run under a UTF-8 character type when it carries non-ASCII text."""
    return "export LC_CTYPE=C.UTF-8; " + line if needs_utf8(line) else line


def quote(argv: t.Sequence[str]) -> str:
    """Quote ARGV once for a POSIX shell (the PVE host's login shell)."""
    return shlex.join(list(argv))


def parse_pct_status(text: str) -> str:
    """``status: running`` -> ``running``; raise ``PctError`` on anything else."""
    m = _STATUS_RE.search(text or "")
    if not m:
        raise PctError("unexpected `pct status` output: %r" % (text,))
    return m.group(1)


# A frozen container: a backup in suspend mode (vzdump) freezes it until the backup ends, under ``lock: backup``.
# `pct status` still says running, and `pct exec` (lxc-attach joins the frozen cgroup) hangs until the thaw.
# Proxmox VE puts a container in the cgroup lxc/VMID with the inner cgroup ns (pve-container LXC.pm
# update_lxc_config: lxc.cgroup.dir.container and .inner); vzdump freezes the inner one on cgroup v2 (lxc's
# freeze command) and lxc/VMID on v1 (PVE::CGroup freeze_thaw). A frozen parent freezes its children, and both
# files below report the effective state, so reading the inner cgroup sees either.
CGROUP_ROOT = "/sys/fs/cgroup"
FROZEN_RC = 75  # EX_TEMPFAIL: pct_ssh's host-side guard found the container frozen and ran nothing
FROZEN_MARK = "pct_ssh-frozen-guard:"


def freeze_state_files(vmid: int, root: str = CGROUP_ROOT) -> t.List[str]:
    """The files that tell whether container VMID is frozen: cgroup v2 (unified, or hybrid's unified mount)
    ``cgroup.events`` and cgroup v1 ``freezer.state``, of its inner cgroup."""
    inner = "lxc/%d/ns" % validate_vmid(vmid)
    return ["%s/%s/cgroup.events" % (root, inner), "%s/unified/%s/cgroup.events" % (root, inner),
            "%s/freezer/%s/freezer.state" % (root, inner)]


def frozen_in(path: str, text: str) -> bool:
    """Whether the content TEXT of one of :func:`freeze_state_files` (PATH) says frozen (or freezing)."""
    if path.endswith("/freezer.state"):
        return text.strip() in ("FROZEN", "FREEZING")
    return "frozen 1" in (line.strip() for line in text.splitlines())


def frozen_guard(vmid: int, root: str = CGROUP_ROOT) -> str:
    """Host shell text that fails with FROZEN_RC and FROZEN_MARK on stderr when container VMID is frozen, and
    succeeds otherwise; ``guard && pct exec ...`` never starts a command that would hang in a frozen container."""
    v2, hybrid, v1 = (shlex.quote(path) for path in freeze_state_files(vmid, root))
    return ("! { grep -qsx 'frozen 1' %s %s || grep -qsx -e FROZEN -e FREEZING %s; } || { echo '%s CT %d is frozen' >&2; exit %d; }"
            % (v2, hybrid, v1, FROZEN_MARK, vmid, FROZEN_RC))


def frozen_message(vmid: int, host: str, lock: t.Optional[str] = None) -> str:
    """What to tell the user about a frozen container VMID on HOST (LOCK: its config lock, when known)."""
    why = "lock: %s" % lock if lock else "a backup in suspend mode freezes it until the backup ends"
    return ("container %d on %s is frozen (%s): a command in it would hang until it is thawed, so nothing was run. "
            "Retry after the backup ends (`pct config %d` shows its lock), or thaw it on the host if nothing should "
            "hold it frozen." % (vmid, host, why, vmid))


def parse_status_verbose(text: str) -> t.Dict[str, str]:
    """``pct status VMID --verbose`` (``key: value`` lines) as a dict; raise ``PctError`` without a status."""
    fields = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    if "status" not in fields:
        raise PctError("unexpected `pct status --verbose` output: %r" % (text,))
    return fields


_LOCKED_RE = re.compile(r"\bCT is locked \(([^)]*)\)")


def locked_by(stderr: str) -> t.Optional[str]:
    """The lock named in pct's refusal ``CT is locked (backup)`` (pve-guest-common AbstractConfig check_lock)."""
    m = _LOCKED_RE.search(stderr or "")
    return m.group(1) if m else None


def locked_message(vmid: int, host: str, lock: str, operation: str) -> str:
    """What to tell the user when OPERATION meets container VMID's config lock LOCK on HOST."""
    after = "the backup" if lock == "backup" else "the %s" % lock
    return ("CT %d is locked (%s) on %s: pct refuses start, stop and shutdown while it is, and a reboot would stop it "
            "and then fail to start it, so `%s` was not run. Retry after %s ends, or, if nothing holds it (`pct list` "
            "shows the lock; a crashed backup leaves one behind), clear it with `pct unlock %d` and run again."
            % (vmid, lock, host, operation, after, vmid))


# Classes of pct/sudo failures that the callers turn into their own messages.
FAIL_STOPPED = "stopped"
FAIL_MISSING = "missing"
FAIL_SUDO = "sudo"
FAIL_PCT_NOT_FOUND = "pct_not_found"
FAIL_NOT_ROOT = "not_root"
FAIL_NO_BECOME = "no_become"


def classify_failure(stderr: str) -> t.Optional[str]:
    """Recognise pct's and sudo's own error messages in STDERR (the first lines).

    Only a hint: the command inside the container can print anything, so callers
    confirm with ``pct status`` before they blame the container.
    """
    text = stderr or ""
    low = text.lower()
    if re.search(r"\b(?:CT|VM) \d+ not running\b|container '\d+' not running|can only (?:push|pull) files (?:to|from) a running", text):
        return FAIL_STOPPED
    if re.search(r"Configuration file '[^']*/\d+\.conf' does not exist", text) or "does not exist" in low and "conf" in low:
        return FAIL_MISSING
    if "a password is required" in low or "a terminal is required" in low or "is not allowed to execute" in low or "not in the sudoers" in low:
        return FAIL_SUDO
    # a stock Proxmox VE install has no sudo: the shell (or GNU timeout, on the modules' side) says so
    if re.search(r"\b(sudo|doas):( command)? not found|failed to run command .(?:sudo|doas).: No such file", text):
        return FAIL_NO_BECOME
    if re.search(r"\bpct:( command)? not found|\bpct: No such file|failed to run command .[^ ]*pct.: No such file", text):
        return FAIL_PCT_NOT_FOUND
    # pct as a user pmxcfs refuses: its IPC fails before anything else (pve-cluster pmxcfs server.c, then
    # pve-access-control RPCEnvironment init_request); a www-data member gets pve-common's "please run as root"
    root_only = ("must be root", "only root can", "please run as root", "ipcc_send_rec",
                 "unable to load access control list")
    if any(phrase in low for phrase in root_only) or ("permission denied" in low and "pct" in low):
        return FAIL_NOT_ROOT
    return None


def keep_env_unknown(stderr: str, host: str) -> t.Optional[str]:
    """The message for a pct that does not know ``--keep-env`` (pve-container before 5.0.9: PVE 8.0/8.1 not
    updated), or None. pct's option parser fails before anything runs, so its line comes first on STDERR and a
    command's own output cannot mimic it."""
    if not (stderr or "").startswith("Unknown option: keep-env"):
        return None
    return ("pct on %s does not know --keep-env (pve-container older than 5.0.9, an un-updated Proxmox VE 8.0 or 8.1): "
            "update the host, or leave keep_env unset (pct then keeps the environment, as later releases do by default)" % host)


_HA_REQUEST_RE = re.compile(r"^Requesting HA (start|stop) for CT (\d+)$", re.MULTILINE)


def ha_request(stdout: str) -> t.Optional[str]:
    """``start`` or ``stop`` when pct only queued the request with the HA manager (an HA-managed CT:
    pve-container API2/LXC/Status.pm prints ``Requesting HA start for CT 200`` and runs ``ha-manager``, then
    returns 0 with the container's state unchanged), else None."""
    m = _HA_REQUEST_RE.search(stdout or "")
    return m.group(1) if m else None


def no_become_message(host: str, user: str, method: str, pct_path: str) -> str:
    """What to tell USER when HOST has no METHOD (sudo) to run pct with, and the ways on."""
    return ("%s has no %s (a stock Proxmox VE install ships none), so host user %s cannot run pct. Install it there "
            "(`apt install sudo`) and add the rule `%s` (or the narrower wrapper in the collection's README, \"Least "
            "privilege on the PVE host\"); or log in as root (ansible_user: root, with a key limited in "
            "authorized_keys); or set proxmox_become_method to a method the host has"
            % (host, method.split()[0] if method.strip() else "sudo", user, missing_rule_hint(user, method, pct_path)))


def parse_vmlist(text: str, vmid: int) -> t.Optional[str]:
    """The node that owns VMID according to PVE's ``/etc/pve/.vmlist`` JSON, or None."""
    try:
        data = json.loads(text)
        entry = data.get("ids", {}).get(str(vmid))
    except (ValueError, AttributeError):
        return None
    if isinstance(entry, dict) and isinstance(entry.get("node"), str):
        return entry["node"]
    return None


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CHDIR_FAILED_RC = 126  # like a shell's "cannot execute": the command never started
TIMEOUT_RCS = (124, 137)  # GNU timeout: 124 after the signal, 128+9 when --kill-after had to SIGKILL


def wrap_argv(
    argv: t.Sequence[str],
    chdir: t.Optional[str] = None,
    env: t.Optional[t.Mapping[str, t.Any]] = None,
    timeout: t.Optional[int] = None,
    kill_after: int = 5,
) -> t.List[str]:
    """The argv to run inside the container for ARGV with CHDIR, ENV and TIMEOUT.

    The timeout is enforced *inside* the container by GNU ``timeout``: it runs
    the command in its own process group and signals the whole group (TERM,
    then KILL after KILL_AFTER seconds), so nothing is left behind there. A
    host-side kill of ``pct exec`` would only end ``lxc-attach`` and orphan the
    command inside the container.
    """
    inner = _check_argv(argv, "argv")
    if env:
        assigns = []
        for key, value in env.items():
            if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
                raise PctError("env key %r is not a valid variable name (letters, digits, _; not starting with a digit)" % (key,))
            value = "" if value is None else str(value)
            if "\x00" in value:
                raise PctError("env value of %s contains a NUL byte" % key)
            assigns.append("%s=%s" % (key, value))
        if "=" in inner[0]:
            raise PctError("with env set, the program name must not contain '=' (env would take it for a variable)")
        inner = ["env"] + assigns + inner
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise PctError("timeout must be a positive number of seconds, got %r" % (timeout,))
        if isinstance(kill_after, bool) or not isinstance(kill_after, int) or kill_after <= 0:
            raise PctError("kill_after must be a positive number of seconds, got %r" % (kill_after,))
        inner = ["timeout", "--kill-after=%ds" % kill_after, "%ds" % timeout] + inner
    if chdir is not None:
        _check_path(chdir, "chdir")
        script = 'cd -- "$1" 2>/dev/null || { echo "chdir: cannot enter directory $1" >&2; exit %d; }; shift; exec "$@"' % CHDIR_FAILED_RC
        inner = [DEFAULT_SHELL, "-c", script, "sh", chdir] + inner
    return inner
