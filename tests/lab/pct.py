# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A stand-in for Proxmox VE's ``pct`` on the lab's "PVE host" (tests/lab only).

The lab bind-mounts this file at ``/usr/sbin/pct`` inside the mount namespace
of its sshd; it must never be installed over a real ``pct``. It maps the
subcommands the collection and community.proxmox use onto the LXC tools with
the private lxcpath of the lab, and copies real pct's output formats, messages
and exit codes. Sources: proxmox/pve-container ``src/PVE/CLI/pct.pm``,
``src/PVE/API2/LXC/Status.pm``, ``src/PVE/LXC.pm`` and pve-common's
CLIHandler/RESTHandler/JSONSchema (read 2026-11). What could not be checked
against a live host is marked ``unverified`` below.

Standard library only; runs with the system python3 as root.
"""

from __future__ import annotations

import ctypes
import grp
import os
import pwd
import re
import socket
import subprocess
import sys
import time
import typing as t

LAB_DIR = os.environ.get("GPUOPS_LAB_DIR", "/var/lib/gpuops-lab")
LXCPATH = os.path.join(LAB_DIR, "lxc")
# The lab's stand-in for /etc/pve/nodes/<node>/lxc: one Proxmox-style <vmid>.conf per CT.
# A second lab PVE host (`lab up --nodes 2`) sets both through its /usr/sbin/pct wrapper, so
# each host sees only its own containers, as each PVE node has its own nodes/<node>/lxc.
PVE_CONF_DIR = os.environ.get("GPUOPS_LAB_PVE_CONF_DIR") or os.path.join(LAB_DIR, "pve", "lxc")
NODE = os.environ.get("GPUOPS_LAB_PVE_NODE") or socket.gethostname().split(".")[0]
# The lab's stand-in for /etc/pve/ha/resources.cfg: one line `ct: VMID` per HA-managed container, with
# ` state=error` when the HA manager will not act on it (`tests/lab/lab ha on|off`).
HA_RESOURCES = os.path.join(os.path.dirname(PVE_CONF_DIR), "ha-resources")
HA_DELAY_S = 2.0  # the lab's HA manager acts this long after a request (a real CRM/LRM round takes ~10 s)
PCT_PM = "/usr/share/perl5/PVE/CLI/pct.pm"

# Fault injection (lab only, off by default): while this file exists, `pct reboot`
# of a listed VMID (one or more VMIDs in the file; an empty file means every
# container) behaves like a reboot whose shutdown never completes, as when a
# process in uninterruptible sleep pins the container: the container keeps
# running, and pct fails once its own bounded waits are spent, with real pct's
# messages (see reboot_hang). Tests create and delete it; `lab down` removes it
# with the lab dir.
FAULTS_DIR = os.path.join(LAB_DIR, "faults")
REBOOT_HANG = os.path.join(FAULTS_DIR, "reboot-hang")
# Fault injection (lab only, off by default): while this file exists, `pct pull` finds the host's disk full
# (its tmpfs out of inodes, say) where it creates the destination: create_file dies as pct.pm's does
# (pct.pm:548) and, like every pull failure, the CLI exits 0 (see _file_task).
PULL_ENOSPC = os.path.join(FAULTS_DIR, "pull-enospc")
# Fault injection (lab only, off by default): while this file exists, pct is as pve-container before 5.0.9
# (an un-updated PVE 8.0/8.1): `exec` has no --keep-env (added by commit 069553d, debian/changelog 5.0.9), so
# the option parser refuses it as any unknown option.
PCT_BEFORE_KEEP_ENV = os.path.join(FAULTS_DIR, "pct-before-keep-env")
# pct reboot without --timeout: lxc-stop's own default shutdown timeout.
LXC_STOP_DEFAULT_TIMEOUT = 60

# Perl's die without a trailing newline, uncaught, ends pct with 255 (exit(-1)).
# unverified: perl uses $! as the exit status when it is non-zero at the time of
# die, so a real host may occasionally exit with a small errno value instead.
EXIT_ERR = 255

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000

USAGE = {
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "reboot": "pct reboot <vmid> [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
    "list": "pct list",
    "config": "pct config <vmid> [OPTIONS]",
}
# Positional parameters of each command (pct.pm's $cmddef) and its options:
# option name -> True when it is a boolean (value optional).
POSITIONAL = {
    "exec": ["vmid", "extra-args"],
    "status": ["vmid"],
    "start": ["vmid"],
    "stop": ["vmid"],
    "shutdown": ["vmid"],
    "reboot": ["vmid"],
    "push": ["vmid", "file", "destination"],
    "pull": ["vmid", "path", "destination"],
    "list": [],
    "config": ["vmid"],
}
OPTIONS = {
    "exec": {"keep-env": True},
    "status": {"verbose": True},
    "start": {"skiplock": True, "debug": True},
    "stop": {"skiplock": True, "overrule-shutdown": True},
    "shutdown": {"timeout": False, "forceStop": True},
    "reboot": {"timeout": False},
    "push": {"user": False, "group": False, "perms": False},
    "pull": {"user": False, "group": False, "perms": False},
    "list": {},
    "config": {"current": True, "snapshot": False},
}


class PctError(Exception):
    """A failure pct reports on stderr before exiting with 255."""


class ParamError(PctError):
    """A parameter error: pve-common prints '400 ...' followed by the usage line."""

    def __init__(self, cmd: str, msg: str, errors: dict[str, str] | None = None) -> None:
        text = "400 " + msg + "\n"
        for key, value in (errors or {}).items():
            text += "%s: %s\n" % (key, value)
        text += USAGE[cmd] + "\n"
        super().__init__(text)


def die(msg: str, line: int | None = None) -> PctError:
    """Perl's die: a message without a newline gets ' at FILE line N.' appended."""
    if line is not None:
        return PctError("%s at %s line %d.\n" % (msg, PCT_PM, line))
    return PctError(msg + "\n")


