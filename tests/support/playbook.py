"""Run ``ansible-playbook`` as the tests do: a playbook file, an inventory, extra vars; rc, output, results.

Playbooks under test are YAML files (``tests/integration/playbooks/NAME.yml`` for the
test-only ones, ``playbooks/`` and the roles' converge files for the real ones); what
varies between runs comes in as extra vars, never through Python string formatting.
With ``json_results=True`` the ``ansible.posix.json`` callback replaces the default
one and :attr:`PlaybookRun.results` gives ``{task name: {host: result}}``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from tests.support.paths import ANSIBLE_CFG, BIN, LAB_INVENTORY, PLAYBOOKS, ROOT
from tests.support.procfs import descendants

PathLike = Union[str, Path]
ExtraVars = Union[dict, str]


def playbook_path(playbook: PathLike) -> Path:
    """A bare name (``"pct_ssh_suite"`` or ``"pct_ssh_suite.yml"``) is a file under tests/integration/playbooks."""
    path = Path(playbook)
    if path.is_absolute() or len(path.parts) > 1:
        return path
    return PLAYBOOKS / (path.name if path.suffix in (".yml", ".yaml") else path.name + ".yml")


def ansible_env(**overrides: str) -> Dict[str, str]:
    """The environment for ansible commands: this venv's bin first, the checkout's ansible.cfg, no colour."""
    env = dict(os.environ)
    env.update({
        "PATH": "%s:%s" % (BIN, env.get("PATH", "")),
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(overrides)
    return env


def playbook_argv(playbook: PathLike, inventory: PathLike, extra_vars: Sequence[ExtraVars] = (),
                  args: Sequence[str] = ()) -> List[str]:
    """``ansible-playbook -i INVENTORY PLAYBOOK -e JSON...`` (each EXTRA_VARS item one ``-e``, later ones win)."""
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook_path(playbook))]
    for item in extra_vars:
        argv += ["-e", item if isinstance(item, str) else json.dumps(item)]
    return argv + list(args)


def task_results(callback_json: dict) -> dict:
    """From the ``ansible.posix.json`` callback: ``{task name: {host: result}}`` (later plays update earlier)."""
    out: dict = {}
    for play in callback_json["plays"]:
        for task in play["tasks"]:
            out.setdefault(task["task"]["name"], {}).update(task["hosts"])
    return out


def callback_seconds(stamp: str) -> float:
    """A timestamp of the ``ansible.posix.json`` callback (ISO 8601, ``Z`` for UTC) as epoch seconds."""
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def recap(output: str, host: str = "ct200") -> Dict[str, int]:
    """HOST's PLAY RECAP counts (ok, changed, unreachable, failed) from the default callback's output."""
    m = re.search(r"^%s\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host),
                  output, re.M)
    assert m, "no recap for %s in:\n%s" % (host, output[-3000:])
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups())))


@dataclass
class PlaybookRun:
    """One finished ``ansible-playbook`` run."""

    rc: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout then stderr, as a person reads a run."""
        return self.stdout + self.stderr

    @property
    def json(self) -> dict:
        """The ``ansible.posix.json`` callback's document (the run must have used it)."""
        try:
            return json.loads(self.stdout)
        except ValueError:
            raise AssertionError("ansible-playbook gave no JSON (rc %s): %s %s"
                                 % (self.rc, self.stdout[-2000:], self.stderr[-2000:])) from None

    @property
    def results(self) -> dict:
        """``{task name: {host: result}}`` (see :func:`task_results`)."""
        return task_results(self.json)

    def recap(self, host: str = "ct200") -> Dict[str, int]:
        return recap(self.stdout, host)


