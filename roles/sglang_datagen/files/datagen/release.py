"""``datagen release``: the job is done, give the GPUs back.

The pipeline unit runs it as its last ``ExecStartPost=``, right after the finished marker, when the role's
``sglang_datagen_release_when_done`` is on (and the role's re-run of a finished job runs it with
``--if-needed``):

1. ``systemctl stop`` the serving units: ``sglang-datagen.target``, the router and every
   ``sglang-datagen-worker@*`` (bounded), then ``systemctl disable --no-reload sglang-datagen.target``, so
   that a reboot does not bring the workers back onto the GPUs (the role enables it again when it serves a
   new job);
2. prove the workers' GPUs free with ``gpu_free_wait``'s own runner: ``wait_free`` of the collection's
   ``plugins/module_utils/_gpu/free.py``, with the params the module would get. The role deploys it and the
   module_utils it imports under ``HOME/lib/ansible_collections/gpuops/repurpose/plugins/module_utils/``, on
   the pipeline's PYTHONPATH (``ansible_collections`` is an implicit namespace package there);
3. print one line for the journal, write ``WORK_DIR/released.json`` (atomically) and exit 1 when the GPUs are
   not free, naming the holders.

It does nothing for a config the pipeline has not finished (``pipeline.done`` names another checksum): a
manual run cannot take the servers from a job that still generates. Nothing here signals a process; systemd
stops the units.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from datagen import paths
from datagen.util import read_json, write_json

TARGET = "sglang-datagen.target"
ROUTER = "sglang-datagen-router.service"
WORKERS = "sglang-datagen-worker@*.service"  # a pattern: systemctl matches it against the loaded units
DEFAULT_TIMEOUT_S = 120.0  # gpu_free_wait's own default
# A worker gets TimeoutStopSec=60 before systemd kills it, the router 30: the stop ends well within this.
STOP_TIMEOUT_S = 150.0
ACTIVE_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")
MODULE_UTILS = "ansible_collections.gpuops.repurpose.plugins.module_utils"

Runner = Callable[[Sequence[str], float], Dict[str, Any]]
WaitFree = Callable[..., Dict[str, Any]]


# ---------------------------------------------------------------- pure parts

def serving_units(router: bool = True) -> List[str]:
    """The units that hold the GPUs: the target, the router (where this node runs one), every worker."""
    return [TARGET] + ([ROUTER] if router else []) + [WORKERS]


def stop_commands(systemctl: Sequence[str], units: Sequence[str]) -> List[List[str]]:
    """The argv lists run, in order: stop the units, then keep the target from starting them at boot."""
    return [[*systemctl, "stop", *units], [*systemctl, "disable", "--no-reload", TARGET]]


def list_command(systemctl: Sequence[str], units: Sequence[str]) -> List[str]:
    """``systemctl list-units`` of the serving units, loaded or not (the ``--if-needed`` check)."""
    return [*systemctl, "list-units", "--all", "--plain", "--no-legend", "--no-pager", *units]


def wait_params(gpus: Sequence[Any], timeout: float = DEFAULT_TIMEOUT_S, nvidia_smi: str = "nvidia-smi",
                backend: str = "auto", device_paths: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The options ``gpu_free_wait`` hands ``wait_free`` (its argument_spec, types applied), defaults but for
    the GPUs and the timeout (and, for tests, where nvidia-smi and the device files are)."""
    from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.holders import DEFAULT_DEVICE_PATHS
    from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.judge import DEFAULT_IGNORE_PROCESSES

    return {
        "gpus": [str(g) for g in gpus],
        "max_used_mib": 512,
        "stable_for": 2,
        "timeout": float(timeout),
        "interval": 1.0,
        "delay": 0.0,
        "ignore_processes": list(DEFAULT_IGNORE_PROCESSES),
        "backend": backend,
        "nvidia_smi_path": nvidia_smi,
        "container": None,
        "device_paths": list(device_paths) if device_paths else list(DEFAULT_DEVICE_PATHS),
    }


def parse_active(listing: str) -> List[str]:
    """The units ``systemctl list-units --plain --no-legend`` shows active (or on their way in or out)."""
    out = []
    for line in listing.splitlines():
        words = [w for w in line.split() if w not in ("●", "*")]  # systemd marks a failed unit with a bullet
        if len(words) >= 3 and words[2] in ACTIVE_STATES:
            out.append(words[0])
    return out