def parse_bool(cmd: str, name: str, value: str) -> bool:
    low = value.lower()
    if low in ("", "1", "on", "yes", "true"):
        return True
    if low in ("0", "off", "no", "false"):
        return False
    raise ParamError(cmd, "unable to parse boolean option")


def parse_args(cmd: str, args: list[str]) -> tuple[dict[str, str], list[str]]:
    """Getopt::Long as pve-common configures it: options anywhere before '--', '-' or '--' prefix."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    known = OPTIONS[cmd]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i + 1:])
            break
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.lstrip("-").partition("=")
            if name not in known:
                sys.stderr.write("Unknown option: %s\n" % name)
                raise ParamError(cmd, "unable to parse option")
            if eq:
                opts[name] = value
            elif known[name]:
                # boolean, Getopt ':s': the value is optional and is the next word unless that is an option
                nxt = args[i + 1] if i + 1 < len(args) else None
                if nxt is not None and not nxt.startswith("-"):
                    opts[name] = nxt
                    i += 1
                else:
                    opts[name] = ""
            else:
                if i + 1 >= len(args):
                    sys.stderr.write("Option %s requires an argument\n" % name)
                    raise ParamError(cmd, "unable to parse option")
                opts[name] = args[i + 1]
                i += 1
        else:
            rest.append(arg)
        i += 1
    return opts, rest


def bind_positional(cmd: str, rest: list[str]) -> dict[str, object]:
    params: dict[str, object] = {}
    names = POSITIONAL[cmd]
    for idx, name in enumerate(names):
        if name == "extra-args":
            params[name] = rest[idx:]
            return params
        if idx >= len(rest):
            raise ParamError(cmd, "not enough arguments")
        params[name] = rest[idx]
    if len(rest) > len(names):
        raise ParamError(cmd, "too many arguments")
    return params


def check_vmid(cmd: str, vmid: str) -> str:
    # pve-common's pve_verify_vmid
    if not re.match(r"^[1-9][0-9]{2,8}$", vmid):
        raise ParamError(
            cmd, "Parameter verification failed.", {"vmid": "invalid format - value does not look like a valid VM ID"}
        )
    return vmid


# ---------------------------------------------------------------- the container

def conf_path(vmid: str) -> str:
    return os.path.join(PVE_CONF_DIR, "%s.conf" % vmid)


def load_config(vmid: str) -> list[tuple[str, str]]:
    path = conf_path(vmid)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(LXCPATH, vmid, "config")):
        raise die("Configuration file 'nodes/%s/lxc/%s.conf' does not exist" % (NODE, vmid))
    entries: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if not line or line.startswith("#") or ":" not in line:
                continue
            if line.startswith("["):  # snapshot sections
                break
            key, dummy, value = line.partition(":")
            entries.append((key.strip(), value.strip()))
    return entries


def lxc(tool: str, vmid: str, *args: str) -> list[str]:
    return [tool, "-P", LXCPATH, "-n", vmid, *args]


def check_running(vmid: str) -> bool:
    if not os.path.isdir(os.path.join(LXCPATH, vmid)):
        return False
    """PVE::LXC::vmstatus (LXC.pm:284): running while the container's monitor answers on its command socket,
    whatever the container does; a frozen container (a backup in suspend mode) is running too."""
    res = subprocess.run(lxc("lxc-info", vmid, "-s", "-H"), capture_output=True, text=True, timeout=30, check=False)
    return res.returncode == 0 and res.stdout.strip() not in ("", "STOPPED")


def init_pid(vmid: str) -> int:
    res = subprocess.run(lxc("lxc-info", vmid, "-p", "-H"), capture_output=True, text=True, timeout=30, check=False)
    try:
        return int(res.stdout.strip())
    except ValueError:
        raise die("unable to get PID for CT %s (not running?)" % vmid) from None


def hostname_of(vmid: str) -> str:
    try:
        conf = dict(load_config(vmid))
    except PctError:
        conf = {}
    return "".join((conf.get("hostname") or "CT%s" % vmid).split())


# ---------------------------------------------------------------- commands

def cmd_exec(params: dict, opts: dict) -> int:
    vmid = check_vmid("exec", params["vmid"])
    keep_env = parse_bool("exec", "keep-env", opts["keep-env"]) if "keep-env" in opts else True
    load_config(vmid)
    if not check_running(vmid):
        raise die("container '%s' not running!" % vmid)
    if not params["extra-args"]:
        raise die("missing command", 246)
    # clean_environment() and run_cli_handler's fixed PATH
    env = dict(os.environ)
    env.pop("SSL_CERT_FILE", None)
    env.pop("SSL_CERT_DIR", None)
    # the lab's own wiring of a second PVE host (set by its pct wrapper) or of a lane's lab directory (the
    # lane's sshd sets it), not part of a real host's environment
    env.pop("GPUOPS_LAB_PVE_CONF_DIR", None)
    env.pop("GPUOPS_LAB_PVE_NODE", None)
    env.pop("GPUOPS_LAB_DIR", None)
    env.pop("PYTHONCOERCECLOCALE", None)  # the lab's wrapper's (tests/lab/pct), not the session's
    env["PATH"] = "/sbin:/bin:/usr/sbin:/usr/bin"
    argv = lxc("lxc-attach", vmid, "--keep-env" if keep_env else "--clear-env", "--", *params["extra-args"])
    sys.stdout.flush()
    os.execvpe("lxc-attach", argv, env)
    return EXIT_ERR  # not reached


def cmd_status(params: dict, opts: dict) -> int:
    vmid = check_vmid("status", params["vmid"])
    conf = dict(load_config(vmid))
    running = check_running(vmid)
    if "verbose" in opts and parse_bool("status", "verbose", opts["verbose"]):
        stat = vmstatus(vmid, conf, running)
        for key in sorted(stat):
            print("%s: %s" % (key, stat[key]))
    else:
        print("status: %s" % ("running" if running else "stopped"))
    return 0


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text or 0)


def vmstatus(vmid: str, conf: dict, running: bool) -> dict:
    """PVE::LXC::vmstatus keys (cpu is skipped by 'pct status --verbose'); usage numbers approximate."""
    maxdisk = 4 << 30
    for part in conf.get("rootfs", "").split(","):
        if part.startswith("size="):
            maxdisk = _size(part[5:])
    stat: dict[str, object] = {
        "cpus": conf.get("cores", os.cpu_count() or 1),
        "disk": 0,
        "diskread": 0,
        "diskwrite": 0,
        "maxdisk": maxdisk,
        "maxmem": int(conf.get("memory", 512)) * 1024 * 1024,
        "maxswap": int(conf.get("swap", 0)) * 1024 * 1024,
        "mem": 0,
        "name": "".join((conf.get("hostname") or "CT%s" % vmid).split()),
        "netin": 0,
        "netout": 0,
        "status": "running" if running else "stopped",
        "swap": 0,
        "type": "lxc",
        "uptime": 0,
        "vmid": int(vmid),
    }
    if running:
        pid = init_pid(vmid)
        stat["pid"] = pid
        try:
            with open("/proc/uptime", encoding="ascii") as handle:
                uptime = float(handle.read().split()[0])
            with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
                start = int(handle.read().rsplit(")", 1)[1].split()[19])
            stat["uptime"] = int(uptime - start / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError):
            pass
        res = subprocess.run(lxc("lxc-info", vmid, "-S", "-H"), capture_output=True, text=True, timeout=30, check=False)
        for line in res.stdout.splitlines():
            key, dummy, value = line.partition(":")
            if key.strip() == "Memory use":
                try:
                    stat["mem"] = int(value.strip())
                except ValueError:
                    pass
        try:
            st = os.statvfs("/proc/%d/root/" % pid)
            stat["disk"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            pass
    if conf.get("lock"):
        stat["lock"] = conf["lock"]
    return stat


def wait_state(vmid: str, state: str, timeout: int) -> bool:
    res = subprocess.run(lxc("lxc-wait", vmid, "-s", state, "-t", str(timeout)), capture_output=True, timeout=timeout + 10, check=False)
    return res.returncode == 0


def ha_managed(vmid: str) -> str | None:
    """'started' when container VMID is an HA resource the HA manager acts on, 'error' when it is one in the
    error state, None when it is not HA-managed (PVE::HA::Config::vm_is_ha_managed)."""
    try:
        with open(HA_RESOURCES, encoding="utf-8") as handle:
            for line in handle:
                words = line.split()
                if words[:2] == ["ct:", vmid]:
                    return "error" if "state=error" in words else "started"
    except FileNotFoundError:
        pass
    return None


def ha_request(vmid: str, action: str) -> int:
    """What API2/LXC/Status.pm does for an HA-managed CT (start :166-177, stop :266-280, shutdown :365-375): print
    `Requesting HA start|stop for CT VMID` and hand the request to ha-manager, which queues it; pct returns 0 at
    once with the state unchanged. The lab's HA manager then acts in a detached process after HA_DELAY_S (never
    for a resource in the error state)."""
    print("Requesting HA %s for CT %s" % (action, vmid))
    sys.stdout.flush()
    if ha_managed(vmid) == "error":
        return 0
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        time.sleep(HA_DELAY_S)
        tool = lxc("lxc-start", vmid) if action == "start" else lxc("lxc-stop", vmid, "--timeout", "60")
        subprocess.run(tool, timeout=120, check=False)
        os._exit(0)
    return 0


def do_start(vmid: str) -> None:
    # unverified: real pct starts through pve-container@VMID.service; the lab calls lxc-start directly.
    res = subprocess.run(lxc("lxc-start", vmid), capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0 or not wait_state(vmid, "RUNNING", 30):
        sys.stderr.write(res.stderr)
        raise die("startup for container '%s' failed" % vmid)


def check_lock(conf: dict, skiplock: bool = False) -> None:
    """pve-guest-common AbstractConfig.pm check_lock, as Status.pm's vm_start/vm_stop (194, 301: not with
    --skiplock, and not for the lock 'mounted') and vm_shutdown (387: always) call it in their task worker: the
    task fails, so pct's $upid_exit ends the CLI with 255. vm_reboot and exec do not look."""
    if conf.get("lock") and not skiplock:
        raise die("CT is locked (%s)" % conf["lock"])


