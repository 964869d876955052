"""The controller lost in the middle of the ``sglang_datagen`` role, on the CT200 lab, then a plain re-run.

``ansible-playbook`` (the role's converge play, the real modules and connection) is SIGKILLed whole (its
process group and every descendant: ansible-core 2.19's workers ``setsid`` out of the group).

After each task that changes the node (every k): a reference run (the same changes a killed play makes,
run to the end) names the tasks that report ``changed``; for each, the play is killed the moment the next
banner is printed, so the node holds exactly what the tasks up to that one wrote. A kill after a task that
changes nothing leaves the node as the kill after the last one that did (the controller keeps nothing
between runs), so these are the points where the node's state differs. The list comes from the run, not
from this file: a task the role gains is a point at once.

Three more points land inside a task or need another start:

- during the install task (pip in the venv, 1 s after its banner);
- after a new datagen config is written while the pipeline runs on the older one (slow workers), before
  the role restarts it: the run that finishes must be one started on the new config;
- during the readiness gate (the workers restarting on a changed command line).

Each killed play changes the workers' command line (the stand-in's ``--latency``), the datagen config (its
sampling temperature) and the package (the node holds an older release's archive and files, as after an
upgrade of the collection), as an operator's changed settings do, and finds a pipeline to run (its outputs
removed). Then a plain re-run with the same settings must succeed; the pipeline finishes with every
prepared id exactly once (the shared checks of ``tests/support/datagen_stages.py``); the workers run the new
command line and systemd holds no stale unit definition (``NeedDaemonReload=no``); one stand-in process per
worker unit, one router, no worker unit twice; the older package's files are gone; the run that finished
started on the config as written; and a second re-run changes nothing.

CI runs one point of the every-k loop (the kill right after the workers restarted, where the most is half
done) and the readiness gate; ``GPUOPS_FAULTS_FULL=1`` runs all of them and the three points above;
``GPUOPS_FAULTS_DATA_POINTS=A-B`` runs the loop's points A..B (from 1).
Marked ``lab``: skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from tests.support import datagen_stages as stages
from tests.support import faults
from tests.support.datagen import (
    CONVERGE,
    GATE_TASK,
    INSTALL_TASK,
    LAB_VARS_FILE,
    WORK,
    free_gpus,
    lab_worker_args,
    play,
    play_result,
    reset_pipeline,
    wait_pipeline_finished,
)
from tests.support.faults import FULL, Fault, Figures
from tests.support.paths import LAB_INVENTORY
from tests.support.playbook import BANNER, changed_tasks, start_playbook
from tests.support.ssh import attach

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(1500)]

# "A-B": only the points A..B of the every-k loop (a by-hand run under the lab lock, in parts)
LOOP_POINTS = os.environ.get("GPUOPS_FAULTS_DATA_POINTS", "")
# CI's one point of the every-k loop: the kill right after the workers restarted, where the most is half
# done (the new package unpacked, config and units written, workers on the new command line; the ready
# marker and the pipeline not yet touched)
CI_POINT_TASK = "Start the workers"
ROWS = 100  # the lab inventory's datagen config (target_total)
PYTHON = "/opt/datagen/venv/bin/python"
STAGES_SOURCE = Path(stages.__file__).read_text(encoding="utf-8")
FINISH_S = 240
RERUN_BOUND_S = 800 + FINISH_S  # the re-run's own timeout, then the pipeline's

# (point, the task whose banner the kill waits for, seconds after the banner): inside a task, or another start
POINTS = [
    ("during the install", INSTALL_TASK, 1.0),
    ("config written, the pipeline running on the older one", "Create the extra files' directories", 0.0),
    ("during the readiness gate", GATE_TASK, 0.3),
]
LOOP = "controller lost in sglang_datagen: after a task that changed the node"
REFERENCE_TEMPERATURE = 0.5  # the reference run's; each loop point adds its own hundredths


CONFIG = "/opt/datagen/datagen.yml"
LAB_CONFIG = yaml.safe_load(LAB_VARS_FILE.read_text(encoding="utf-8"))["sglang_datagen_config"]
PACKAGE = "/opt/datagen/lib/datagen"
OLDER = "from_an_older_release.py"


@pytest.fixture(scope="module")
def lab(lab: dict) -> dict:
    """The lane with the data half deployed: every point starts from the node an older release left
    (:func:`older_package` edits a deployed package). Another file's converge usually did it; on a fresh lane,
    where this file runs first, its first converge does."""
    if attach(lab, "test", "-e", "/opt/datagen/datagen.tar", check=False).returncode != 0:
        play()
    return lab


def older_package(lab: dict) -> None:
    """The node as an older release of the collection left it: another archive, its unpacked files."""
    attach(lab, "sh", "-c", f"printf 'older release' >> /opt/datagen/datagen.tar && rm -f {PACKAGE}/.unpacked-from-*"
           f" && echo '# only in the older release' > {PACKAGE}/{OLDER}")


def settings(latency: str, temperature: float) -> tuple:
    """ansible-playbook arguments for the workers' LATENCY and the config's sampling TEMPERATURE."""
    config = dict(LAB_CONFIG, sampling=dict(LAB_CONFIG["sampling"], temperature=temperature))
    return ("-e", lab_worker_args("--latency", latency), "-e", json.dumps({"sglang_datagen_config": config}))


def changed_settings(lab: dict, latency: str, temperature: float) -> tuple:
    """What a killed play finds to do: the node on an older package, no pipeline output; :func:`settings`."""
    reset_pipeline(lab)
    older_package(lab)
    return settings(latency, temperature)


def stages_in_ct(lab: dict, *args: str) -> dict:
    return json.loads(attach(lab, PYTHON, "-c", STAGES_SOURCE, *args, timeout=200).stdout)


def show(lab: dict, unit: str, prop: str, *options: str) -> str:
    return attach(lab, "systemctl", "show", *options, "-p", prop, "--value", unit, check=False).stdout.strip()


def worker_units(lab: dict) -> list:
    out = attach(lab, "systemctl", "list-units", "--all", "--plain", "--no-legend", "sglang-datagen-worker@*",
                 check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def last_value(argv: list, option: str) -> str:
    """The value ARGV gives OPTION last (argparse: the last one wins); "" when it gives none."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]
    return values[-1] if values else ""


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
        if show(lab, unit, "ActiveState") != "active" or last_value(argv, "--latency") != latency:
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