def holder_words(holders: Sequence[Dict[str, Any]]) -> str:
    """``pid 123 python on GPU 2; ...`` (one entry per process, its GPUs together)."""
    by_pid: Dict[Any, Dict[str, Any]] = {}
    for h in holders:
        entry = by_pid.setdefault(h.get("pid"), {"name": h.get("name") or "?", "unit": h.get("unit") or "",
                                                 "gpus": []})
        gpu = h.get("gpu")
        entry["gpus"].append("driver" if gpu is None else str(gpu))
    return "; ".join("pid %s %s%s on GPU %s" % (pid, e["name"], " (%s)" % e["unit"] if e["unit"] else "",
                                                ",".join(dict.fromkeys(e["gpus"])))
                     for pid, e in by_pid.items())


def gpu_words(gpus: Sequence[Dict[str, Any]]) -> str:
    return ",".join(str(g.get("index")) for g in gpus) or "?"


def make_record(result: Dict[str, Any], stops: Sequence[Dict[str, Any]], units: Sequence[str], config_sha1: str,
                elapsed: float, now: Optional[float] = None) -> Dict[str, Any]:
    """``released.json``: ``{released_at, free, gpus, holders}`` and how it was found."""
    stamp = time.gmtime(time.time() if now is None else now)
    return {
        "released_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", stamp),
        "free": bool(result.get("free")),
        "gpus": list(result.get("gpus") or []),
        "holders": list(result.get("holders") or []),
        "elapsed_s": round(elapsed, 1),
        "wait_s": result.get("elapsed"),
        "samples": result.get("samples"),
        "backend": result.get("backend"),
        "msg": result.get("msg", "") if not result.get("free") else "",
        "warnings": list(result.get("warnings") or []),
        "units": list(units),
        "stop": [dict(s) for s in stops],
        "config_sha1": config_sha1,
    }


def outcome_line(rec: Dict[str, Any], where: str = "") -> str:
    """The one journal line: how long, which GPUs, free or who holds them (and where the record is)."""
    failed = [s for s in rec.get("stop") or [] if s.get("rc") != 0]
    stop_note = "".join(" (`%s` failed: %s)" % (" ".join(s["argv"][:3]), s.get("error") or "rc %s" % s.get("rc"))
                        for s in failed)
    head = "datagen release: GPU %s %s %.1f s after stopping %s%s%s" % (
        gpu_words(rec.get("gpus") or []), "free" if rec.get("free") else "NOT free", rec.get("elapsed_s") or 0.0,
        ", ".join(rec.get("units") or []), stop_note, ", recorded in %s" % where if where else "")
    if rec.get("free"):
        return head + ("; device files still open: %s" % holder_words(rec["holders"]) if rec.get("holders") else "")
    held = holder_words(rec.get("holders") or [])
    return head + ": " + (rec.get("msg") or ("held by " + held if held else "busy"))


def status_line(finished: bool, rec: Optional[Dict[str, Any]]) -> str:
    """What ``datagen status`` says about the job as a whole."""
    if not finished:
        return "state: not finished"
    if rec is None:
        return "state: finished, no GPU release recorded"
    if rec.get("free"):
        return "state: finished, gpus released at %s (free)" % rec.get("released_at", "?")
    held = holder_words(rec.get("holders") or [])
    return "state: finished, gpus NOT released at %s (%s)" % (
        rec.get("released_at", "?"), ("held by " + held) if held else (rec.get("msg") or "busy"))


def release_needed(rec: Optional[Dict[str, Any]], config_sha1: str, active: Optional[Sequence[str]]) -> str:
    """Why ``--if-needed`` must release ('' when the GPUs were released for this job and nothing serves)."""
    if not isinstance(rec, dict) or rec.get("config_sha1") != config_sha1:
        return "no release recorded for this job"
    if not rec.get("free"):
        return "the last release found the GPUs busy"
    if active is None:
        return "systemd could not say which serving units run"
    if active:
        return "serving units run again: " + ", ".join(active)
    return ""


# ---------------------------------------------------------------- the node

def file_sha1(path: str) -> str:
    digest = hashlib.sha1()  # the checksum sha1sum writes into the marker, not a security hash
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


def marker_sha1(work_dir: str) -> str:
    """The checksum in ``pipeline.done`` (``sha1sum`` output): the config the pipeline finished for; '' none."""
    try:
        with open(paths.in_work(work_dir, paths.DONE), encoding="utf-8", errors="replace") as fh:
            words = fh.read(4096).split()
    except OSError:
        return ""
    return words[0] if words else ""


def finished_sha1(config_path: str, work_dir: str) -> str:
    """The config's checksum when the pipeline finished for it (as the unit's ExecCondition decides), else ''."""
    done = marker_sha1(work_dir)
    return done if done and done == file_sha1(config_path) else ""