def _skiplock(cmd: str, opts: dict) -> bool:
    return parse_bool(cmd, "skiplock", opts["skiplock"]) if "skiplock" in opts else False


def cmd_start(params: dict, opts: dict) -> int:
    vmid = check_vmid("start", params["vmid"])
    if check_running(vmid):
        raise die("CT %s already running" % vmid)
    if ha_managed(vmid):
        return ha_request(vmid, "start")
    conf = dict(load_config(vmid))  # in the task worker
    if conf.get("lock") != "mounted":
        check_lock(conf, _skiplock("start", opts))
    do_start(vmid)
    return 0


def vm_stop(vmid: str, kill: bool, timeout: int | None, kill_after_timeout: bool) -> None:
    """PVE::LXC::vm_stop: lxc-stop --kill, or a clean shutdown bounded by timeout."""
    cmd = lxc("lxc-stop", vmid)
    if kill:
        cmd.append("--kill")
    else:
        if not kill_after_timeout:
            cmd.append("--nokill")
        cmd += ["--timeout", str(timeout if timeout is not None else 60)]
    limit = (timeout if timeout is not None else 60) + 5
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
    except subprocess.TimeoutExpired:
        sys.stderr.write("command '%s' failed: got timeout\n" % " ".join(cmd))
    if check_running(vmid):
        raise die("container did not stop")