@dataclass
class Converge:
    """A point's context: the lab, the ledger, and the loop's notes (its points' outcomes, when each started)."""

    lab: dict
    figures: Figures
    notes: Dict[str, str] = field(default_factory=dict)
    started: float = 0.0


def kill_when(args: tuple, done, delay: float = 0.0) -> List[str]:
    """Start the converge play with ARGS and kill it whole DELAY s after DONE(banners so far) holds (the shared
    controller-kill injector); the banners."""
    free_gpus()
    return faults.controller_killed(start_playbook(CONVERGE, LAB_INVENTORY, args=args), done, delay=delay)


@dataclass(frozen=True)
class Killed:
    """What a killed play was given: its ansible-playbook arguments and the workers' latency in them."""

    args: tuple
    latency: str


def rerun_converges(ctx: Converge, killed: Killed) -> Dict[str, int]:
    """After a killed play: a plain re-run with the same arguments, then everything it must show (module
    docstring); the rows lost."""
    lab, t0 = ctx.lab, time.monotonic()
    play(*killed.args)
    wait_pipeline_finished(lab, FINISH_S)
    ctx.figures.wait("controller lost in sglang_datagen: re-run and pipeline finished", time.monotonic() - t0,
                     RERUN_BOUND_S)
    check = stages_in_ct(lab, "check", WORK, str(ROWS))
    assert check["problems"] == [], check["problems"]
    assert serving_problems(lab, killed.latency) == []
    assert attach(lab, "test", "-e", f"{PACKAGE}/{OLDER}", check=False).returncode != 0, \
        "the re-run left the older package's files in place: the new archive was never unpacked"
    # the run that finished started on the config as it is now (not an older one it was running on)
    started = show(lab, "datagen-pipeline.service", "InactiveExitTimestamp", "--timestamp=unix").lstrip("@")
    written = attach(lab, "stat", "-c", "%Y", CONFIG).stdout.strip()
    assert started and float(started) >= float(written), (started, written)
    out, changed = play(*killed.args)
    assert changed == 0, out[-4000:]
    assert "finished for this config (nothing started)" in out, out[-3000:]
    return {"rows_lost": check["lost"]}


