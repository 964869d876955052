"""The controller lost in the middle of the ``sglang_datagen`` role, on the CT200 lab, then a plain re-run.

``ansible-playbook`` (the role's converge play, the real modules and connection) is SIGKILLed whole (its
process group and every descendant: ansible-core 2.19's workers ``setsid`` out of the group) at a
boundary of the role, found by its ``TASK [...]`` banner:

- during the install task (pip in the venv, 1 s after its banner);
- after a new package archive is copied, before it is unpacked (the node runs an older package: its
  archive and its unpacked files differ from the controller's, as after an upgrade of the collection);
- after a new datagen config is written while the pipeline runs on the older one (slow workers), before
  the role restarts it: the run that finishes must be one started on the new config;
- after the worker units are written, before systemd is reloaded and before the readiness gate;
- during the readiness gate (the workers restarting on a changed command line);
- after the pipeline was started, during its start-up wait.

Each killed play changes the workers' command line (the stand-in's ``--latency``), as an operator's
changed setting does, and finds a pipeline to run (its outputs removed). Then a plain re-run with the
same settings must succeed; the pipeline finishes with every prepared id exactly once (the shared checks
of ``tests/support/datagen_stages.py``); the workers run the new command line and systemd holds no stale
unit definition (``NeedDaemonReload=no``); one stand-in process per worker unit, one router, no worker
unit twice; and a second re-run changes nothing.

CI runs three points (the package copied, the units written, the pipeline started); ``GPUOPS_FAULTS_FULL=1``
runs all six.
Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.support import datagen_stages as stages
from tests.support.datagen import (
    CONVERGE,
    LAB_VARS_FILE,
    WORK,
    lab_worker_args,
    play,
    reset_pipeline,
    wait_pipeline_finished,
)
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import kill_playbook, start_playbook, start_until_banner
from tests.support.ssh import attach

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

FULL = os.environ.get("GPUOPS_FAULTS_FULL") == "1"
ROWS = 100  # the lab inventory's datagen config (target_total)
PYTHON = "/opt/datagen/venv/bin/python"
STAGES_SOURCE = Path(stages.__file__).read_text(encoding="utf-8")
FINISH_S = 240

# (point, the task whose banner the kill waits for, seconds after the banner, in CI)
POINTS = [
    ("during the install", "Install SGLang, sglang-router and the pipeline's requirements in one resolution", 1.0,
     False),
    ("package copied, not yet unpacked", "Look for the package unpacked from this archive", 0.0, True),
    ("config written, the pipeline running on the older one", "Create the extra files' directories", 0.0, False),
    ("units written, before the reload and the gate", "Find workers left over from a larger layout", 0.0, True),
    ("during the readiness gate", "Wait until every worker is ready and the router routes to all of them", 0.3,
     False),
    ("pipeline started", "Wait until the pipeline works (or fails)", 0.0, True),
]


CONFIG = "/opt/datagen/datagen.yml"
LAB_CONFIG = yaml.safe_load(LAB_VARS_FILE.read_text(encoding="utf-8"))["sglang_datagen_config"]
PACKAGE = "/opt/datagen/lib/datagen"
OLDER = "from_an_older_release.py"


def older_package(lab: dict) -> None:
    """The node as an older release of the collection left it: another archive, its unpacked files."""
    attach(lab, "sh", "-c", f"printf 'older release' >> /opt/datagen/datagen.tar && rm -f {PACKAGE}/.unpacked-from-*"
           f" && echo '# only in the older release' > {PACKAGE}/{OLDER}")


def worker_args(latency: str) -> tuple:
    return ("-e", lab_worker_args("--latency", latency))


def stages_in_ct(lab: dict, *args: str) -> dict:
    return json.loads(attach(lab, PYTHON, "-c", STAGES_SOURCE, *args, timeout=200).stdout)


def show(lab: dict, unit: str, prop: str, *options: str) -> str:
    return attach(lab, "systemctl", "show", *options, "-p", prop, "--value", unit, check=False).stdout.strip()


def worker_units(lab: dict) -> list:
    out = attach(lab, "systemctl", "list-units", "--all", "--plain", "--no-legend", "sglang-datagen-worker@*",
                 check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def serving_problems(lab: dict, latency: str) -> list:
    """What is wrong with the serving side after the re-run: stale definitions, old command lines, doubles."""
    problems = []
    units = worker_units(lab)
    envs = attach(lab, "sh", "-c", "ls /opt/datagen/workers/worker-*.env", check=False).stdout.split()
    if len(units) != len(set(units)) or len(units) != len(envs):
        problems.append(f"worker units {units} vs environment files {envs}")
    for unit in [*units, "sglang-datagen-router.service", "datagen-pipeline.service"]:
        if show(lab, unit, "NeedDaemonReload") != "no":
            problems.append(f"{unit}: systemd runs a stale definition (NeedDaemonReload)")
    for unit in units:
        pid = show(lab, unit, "MainPID")
        argv = attach(lab, "cat", f"/proc/{pid}/cmdline", check=False).stdout.split("\0")
        if show(lab, unit, "ActiveState") != "active" or f"--latency\0{latency}" not in "\0".join(argv):
            problems.append(f"{unit} (PID {pid}) does not run the new command line: {argv}")
    ps = attach(lab, "ps", "-ww", "-eo", "args", check=False).stdout.splitlines()
    standins = [a for a in ps if "sglang_standin/standin.py" in a and not a.startswith(("sh ", "/bin/sh"))]
    if len(standins) != len(units):
        problems.append(f"{len(standins)} stand-in processes for {len(units)} worker units: {standins}")
    # sglang-router names its process "sglang::router" (its cmdline is that title alone)
    routers = [a for a in ps if a.startswith("sglang::router") or "sglang_router.launch_router" in a]
    if len(routers) != 1:
        problems.append(f"{len(routers)} router processes: {routers}")
    return problems


SELECTED = [p for p in POINTS if FULL or p[3]]


@pytest.mark.parametrize("point,task,delay,_ci", SELECTED, ids=[p[0] for p in SELECTED])
def test_controller_killed_mid_role_then_a_plain_rerun_converges(point, task, delay, _ci, lab, figures):
    # a latency no earlier run used: the killed play changes the worker units, as a changed setting does
    latency = "0.0%d" % (2 + POINTS.index((point, task, delay, _ci)))
    reset_pipeline(lab)
    args = worker_args(latency)
    if point.startswith("package"):
        older_package(lab)
    if point.startswith("config"):
        play(*worker_args("15"))  # the pipeline running on the lab's config; slow workers keep it running
        newer = dict(LAB_CONFIG, sampling=dict(LAB_CONFIG["sampling"], temperature=0.6))
        args += ("-e", json.dumps({"sglang_datagen_config": newer}))
    name = "controller lost in sglang_datagen: " + point
    proc = start_playbook(CONVERGE, LAB_INVENTORY, args=args)
    try:
        start_until_banner(proc, task)
        time.sleep(delay)
    finally:
        kill_playbook(proc, with_workers=True)
    tail = proc.stdout.read() if proc.stdout else ""
    figures.injected(name)
    assert "TASK [" not in tail, f"the kill landed after the task {task!r} had ended:\n{tail[-2000:]}"
    assert "PLAY RECAP" not in tail

    t0 = time.monotonic()
    play(*args)  # the plain re-run, same settings
    wait_pipeline_finished(lab, FINISH_S)
    figures.wait("controller lost in sglang_datagen: re-run and pipeline finished", time.monotonic() - t0,
                 800 + FINISH_S)
    check = stages_in_ct(lab, "check", WORK, str(ROWS))
    assert check["problems"] == [], check["problems"]
    assert serving_problems(lab, latency) == []
    assert attach(lab, "test", "-e", f"{PACKAGE}/{OLDER}", check=False).returncode != 0, \
        "the re-run left the older package's files in place: the new archive was never unpacked"
    # the run that finished started on the config as it is now (not the older one it was running on)
    started = show(lab, "datagen-pipeline.service", "InactiveExitTimestamp", "--timestamp=unix").lstrip("@")
    written = attach(lab, "stat", "-c", "%Y", CONFIG).stdout.strip()
    assert started and float(started) >= float(written), (started, written)
    out, changed = play(*args)
    assert changed == 0, out[-4000:]
    assert "finished for this config (nothing started)" in out, out[-3000:]
    figures.survived(name, rows_lost=check["lost"])