def stop_running(vmid: str, kill: bool, timeout: int | None, kill_after_timeout: bool,
                 not_running: str = "CT %s not running", lock_check: t.Callable[[dict], None] | None = None,
                 ha_action: str | None = None) -> None:
    """What stop, shutdown and reboot share once their options are checked: a stopped CT is an error; an
    HA-managed one gets HA_ACTION requested instead (stop, shutdown; reboot has no HA branch); LOCK_CHECK
    (stop and shutdown: check_lock; reboot: none) runs on the config in the task worker."""
    if not check_running(vmid):
        raise die(not_running % vmid)
    if ha_action is not None and ha_managed(vmid):
        ha_request(vmid, ha_action)
        return
    conf = dict(load_config(vmid))  # in the task worker
    if lock_check is not None:
        lock_check(conf)
    vm_stop(vmid, kill, timeout, kill_after_timeout)


def cmd_stop(params: dict, opts: dict) -> int:
    vmid = check_vmid("stop", params["vmid"])
    skiplock = _skiplock("stop", opts)
    stop_running(vmid, True, None, False,
                 lock_check=lambda conf: conf.get("lock") == "mounted" or check_lock(conf, skiplock), ha_action="stop")
    return 0


def cmd_shutdown(params: dict, opts: dict) -> int:
    vmid = check_vmid("shutdown", params["vmid"])
    timeout = 60
    if "timeout" in opts:
        try:
            timeout = int(opts["timeout"])
            if timeout < 0:
                raise ValueError
        except ValueError:
            raise ParamError(
                "shutdown", "Parameter verification failed.", {"timeout": "type check ('integer') failed - got '%s'" % opts["timeout"]}
            ) from None
    force = parse_bool("shutdown", "forceStop", opts["forceStop"]) if "forceStop" in opts else False
    stop_running(vmid, False, timeout, force, lock_check=check_lock, ha_action="stop")
    return 0