def loop_selected(points: List[Tuple[int, str]]) -> List[Tuple[int, str]]:
    """The every-k loop's points this run takes: GPUOPS_FAULTS_DATA_POINTS=A-B, all in full mode, else
    the one after the task named CI_POINT_TASK (the first point when the role has no such task)."""
    if LOOP_POINTS:
        first, _sep, last = LOOP_POINTS.partition("-")
        return points[int(first) - 1:int(last or first)]
    return points if FULL else ([p for p in points if CI_POINT_TASK in p[1]] or points)[:1]


def after_task(k: int, task: str, points: List[Tuple[int, str]], banners: List[str], n: int) -> Fault:
    """The every-k loop's row for the kill right after task K (the N-th point this run takes): the play given a
    latency and a temperature no other point uses, killed as banner K+2 is printed, having taken the reference's
    path."""
    latency = f"{0.010 + points.index((k, task)) / 1000:.3f}"

    def inject(ctx: Converge) -> Killed:
        ctx.started = time.monotonic()
        args = changed_settings(ctx.lab, latency, round(REFERENCE_TEMPERATURE + (n + 1) / 100, 2))
        seen = kill_when(args, lambda s: len(s) >= k + 2)
        assert seen[:k + 1] == banners[:k + 1], f"the killed play took another path: {seen} vs {banners}"
        return Killed(args, latency)

    def check(ctx: Converge, killed: Killed) -> Dict[str, int]:
        counts = rerun_converges(ctx, killed)
        ctx.notes[str(k + 1)] = f"{task}: survived in {time.monotonic() - ctx.started:.0f} s"
        ctx.figures.note("data half kill points", ctx.notes)
        return counts

    return Fault(LOOP, f"task {k + 1}: {task}", inject, check, at={"k": k})


def test_controller_killed_after_each_task_that_changes_the_node(lab, figures):
    reference_args = changed_settings(lab, "0.009", REFERENCE_TEMPERATURE)
    reference = play_result(*reference_args)
    assert reference.rc == 0, reference.stdout[-4000:]
    banners = BANNER.findall(reference.stdout)
    # the last task's kill point would be after the play: nothing is left to kill
    points = [(k, task) for k, task in changed_tasks(reference.stdout) if k + 1 < len(banners)]
    figures.note("data half changed tasks", [f"{k + 1}: {task}" for k, task in points])
    # the reference makes every kind of change: the package, the config, the units, the workers, the pipeline
    for must in ("Copy the package archive", "Unpack the package", "Write the pipeline config",
                 "Write the systemd units and the workers' environment files", "Start the workers",
                 "Start the pipeline"):
        assert any(must in task for _k, task in points), (must, points)
    ctx = Converge(lab, figures)

    def failed(row: Fault) -> None:
        ctx.notes[str(row.at["k"] + 1)] = f"{row.point}: FAILED"
        figures.note("data half kill points", ctx.notes)

    rows = (after_task(k, task, points, banners, n) for n, (k, task) in enumerate(loop_selected(points), start=1))
    faults.each(figures, rows, ctx, on_failure=failed)


def inside_a_task(point: str, task: str, delay: float):
    """The injector for a kill DELAY s after TASK's banner: the node prepared as POINT needs, the play killed."""

    def inject(ctx: Converge) -> Killed:
        lab = ctx.lab
        # a latency no earlier run used: the killed play changes the worker units, as a changed setting does
        latency = "0.0%d" % (2 + [p[0] for p in POINTS].index(point))
        if point.startswith("config"):
            play(*changed_settings(lab, "15", 0.6))  # the pipeline running on the older config; slow workers
            older_package(lab)
            args = settings(latency, 0.7)
        else:
            args = changed_settings(lab, latency, 0.7)
        if point.startswith("during the install"):
            # a venv that holds every pin skips the installer: one pin missing makes it run (and reinstall it)
            attach(lab, PYTHON, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", "Jinja2", timeout=120)
        kill_when(args, lambda s: len(s) > 0 and task in s[-1], delay)
        return Killed(args, latency)

    return inject


INSIDE = [Fault("controller lost in sglang_datagen", point, inside_a_task(point, task, delay), rerun_converges,
                ci=point == "during the readiness gate") for point, task, delay in POINTS]


@pytest.mark.parametrize("row", faults.table(INSIDE))
def test_controller_killed_inside_a_task_then_a_plain_rerun_converges(row, lab, figures):
    faults.run(figures, row, Converge(lab, figures))