def read_record(work_dir: str, config_sha1: str) -> Optional[Dict[str, Any]]:
    """``released.json`` when it is about the job with that checksum."""
    rec = read_json(paths.in_work(work_dir, paths.RELEASED))
    return rec if isinstance(rec, dict) and config_sha1 and rec.get("config_sha1") == config_sha1 else None


def pipeline_status(config_path: str, work_dir: str) -> Dict[str, Any]:
    """``datagen status``'s ``pipeline`` entry: finished for this config, and the GPUs' release."""
    done = finished_sha1(config_path, work_dir)
    rec = read_record(work_dir, done)
    return {"state": "finished" if done else "not_finished",
            "gpus_released": (bool(rec["free"]) if rec is not None else None) if done else None,
            "release": rec if done else None,
            "line": status_line(bool(done), rec)}


def run_bounded(argv: Sequence[str], timeout: float) -> Dict[str, Any]:
    """Run ARGV; ``{argv, rc, output}``, rc None with ``error`` when it did not end in TIMEOUT s or did not run."""
    out: Dict[str, Any] = {"argv": list(argv)}
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return dict(out, rc=None, error="%s not found" % argv[0])
    except subprocess.TimeoutExpired:
        return dict(out, rc=None, error="no answer within %.0f s" % timeout)
    text = (done.stdout + done.stderr).strip()
    return dict(out, rc=done.returncode, output=text[-2000:])


def prove_free(params: Callable[[], Dict[str, Any]], wait: Optional[WaitFree] = None) -> Dict[str, Any]:
    """``wait_free(params())``: gpu_free_wait's result, ``warnings`` added; a failed result (``free`` false, ``msg``)
    when the deployed module_utils cannot be imported."""
    warnings: List[str] = []
    try:
        options = params()
        if wait is None:
            from ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.free import wait_free as wait
    except ImportError as exc:
        return {"free": False, "failed": True, "gpus": [], "holders": [],
                "msg": "cannot import gpu_free_wait's runner (%s._gpu.free): %s; the role deploys it under "
                       "HOME/lib, the pipeline's PYTHONPATH" % (MODULE_UTILS, exc)}
    result = wait(options, check_mode=False, warn=warnings.append)
    result["warnings"] = warnings
    return result


def release(config_sha1: str, work_dir: str, params: Callable[[], Dict[str, Any]], units: Sequence[str],
            systemctl: Sequence[str] = ("systemctl",), stop_timeout: float = STOP_TIMEOUT_S,
            run: Runner = run_bounded, wait: Optional[WaitFree] = None) -> Dict[str, Any]:
    """Stop UNITS, prove the GPUs free (``wait_free(params())``), write ``released.json``; returns the record.

    The units are stopped first whatever follows: the job is finished, and a GPU check that cannot run
    (the module_utils missing) is no reason to leave them serving."""
    start = time.monotonic()
    stops = [run(argv, stop_timeout) for argv in stop_commands(systemctl, units)]
    result = prove_free(params, wait)
    rec = make_record(result, stops, units, config_sha1, time.monotonic() - start)
    write_json(paths.in_work(work_dir, paths.RELEASED), rec)
    return rec


def run_cli(config_path: str, work_dir: str, gpus: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S,
            router: bool = False, if_needed: bool = False, systemctl: Sequence[str] = ("systemctl",),
            stop_timeout: float = STOP_TIMEOUT_S, nvidia_smi: str = "nvidia-smi", backend: str = "auto",
            device_paths: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The subcommand: ``{acted, free, line, record, ...}``; ``free`` decides the exit status."""
    where = paths.in_work(work_dir, paths.RELEASED)
    units = serving_units(router)
    done = finished_sha1(config_path, work_dir)
    if not done:
        return {"acted": False, "free": True, "record": None, "path": where,
                "line": "datagen release: the pipeline has not finished for %s (pipeline.done names another "
                        "config, or none): the serving units are left up" % config_path}
    why = "the pipeline finished"
    if if_needed:
        rec = read_record(work_dir, done)
        listed = run_bounded(list_command(systemctl, units), 30.0)
        active = parse_active(listed.get("output", "")) if listed.get("rc") == 0 else None
        why = release_needed(rec, done, active)
        if not why and rec is not None:
            return {"acted": False, "free": True, "record": rec, "path": where,
                    "line": "datagen release: nothing to do, GPU %s released at %s (free) and no serving unit "
                            "runs" % (gpu_words(rec.get("gpus") or []), rec.get("released_at"))}
    rec = release(done, work_dir, lambda: wait_params(gpus, timeout, nvidia_smi, backend, device_paths), units,
                  systemctl, stop_timeout)
    return {"acted": True, "why": why, "free": rec["free"], "record": rec, "path": where,
            "line": outcome_line(rec, where)}