def reboot_hang_fault(vmid: str) -> bool:
    """Whether the lab's reboot-hang fault is switched on for vmid (see REBOOT_HANG)."""
    try:
        with open(REBOOT_HANG, encoding="utf-8") as handle:
            listed = handle.read().split()
    except FileNotFoundError:
        return False
    return not listed or vmid in listed


def reboot_hang(vmid: str, timeout: int | None) -> None:
    """The reboot-hang fault: PVE::LXC::vm_stop(vmid, 0, timeout, 1) with an lxc-stop that never returns.

    Real pct runs ``lxc-stop -n VMID --timeout T`` under run_command's timeout of
    T + 5 s; when that expires it warns ``command '...' failed: got timeout``,
    polls the container's command socket another T + 5 s for the monitor to go
    away, then dies ``container did not stop`` (a reboot does not start the
    container then). Here both waits are real ``lxc-wait -s STOPPED`` calls on
    the container, so a container stopped meanwhile (e.g. by ``pct stop``) ends
    the reboot as real pct's POLLHUP does. Without --timeout real pct's first
    wait is unbounded; the lab bounds it by lxc-stop's default of 60 s.
    """
    shutdown_timeout = (timeout if timeout is not None else LXC_STOP_DEFAULT_TIMEOUT) + 5
    shown = ["lxc-stop", "-n", vmid] + (["--timeout", str(timeout)] if timeout is not None else [])
    if wait_state(vmid, "STOPPED", shutdown_timeout):
        return
    sys.stderr.write("command '%s' failed: got timeout\n" % " ".join(shown))
    sys.stderr.flush()
    if wait_state(vmid, "STOPPED", shutdown_timeout):
        return
    raise die("container did not stop")