def run_playbook(playbook: PathLike, inventory: PathLike, extra_vars: Sequence[ExtraVars] = (),
                 args: Sequence[str] = (), json_results: bool = False, env: Optional[Dict[str, str]] = None,
                 timeout: float = 600, cwd: PathLike = ROOT) -> PlaybookRun:
    """Run a playbook to the end (bounded by TIMEOUT); ENV (default :func:`ansible_env`) gets the JSON callback
    when JSON_RESULTS."""
    env = dict(ansible_env() if env is None else env)
    if json_results:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    done = subprocess.run(playbook_argv(playbook, inventory, extra_vars, args), cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return PlaybookRun(done.returncode, done.stdout, done.stderr)


def control_dir(tmp: PathLike) -> Path:
    """pct_ssh's control master directory (``ANSIBLE_PCT_SSH_CONTROL_PATH_DIR``) for a test whose temporary directory
    is TMP: ``/tmp/gpuops-cp-<digest of TMP>``, the same for every call with TMP. Not under TMP itself: a socket's
    path holds at most 107 bytes, and under pytest-xdist (a lab lane) ``tmp_path`` is already 80 of them."""
    path = Path("/tmp") / ("gpuops-cp-" + hashlib.sha256(str(tmp).encode()).hexdigest()[:12])
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def run_json_play(tmp: Path, hosts: Dict[str, dict], playbook: PathLike, extra_vars: Sequence[ExtraVars] = (),
                  timeout: float = 600, groups: Optional[Dict[str, Dict[str, dict]]] = None) -> dict:
    """PLAYBOOK against HOSTS (a JSON inventory written under TMP), one fork per host, pct_ssh's control
    masters in :func:`control_dir` (TMP); ``{task name: {host: result}}``."""
    from tests.support.inventory import write_inventory

    inventory = write_inventory(tmp / "inventory.json", hosts, groups)
    env = ansible_env(ANSIBLE_FORKS=str(len(hosts)), ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(control_dir(tmp)))
    return run_playbook(playbook, inventory, extra_vars, json_results=True, env=env, timeout=timeout).results


def start_playbook(playbook: PathLike, inventory: PathLike, extra_vars: Sequence[ExtraVars] = (),
                   args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
                   cwd: PathLike = ROOT) -> subprocess.Popen:
    """ansible-playbook in its own process group (a test can kill it like a cancelled AWX job); stdout+stderr
    on one text pipe."""
    return subprocess.Popen(playbook_argv(playbook, inventory, extra_vars, args), cwd=str(cwd),
                            env=ansible_env() if env is None else env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_until(proc: subprocess.Popen, needle: str, timeout: float = 300) -> str:
    """Output of PROC up to and including the first line containing NEEDLE (bounded by TIMEOUT)."""
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if needle in line:
            return "".join(seen)
        if time.monotonic() > deadline:
            break
    raise AssertionError("never saw %r; output:\n%s" % (needle, "".join(seen)[-4000:]))


def adhoc_argv(host: str, module: str, module_args: dict, inventory: Optional[PathLike] = LAB_INVENTORY,
               check: bool = False, options: Sequence[str] = ()) -> List[str]:
    """``ansible HOST -i INVENTORY OPTIONS -m MODULE -a JSON [--check]`` (INVENTORY None: Ansible's implicit
    localhost)."""
    argv = [str(BIN / "ansible"), host, *(["-i", str(inventory)] if inventory is not None else []), *options,
            "-m", module, "-a", json.dumps(module_args)]
    return argv + (["--check"] if check else [])


def run_adhoc(host: str, module: str, module_args: dict, inventory: Optional[PathLike] = LAB_INVENTORY,
              check: bool = False,
              options: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """An ad-hoc module run (:func:`adhoc_argv`) from the checkout, to the end (bounded by TIMEOUT)."""
    return subprocess.run(adhoc_argv(host, module, module_args, inventory, check, options), capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT), env=ansible_env() if env is None else env,
                          check=False)


def start_adhoc(host: str, module: str, module_args: dict, inventory: Optional[PathLike] = LAB_INVENTORY,
                options: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """An ad-hoc module run (:func:`adhoc_argv`) started, not awaited (a test cuts something under it);
    stdout+stderr on one text pipe."""
    return subprocess.Popen(adhoc_argv(host, module, module_args, inventory, options=options), cwd=str(ROOT),
                            env=ansible_env() if env is None else env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


def adhoc_json_result(done: subprocess.CompletedProcess, host: str) -> dict:
    """HOST's result of an ad-hoc run made with the ``json`` callback (``ANSIBLE_STDOUT_CALLBACK=json``)."""
    try:
        return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"][host]
    except ValueError:
        raise AssertionError("ansible gave no JSON (rc %s): %s %s"
                             % (done.returncode, done.stdout[-2000:], done.stderr[-2000:])) from None


BANNER = re.compile(r"^TASK \[(.+?)\]", re.M)  # the default callback's banner, printed as each task starts


def banners_until(proc: subprocess.Popen, done: Callable[[List[str]], bool], timeout: float = 300) -> List[str]:
    """The task banners PROC prints until DONE(banners so far) is true or the play ends (bounded by TIMEOUT)."""
    seen: List[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        m = BANNER.match(line)
        if m:
            seen.append(m.group(1))
            if done(seen):
                break
        if time.monotonic() > deadline:
            break
    return seen


def changed_tasks(output: str) -> List[Tuple[int, str]]:
    """From a run's default-callback output: (position in the banner list, name) of each task that reported
    ``changed`` (a loop task once, however many of its items changed)."""
    out: List[Tuple[int, str]] = []
    k, name = -1, ""
    for line in output.splitlines():
        m = BANNER.match(line)
        if m:
            k, name = k + 1, m.group(1)
        elif line.startswith("changed: [") and k >= 0 and (not out or out[-1][0] != k):
            out.append((k, name))
    return out


def task_output(output: str, task: str) -> List[str]:
    """From a run's default-callback output: the non-empty lines printed under the first banner whose task
    name starts with TASK (its results, one line per loop item); [] when no such task ran."""
    lines: Optional[List[str]] = None
    for line in output.splitlines():
        m = BANNER.match(line)
        if m:
            if lines is not None:
                break
            if m.group(1).split(" : ", 1)[-1].startswith(task):
                lines = []
        elif lines is not None and line.strip():
            lines.append(line)
    return lines or []


def kill_playbook(proc: subprocess.Popen, with_workers: bool = True) -> List[int]:
    """SIGKILL a started playbook (:func:`start_playbook`): its process group, and with WITH_WORKERS every
    descendant outside it too (ansible-core 2.19's workers ``setsid`` out of the group), as a controller that
    dies whole; the PIDs killed outside the group."""
    killed: List[int] = []
    for _round in range(3):  # a fork in progress shows up on the next look
        pids = [proc.pid, *descendants(proc.pid)] if with_workers else []
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    proc.wait(timeout=30)
    return killed