def cmd_reboot(params: dict, opts: dict) -> int:
    vmid = check_vmid("reboot", params["vmid"])
    timeout = None
    if "timeout" in opts:
        # pve-common's JSONSchema check of "timeout: integer, minimum 0", before the command runs
        if not re.match(r"^[+-]?[0-9]+$", opts["timeout"]):
            raise ParamError(
                "reboot", "Parameter verification failed.", {"timeout": "type check ('integer') failed - got '%s'" % opts["timeout"]}
            )
        timeout = int(opts["timeout"])
        if timeout < 0:
            raise ParamError("reboot", "Parameter verification failed.", {"timeout": "value must have a minimum value of 0"})
    if reboot_hang_fault(vmid):
        if not check_running(vmid):
            raise die("VM %s not running" % vmid)
        load_config(vmid)  # in the task worker
        reboot_hang(vmid, timeout)
    else:
        stop_running(vmid, False, timeout, True, not_running="VM %s not running")  # sic: real pct says VM here
    do_start(vmid)
    return 0


def _id(name: str | None, lookup: t.Callable[[str], int], what: str) -> int | None:
    """A user or group given by number or by name (pct.pm's push --user/--group)."""
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        return lookup(name)
    except KeyError:
        raise die("failed to get %s for: %s" % (what, name)) from None


def _ids(user: str | None, group: str | None) -> tuple[int | None, int | None]:
    return (_id(user, lambda name: pwd.getpwnam(name).pw_uid, "uid"),
            _id(group, lambda name: grp.getgrnam(name).gr_gid, "gid"))


def create_file(path: str, perms: str | None, user: str | None, group: str | None) -> int:
    """pct.pm's create_file: explicit perms (octal by default), owner by name or id."""
    uid, gid = _ids(user, group)
    mode = None
    if perms is not None:
        try:
            mode = int(perms[2:], 16) if perms.lower().startswith("0x") else int(perms, 8)
        except ValueError:
            raise die("invalid mode: '%s'" % perms) from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError as exc:
            raise die("failed to create file: %s: %s" % (path, exc.strerror)) from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid is not None or gid is not None:
        st = os.fstat(fd)
        try:
            os.fchown(fd, st.st_uid if uid is None else uid, st.st_gid if gid is None else gid)
        except OSError as exc:
            raise die("failed to change file owner: %s" % exc.strerror) from None
    return fd


def _enter_mount_ns(pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        nsfd = os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY)
    except OSError:
        raise die("failed to open the container's mount namespace") from None
    if libc.setns(nsfd, CLONE_NEWNS) != 0:
        raise die("failed to enter the container's mount namespace")
    os.close(nsfd)
    try:
        os.chdir("/")
    except OSError:
        raise die("failed to change to container root directory") from None


def _open_user_ns(pid: int) -> int:
    try:
        return os.open("/proc/%d/ns/user" % pid, os.O_RDONLY)
    except OSError:
        raise die("failed to open the container's user namespace") from None


def _enter_user_ns(nsfd: int) -> None:
    """An unprivileged CT's push creates the file as the container's root (pct.pm:771-788): setns into its user
    namespace, then setgid/setuid 0 there (host 100000), so the file is owned by it and a directory its root
    may not write refuses the file."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(nsfd, CLONE_NEWUSER) != 0:
        raise die("failed to enter the container's user namespace")
    os.close(nsfd)
    try:
        os.setgid(0)
    except OSError as exc:
        raise die("setgid failed: %s" % exc.strerror) from None
    try:
        os.setuid(0)
    except OSError as exc:
        raise die("setuid failed: %s" % exc.strerror) from None


def _file_task(func) -> int:
    """Run FUNC as pct.pm's push/pull run their file task: a forked worker (pve-common RESTEnvironment.pm
    fork_worker, synchronous under the CLI; setns() must not touch this process). A worker that dies prints its
    message on stderr (the tee_worker prints "TASK ERROR: X" as X), and the CLI still exits 0: push and pull
    have no ``$upid_exit`` outsub in pct.pm's cmddef (pct.pm:1189-1190), so run_cli_handler reaches its
    ``exit 0`` (pve-common CLIHandler.pm:717)."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        try:
            func()
        except PctError as exc:
            sys.stderr.write(str(exc))
        except BaseException as exc:  # noqa: B036 - the child must never return into the parent's code
            sys.stderr.write("%s\n" % exc)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    os.waitpid(child, 0)
    return 0


def _copy(src_fd: int, dst_fd: int) -> None:
    """File::Copy::copy, its result unchecked as in pct.pm (push :791, pull :682): a read or write error (a full
    disk, a directory as the source) ends the copy early, says nothing, and the task still ends OK."""
    try:
        while True:
            block = os.read(src_fd, 1 << 20)
            if not block:
                break
            while block:
                block = block[os.write(dst_fd, block):]
    except OSError:
        pass
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _octal_perms(perms: str | None) -> str | None:
    """pct.pm prefixes --perms with 0 (octal) unless it already starts with 0 (0755, 0x1ed)."""
    if perms is not None and not perms.startswith("0"):
        return "0" + perms
    return perms


def cmd_push(params: dict, opts: dict) -> int:
    vmid = check_vmid("push", params["vmid"])
    perms = _octal_perms(opts.get("perms"))
    if not check_running(vmid):
        raise die("can only push files to a running CT")
    unprivileged = dict(load_config(vmid)).get("unprivileged") == "1"
    pid = init_pid(vmid)

    def work() -> None:
        try:
            src = os.open(params["file"], os.O_RDONLY)
        except OSError:
            raise die("failed to open %s for reading" % params["file"]) from None
        userns = _open_user_ns(pid) if unprivileged else None
        _enter_mount_ns(pid)
        if userns is not None:
            _enter_user_ns(userns)
        # owner names resolve inside the container (its /etc/passwd), as in pct
        dst = create_file(params["destination"], perms, opts.get("user"), opts.get("group"))
        _copy(src, dst)

    return _file_task(work)


def cmd_pull(params: dict, opts: dict) -> int:
    vmid = check_vmid("pull", params["vmid"])
    perms = _octal_perms(opts.get("perms"))
    if not check_running(vmid):
        raise die("can only pull files from a running VM", 664)
    pid = init_pid(vmid)

    def work() -> None:
        # as in pct: the destination is created on the host first (owner names resolve on the host)
        if os.path.exists(PULL_ENOSPC):
            raise die("failed to create file: %s: %s" % (params["destination"], os.strerror(28)))
        dst = create_file(params["destination"], perms, opts.get("user"), opts.get("group"))
        _enter_mount_ns(pid)
        try:
            src = os.open(params["path"], os.O_RDONLY)
        except OSError as exc:
            raise die("failed to open %s: %s" % (params["path"], exc.strerror)) from None
        _copy(src, dst)

    return _file_task(work)


def cmd_list(params: dict, opts: dict) -> int:
    try:
        names = os.listdir(PVE_CONF_DIR)
    except FileNotFoundError:
        names = []
    vmids = sorted(int(n[:-5]) for n in names if n.endswith(".conf") and n[:-5].isdigit())
    vmids = [v for v in vmids if os.path.isfile(os.path.join(LXCPATH, str(v), "config"))]
    if not vmids:
        return 0
    fmt = "%-10s %-10s %-12s %-20s"
    print(fmt % ("VMID", "Status", "Lock", "Name"))
    for vmid in vmids:
        conf = dict(load_config(str(vmid)))
        status = "running" if check_running(str(vmid)) else "stopped"
        print(fmt % (vmid, status, conf.get("lock", ""), hostname_of(str(vmid))))
    return 0


def cmd_config(params: dict, opts: dict) -> int:
    vmid = check_vmid("config", params["vmid"])
    entries = load_config(vmid)
    plain = sorted((k, v) for k, v in entries if not k.startswith("lxc.") and k not in ("digest",))
    for key, value in plain:
        print("%s: %s" % (key, value))
    for key, value in entries:
        if key.startswith("lxc."):
            print("%s: %s" % (key, value))
    return 0


COMMANDS = {
    "exec": cmd_exec,
    "status": cmd_status,
    "start": cmd_start,
    "stop": cmd_stop,
    "shutdown": cmd_shutdown,
    "reboot": cmd_reboot,
    "push": cmd_push,
    "pull": cmd_pull,
    "list": cmd_list,
    "config": cmd_config,
}


def usage_short(msg: str) -> str:
    text = "ERROR: %s\n" % msg if msg else ""
    text += "USAGE: pct <COMMAND> [ARGS] [OPTIONS]\n\n"
    for name in sorted(USAGE):
        text += "       %s\n" % USAGE[name]
    return text


def locale_decoded(args: list[str], environ: t.Mapping[str, str]) -> list[str]:
    """ARGS as pve-common's get_options leaves them: decoded with the locale's charset (JSONSchema.pm:2506-2520,
    Encode::Locale). Under a locale that is not UTF-8 (LANG=C, or none) every byte above 0x7f becomes U+FFFD, and
    a path or command with `café` reaches the container as `caf\ufffd\ufffd` (written back out as UTF-8)."""
    name = environ.get("LC_ALL") or environ.get("LC_CTYPE") or environ.get("LANG") or ""
    if "UTF-8" in name.upper() or "UTF8" in name.upper():
        return list(args)
    return [os.fsencode(arg).decode("ascii", "replace") for arg in args]


def main(argv: list[str]) -> int:
    argv = locale_decoded(argv, os.environ)
    if not argv:
        sys.stderr.write(usage_short("no command specified"))
        return EXIT_ERR
    cmd, args = argv[0], argv[1:]
    if cmd in ("help", "--help", "-h"):
        sys.stdout.write(usage_short(""))
        return 0
    if cmd not in COMMANDS:
        sys.stderr.write(usage_short("unknown command 'pct %s'" % cmd))
        return EXIT_ERR
    if os.geteuid() != 0:
        # unverified: the exact text real pct prints for a non-root caller
        sys.stderr.write("ipcc_send_rec[1] failed: Permission denied\n")
        return EXIT_ERR
    if os.path.exists(PCT_BEFORE_KEEP_ENV):
        OPTIONS["exec"] = {}
    try:
        opts, rest = parse_args(cmd, args)
        for name, value in opts.items():
            if OPTIONS[cmd][name]:
                parse_bool(cmd, name, value)  # get_options checks booleans before anything runs
        params = bind_positional(cmd, rest)
        return COMMANDS[cmd](params, opts)
    except PctError as exc:
        sys.stdout.flush()
        sys.stderr.write(str(exc))
        return EXIT_ERR
    except subprocess.TimeoutExpired as exc:
        sys.stderr.write("command '%s' failed: got timeout\n" % " ".join(exc.cmd))
        return EXIT_ERR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
