"""``datagen release`` (files/datagen/release.py) and the role's release when done.

After the pipeline finished, ``datagen release`` stops the serving units and proves the GPUs free with
gpu_free_wait's own runner. First its pure parts (the units, the argv, the params handed to ``wait_free``, the
lines ``datagen status`` prints from ``released.json``), then the real command: ``python -m datagen release`` in a
subprocess whose only import path is a ``lib`` laid out as the role deploys it (the datagen package and the
module_utils of ``sglang_datagen__gpu_free_module_utils`` under ``lib/ansible_collections/...``), against the
lab's fake nvidia-smi and real holder processes. There is no systemd here: the stop step runs a stub
``systemctl`` that records its argv (and, standing in for systemd, ends the holder it is told is a worker).

Then the role, run for real by ansible-playbook on localhost: the "finished" decision (tasks/finished.yml)
against the config as deploy.yml writes it, the pipeline unit's release line, and the re-run of a finished job
(tasks/done.yml: ``datagen release --if-needed`` on a node laid out as the role leaves it, the fake nvidia-smi
and the stub systemctl first on PATH). tasks/main.yml's wiring is read, not run (the whole role needs a node:
the lab tests).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from fakegpu_harness import NVIDIA_SMI, FakeGpus

from datagen import release
from tests.support import datagen_rows as fx
from tests.support.paths import DATAGEN_FILES, ROOT
from tests.support.playbook import ansible_env, run_playbook

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

MODULE_UTILS = ROOT / "plugins" / "module_utils"
PREFIX = "ansible_collections.gpuops.repurpose.plugins.module_utils"
ROLE_VARS = yaml.safe_load((ROOT / "roles" / "sglang_datagen" / "vars" / "main.yml").read_text())
DEPLOYED = ROLE_VARS["sglang_datagen__gpu_free_module_utils"]
ALL_GPUS = "0,1,2,3,4,5,6,7"
UNITS = ["sglang-datagen.target", "sglang-datagen-router.service", "sglang-datagen-worker@*.service"]


# ---------------------------------------------------------------- pure parts

def test_the_serving_units_are_the_target_the_router_and_every_worker():
    assert release.serving_units(router=True) == UNITS
    assert release.serving_units(router=False) == ["sglang-datagen.target", "sglang-datagen-worker@*.service"]


def test_the_stop_step_stops_the_units_then_keeps_the_target_from_starting_them_at_boot():
    assert release.stop_commands(["systemctl"], UNITS) == [
        ["systemctl", "stop", *UNITS],
        ["systemctl", "disable", "--no-reload", "sglang-datagen.target"]]
    assert release.stop_commands(["true"], UNITS)[0] == ["true", "stop", *UNITS]
    assert release.list_command(["systemctl"], UNITS) == [
        "systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", *UNITS]


def gpu_free_wait_spec(monkeypatch) -> dict:
    """The module's argument_spec, as AnsibleModule gets it (the module's main() stopped right there)."""
    from ansible_collections.gpuops.repurpose.plugins.modules import gpu_free_wait

    class Captured(Exception):
        pass

    def capture(argument_spec, **_kwargs):
        raise Captured(argument_spec)

    monkeypatch.setattr(gpu_free_wait, "AnsibleModule", capture)
    with pytest.raises(Captured) as caught:
        gpu_free_wait.main()
    return caught.value.args[0]


def test_wait_free_gets_what_gpu_free_wait_would_get(monkeypatch):
    """Every option of the module, at its default and of its type, but the GPUs and the timeout."""
    spec = gpu_free_wait_spec(monkeypatch)
    cast = {"float": float, "int": int, "str": str, "list": list}
    expected = {name: (cast[opt["type"]](opt["default"]) if opt.get("default") is not None else None)
                for name, opt in spec.items()}
    params = release.wait_params([])
    assert params == expected
    assert params["timeout"] == 120.0 == release.DEFAULT_TIMEOUT_S
    for name, value in params.items():
        if value is not None:
            assert isinstance(value, cast[spec[name]["type"]]), (name, value)
    mine = release.wait_params([0, 1, "GPU-abc"], timeout=30, nvidia_smi="/opt/x/nvidia-smi", backend="nvidia_smi",
                               device_paths=["/tmp/dev/nvidia*"])
    assert mine == dict(expected, gpus=["0", "1", "GPU-abc"], timeout=30.0, nvidia_smi_path="/opt/x/nvidia-smi",
                        backend="nvidia_smi", device_paths=["/tmp/dev/nvidia*"])


@pytest.mark.parametrize("listing,active", [
    ("", []),
    ("sglang-datagen.target loaded active active SGLang servers for the datagen pipeline\n"
     "sglang-datagen-worker@0.service loaded inactive dead SGLang worker 0\n"
     "sglang-datagen-worker@1.service loaded activating auto-restart SGLang worker 1\n"
     "● sglang-datagen-router.service loaded failed failed sglang-router\n"
     "sglang-datagen-worker@2.service loaded deactivating stop-sigterm SGLang worker 2\n",
     ["sglang-datagen.target", "sglang-datagen-worker@1.service", "sglang-datagen-worker@2.service"]),
])
def test_the_units_that_still_run_are_read_from_list_units(listing, active):
    assert release.parse_active(listing) == active


RECORD_FREE = {"released_at": "2025-06-01T12:00:00Z", "free": True, "config_sha1": "abc",
               "gpus": [{"index": 0, "free": True}, {"index": 1, "free": True}], "holders": []}
HOLDER = {"pid": 4242, "name": "python3", "gpu": 1, "unit": "sglang-datagen-worker@1.service", "cmdline": "x"}
RECORD_BUSY = dict(RECORD_FREE, free=False, holders=[HOLDER, dict(HOLDER, gpu=None)],
                   msg="GPU memory not released within 120 s (3 samples, max_used_mib 512): GPU 1 80004 MiB.")


@pytest.mark.parametrize("finished,record,line", [
    (False, None, "state: not finished"),
    (True, None, "state: finished, no GPU release recorded"),
    (True, RECORD_FREE, "state: finished, gpus released at 2025-06-01T12:00:00Z (free)"),
    (True, RECORD_BUSY, "state: finished, gpus NOT released at 2025-06-01T12:00:00Z "
                        "(held by pid 4242 python3 (sglang-datagen-worker@1.service) on GPU 1,driver)"),
    (True, dict(RECORD_BUSY, holders=[]), "state: finished, gpus NOT released at 2025-06-01T12:00:00Z "
                                          "(GPU memory not released within 120 s (3 samples, max_used_mib 512): "
                                          "GPU 1 80004 MiB.)"),
])
def test_the_status_line_from_released_json(finished, record, line):
    assert release.status_line(finished, record) == line


def test_the_journal_line_says_how_long_which_gpus_and_free_or_who_holds_them():
    rec = release.make_record({"free": True, "gpus": RECORD_FREE["gpus"], "holders": [], "elapsed": 2.0},
                              [{"argv": ["systemctl", "stop"], "rc": 0}], UNITS, "abc", 4.24, now=0)
    assert rec["released_at"] == "1970-01-01T00:00:00Z" and rec["free"] is True and rec["elapsed_s"] == 4.2
    assert release.outcome_line(rec, "/w/released.json") == (
        "datagen release: GPU 0,1 free 4.2 s after stopping " + ", ".join(UNITS) + ", recorded in /w/released.json")
    busy = release.make_record(dict(RECORD_BUSY, elapsed=120.0), [
        {"argv": ["systemctl", "stop", *UNITS], "rc": None, "error": "no answer within 150 s"},
        {"argv": ["systemctl", "disable", "--no-reload", "sglang-datagen.target"], "rc": 0}], UNITS, "abc", 271.0)
    line = release.outcome_line(busy)
    assert line.startswith("datagen release: GPU 0,1 NOT free 271.0 s after stopping sglang-datagen.target, "), line
    assert "(`systemctl stop sglang-datagen.target` failed: no answer within 150 s): GPU memory not released" in line


def test_if_needed_releases_unless_this_job_was_released_and_nothing_serves():
    assert release.release_needed(RECORD_FREE, "abc", []) == ""
    assert release.release_needed(None, "abc", []) == "no release recorded for this job"
    assert release.release_needed(RECORD_FREE, "other", []) == "no release recorded for this job"
    assert release.release_needed(RECORD_BUSY, "abc", []) == "the last release found the GPUs busy"
    assert release.release_needed(RECORD_FREE, "abc", None) == "systemd could not say which serving units run"
    assert release.release_needed(RECORD_FREE, "abc", ["sglang-datagen-worker@3.service"]) == (
        "serving units run again: sglang-datagen-worker@3.service")


# ---------------------------------------------------------------- what the role deploys

def imported_module_utils(name: str) -> set:
    """The module_utils NAME imports, as paths below module_utils without ``.py`` (``_gpu/model``, ``_proc``)."""
    tree = ast.parse((MODULE_UTILS / f"{name}.py").read_text())
    out = set()

    def add(parts: list) -> None:
        out.add("/".join(parts))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith(PREFIX + "."):
            base = [part for part in node.module[len(PREFIX):].split(".") if part]
            for alias in node.names:  # a module of a package, or a name of the module BASE
                add(base + [alias.name] if (MODULE_UTILS.joinpath(*base, alias.name + ".py")).exists() else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX + "."):
                    add(alias.name[len(PREFIX) + 1:].split("."))
    return out


def test_the_role_deploys_exactly_the_import_closure_of_wait_free():
    closure, todo = set(), ["_gpu/free"]
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += sorted(imported_module_utils(name))
    assert sorted(DEPLOYED) == sorted(closure)


def deploy_lib(base: Path) -> Path:
    """``HOME/lib`` as the role leaves it: the datagen package and the module_utils, nothing else."""
    lib = base / "lib"
    shutil.copytree(DATAGEN_FILES / "datagen", lib / "datagen", ignore=shutil.ignore_patterns("__pycache__"))
    dest = lib / "ansible_collections" / "gpuops" / "repurpose" / "plugins" / "module_utils"
    for name in DEPLOYED:
        (dest / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(MODULE_UTILS / f"{name}.py", dest / f"{name}.py")
    return lib


def test_the_deployed_module_utils_import_from_the_pipeline_path_alone(tmp_path):
    """No __init__.py anywhere: ansible_collections and below are implicit namespace packages."""
    lib = deploy_lib(tmp_path)
    probe = ("import ansible_collections.gpuops.repurpose.plugins.module_utils._gpu.free as m, datagen.release as r; "
             "print(m.__file__); print(sorted(r.wait_params([0])))")
    done = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=str(lib)), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(lib / "ansible_collections/gpuops/repurpose/plugins/module_utils/_gpu/free.py")


# ---------------------------------------------------------------- the real command

STUB = """#!{python}
import json, os, signal, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:2] == ["stop"]:  # systemd stopping the workers: their processes end
    for pid in os.environ.get("STUB_STOP_ENDS", "").split():
        os.kill(int(pid), signal.SIGTERM)
"""


@pytest.fixture
def node(tmp_path):
    """A finished job on a node: the deployed lib, datagen.yml, its pipeline.done, eight fake GPUs, a stub
    systemctl."""
    lib = deploy_lib(tmp_path)
    config = fx.write_config(tmp_path, [{"name": "mm", "adapter": "metamath", "path": "mm.jsonl"}],
                             target_mix={"math": 1.0})
    work = tmp_path / "work"
    work.mkdir()
    sha1 = hashlib.sha1(Path(config).read_bytes()).hexdigest()
    (work / "pipeline.done").write_text(f"{sha1}  {config}\n")
    stub = tmp_path / "systemctl"
    stub.write_text(STUB.format(python=sys.executable, log=str(tmp_path / "systemctl.log")))
    stub.chmod(0o755)
    # a driver frees a dead process's memory a moment later (fakegpu's release_delay): long enough that the
    # release's first sample, taken right after the stop however loaded the machine, still sees it
    fake = FakeGpus(str(tmp_path), release_delay=3.0)
    yield {"lib": lib, "config": config, "work": work, "sha1": sha1, "stub": stub, "fake": fake,
           "log": tmp_path / "systemctl.log"}
    fake.close()


def datagen(node, *args, ends=(), timeout=180):
    env = dict(os.environ, PYTHONPATH=str(node["lib"]), FAKEGPU_DIR=node["fake"].dir,
               STUB_STOP_ENDS=" ".join(str(p.pid) for p in ends))
    return subprocess.run([sys.executable, "-m", "datagen", *args], env=env, cwd=str(node["work"]),
                          capture_output=True, text=True, timeout=timeout, check=False)


def release_args(node, *extra, timeout="10", systemctl=None):
    return ["release", "--config", node["config"], "--gpus", ALL_GPUS, "--timeout", timeout, "--router",
            "--systemctl", str(systemctl or node["stub"]), "--nvidia-smi", NVIDIA_SMI, "--backend", "nvidia_smi",
            "--device-path", node["fake"].device_glob, *extra]


def calls(node) -> list:
    return [json.loads(line) for line in node["log"].read_text().splitlines()] if node["log"].exists() else []


def test_a_worker_that_the_stop_ends_leaves_every_gpu_free(node):
    """A worker holds GPU 3 when the release starts; the stop ends it (as systemd would): exit 0, free=true."""
    worker = node["fake"].hold([3], mib=60000)
    done = datagen(node, *release_args(node), ends=[worker])
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert "\n" not in line, done.stdout  # one journal line
    assert line.startswith(f"datagen release: GPU {ALL_GPUS} free "), line
    assert f"recorded in {node['work'] / 'released.json'}" in line
    assert calls(node) == [["stop", *UNITS], ["disable", "--no-reload", "sglang-datagen.target"]]
    rec = json.loads((node["work"] / "released.json").read_text())
    assert rec["free"] is True and rec["holders"] == [] and rec["config_sha1"] == node["sha1"]
    assert [g["index"] for g in rec["gpus"]] == list(range(8)) and all(g["free"] for g in rec["gpus"])
    assert rec["gpus"][3]["memory_used_mib_before"] > 512  # the worker's memory was there at the first sample
    assert rec["released_at"].endswith("Z") and rec["stop"][0]["argv"] == [str(node["stub"]), "stop", *UNITS]
    assert not [p for p in os.listdir(node["work"]) if ".tmp-" in p]  # written atomically, nothing left over
    status = datagen(node, "status", "--config", node["config"])
    assert status.returncode == 0, status.stderr
    pipeline = json.loads(status.stdout)["pipeline"]
    assert pipeline["state"] == "finished" and pipeline["gpus_released"] is True
    assert pipeline["line"] == f"state: finished, gpus released at {rec['released_at']} (free)"


def test_a_holder_that_stays_fails_the_release_naming_its_pid(node):
    stranger = node["fake"].hold([5], mib=30000)
    done = datagen(node, *release_args(node, timeout="3"))
    assert done.returncode == 1, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"datagen release: GPU {ALL_GPUS} NOT free "), line
    assert "GPU 5 30004 MiB" in line and f"pid {stranger.pid} " in line, line
    rec = json.loads((node["work"] / "released.json").read_text())
    assert rec["free"] is False and {h["pid"] for h in rec["holders"]} == {stranger.pid}
    assert [g["index"] for g in rec["gpus"] if not g["free"]] == [5]
    pipeline = json.loads(datagen(node, "status", "--config", node["config"]).stdout)["pipeline"]
    assert pipeline["gpus_released"] is False
    assert pipeline["line"].startswith(f"state: finished, gpus NOT released at {rec['released_at']} (held by pid "
                                       f"{stranger.pid} "), pipeline["line"]
    # the role's re-run (--if-needed) tries again, and once the holder is gone the GPUs are released
    node["fake"].kill(stranger)
    again = datagen(node, *release_args(node, "--if-needed", "--json"))
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["acted"], out["free"], out["record"]["free"]) == (True, True, True)


def test_with_a_true_stub_the_right_argv_would_run_and_if_needed_does_nothing_the_second_time(node):
    done = datagen(node, *release_args(node, "--json", systemctl="true"))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["acted"] is True and [s["argv"] for s in out["record"]["stop"]] == [
        ["true", "stop", *UNITS], ["true", "disable", "--no-reload", "sglang-datagen.target"]]
    assert [s["rc"] for s in out["record"]["stop"]] == [0, 0]
    before = (node["work"] / "released.json").read_text()
    again = datagen(node, *release_args(node, "--if-needed", "--json", systemctl="true"))
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["acted"] is False and out["line"].startswith(f"datagen release: nothing to do, GPU {ALL_GPUS} released at ")
    assert (node["work"] / "released.json").read_text() == before  # not rewritten


def test_a_serving_unit_running_again_is_released_by_if_needed(node, tmp_path):
    """released.json says free, but a boot or a hand started a worker again: --if-needed stops it."""
    datagen(node, *release_args(node, systemctl="true"))
    listing = tmp_path / "listing-systemctl"
    listing.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {tmp_path / 'listing.log'}
        [ "$1" = list-units ] && echo 'sglang-datagen-worker@4.service loaded active running SGLang worker 4'
        exit 0
        """))
    listing.chmod(0o755)
    done = datagen(node, *release_args(node, "--if-needed", "--json", systemctl=listing))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["acted"], out["why"]) == (True, "serving units run again: sglang-datagen-worker@4.service")
    assert [line.split()[0] for line in (tmp_path / "listing.log").read_text().splitlines()] == [
        "list-units", "stop", "disable"]


def test_nothing_is_stopped_for_a_config_the_pipeline_has_not_finished(node):
    Path(node["config"]).write_text(Path(node["config"]).read_text() + "seed: 8\n")  # a new job
    done = datagen(node, *release_args(node))
    assert done.returncode == 0, done.stderr
    assert "has not finished" in done.stdout and "left up" in done.stdout
    assert calls(node) == [] and not (node["work"] / "released.json").exists()
    pipeline = json.loads(datagen(node, "status", "--config", node["config"]).stdout)["pipeline"]
    assert pipeline == {"state": "not_finished", "gpus_released": None, "release": None,
                        "line": "state: not finished"}


def test_missing_module_utils_fail_the_release_and_say_where_they_belong(node):
    shutil.rmtree(node["lib"] / "ansible_collections")
    done = datagen(node, *release_args(node))
    assert done.returncode == 1
    assert "cannot import gpu_free_wait's runner" in done.stdout and "HOME/lib" in done.stdout, done.stdout
    assert json.loads((node["work"] / "released.json").read_text())["free"] is False


# ---------------------------------------------------------------- the role

ROLE = ROOT / "roles" / "sglang_datagen"
CONFIG = {"work_dir": "WORK", "model": "target-model", "target_total": 10, "target_mix": {"math": 1.0},
          "sources": [{"name": "mm", "adapter": "metamath", "path": "mm.jsonl"}],
          "servers": ["http://127.0.0.1:30000"], "generate": {"concurrency": 4}}


def play(tmp_path: Path, role_vars: dict, tasks_from: str, after: list = (), args=(), env=None, name="play"):
    """include_role TASKS_FROM (public: its defaults and vars stay for AFTER) on localhost, ROLE_VARS as the
    play's vars (above the role's defaults, below its vars/main.yml and set_fact, as inventory vars are); the
    run and ``{task name: result}``."""
    tasks = [{"ansible.builtin.include_role": {"name": "gpuops.repurpose.sglang_datagen", "tasks_from": tasks_from,
                                               "public": True}}] + list(after)
    playbook = tmp_path / f"{name}.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "connection": "local",
                                     "vars": dict(role_vars, ansible_python_interpreter=sys.executable),
                                     "tasks": tasks}]))
    run = run_playbook(playbook, "localhost,", args=args, json_results=True, env=env, timeout=240)
    results = {}
    if run.stdout.startswith("{"):
        results = {name.split(" : ", 1)[-1]: hosts.get("localhost", {}) for name, hosts in run.results.items()}
    return run, results


def shown(results: dict) -> dict:
    return json.loads(results["SHOW"]["msg"])


def show(*names: str) -> dict:
    return {"name": "SHOW", "ansible.builtin.debug": {"msg": "{{ {" + ", ".join(
        "'%s': %s | default('UNDEFINED')" % (n, n) for n in names) + "} | to_json }}"}}


@pytest.fixture
def job(tmp_path):
    """The role's view of a pipeline node: its config (as validate.yml leaves it) and paths under tmp_path."""
    work = tmp_path / "work"
    work.mkdir()
    config = dict(CONFIG, work_dir=str(work))
    return {"work": work, "config_path": tmp_path / "datagen.yml",
            "vars": {"sglang_datagen__config": config, "sglang_datagen_work_dir": str(work),
                     "sglang_datagen_config_path": str(tmp_path / "datagen.yml"),
                     "sglang_datagen__is_pipeline_node": True}}


def write_config_as_deploy_does(path: str) -> dict:
    """deploy.yml's "Write the pipeline config" task, as it is in the file."""
    deploy = yaml.safe_load((ROLE / "tasks" / "deploy.yml").read_text())
    task = next(t for t in deploy if t.get("name") == "Write the pipeline config")
    return {"name": "write config", "ansible.builtin.copy": dict(task["ansible.builtin.copy"], dest=path)}


def test_finished_means_the_marker_names_the_config_this_run_writes(tmp_path, job):
    path = str(job["config_path"])
    # no marker yet: not finished; the config as deploy.yml writes it
    run, res = play(tmp_path, job["vars"], "finished.yml",
                    [write_config_as_deploy_does(path), show("sglang_datagen__finished", "sglang_datagen__done")])
    assert run.rc == 0, run.output[-3000:]
    assert shown(res) == {"sglang_datagen__finished": False, "sglang_datagen__done": False}
    # the unit's marker (sha1sum of the config it started on): finished, and done with the release on
    sha1 = hashlib.sha1(job["config_path"].read_bytes()).hexdigest()
    (job["work"] / "pipeline.done").write_text(f"{sha1}  {path}\n")
    run, res = play(tmp_path, job["vars"], "finished.yml",
                    [write_config_as_deploy_does(path), show("sglang_datagen__finished", "sglang_datagen__done")])
    assert run.rc == 0, run.output[-3000:]
    assert res["write config"]["changed"] is False  # the same text: the checksum the decision compared
    assert shown(res) == {"sglang_datagen__finished": True, "sglang_datagen__done": True}
    # release off, not serving, or another node: finished, not done (served and launched as today)
    for off in ({"sglang_datagen_release_when_done": False}, {"sglang_datagen_serve": False},
                {"sglang_datagen__is_pipeline_node": False}):
        run, res = play(tmp_path, dict(job["vars"], **off), "finished.yml",
                        [show("sglang_datagen__finished", "sglang_datagen__done")])
        assert shown(res) == {"sglang_datagen__finished": True, "sglang_datagen__done": False}, off
    # a changed config is a new job
    changed = dict(job["vars"], sglang_datagen__config=dict(job["vars"]["sglang_datagen__config"], target_total=11))
    run, res = play(tmp_path, changed, "finished.yml", [show("sglang_datagen__finished", "sglang_datagen__done")])
    assert shown(res) == {"sglang_datagen__finished": False, "sglang_datagen__done": False}


def test_the_config_text_is_byte_for_byte_what_earlier_releases_wrote(tmp_path, job):
    """deploy.yml writes sglang_datagen__config_text now: a node deployed before must not see a changed config
    (that would restart a running pipeline)."""
    old = {"name": "old", "ansible.builtin.copy": {
        "content": "# Managed by Ansible (role gpuops.repurpose.sglang_datagen): edit sglang_datagen_config instead.\n"
                   "{{ sglang_datagen__config | to_nice_yaml(indent=2, sort_keys=false) }}\n",
        "dest": str(tmp_path / "old.yml"), "mode": "0644"}}
    config = dict(job["vars"]["sglang_datagen__config"], sampling={"temperature": 0.7}, name="ünïcode ✓")
    run, _res = play(tmp_path, dict(job["vars"], sglang_datagen__config=config), "finished.yml",
                     [old, write_config_as_deploy_does(str(tmp_path / "new.yml"))])
    assert run.rc == 0, run.output[-3000:]
    assert (tmp_path / "new.yml").read_bytes() == (tmp_path / "old.yml").read_bytes()


def render_unit(tmp_path, role_vars: dict) -> str:
    # what the validation pass leaves (validate.yml): the worker URLs, the key, check-config's in-flight bound
    facts = {"sglang_datagen__all_worker_urls": ["http://127.0.0.1:31000"], "sglang_datagen__needs_key": False,
             "sglang_datagen__max_in_flight": 64}
    run, res = play(tmp_path, dict(role_vars, **facts), "finished.yml", [
        {"name": "SHOW", "ansible.builtin.debug": {
            "msg": "{{ lookup('ansible.builtin.template', '%s') }}" % (ROLE / "templates" / "datagen-pipeline.service.j2")},
         "vars": facts}])
    assert run.rc == 0, run.output[-3000:]
    return res["SHOW"]["msg"]


def exec_start_post(unit: str) -> list:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStartPost=")]


def test_the_pipeline_unit_releases_after_the_marker_only_with_the_release_on(tmp_path, job):
    unit = render_unit(tmp_path, job["vars"])
    marker, rel = exec_start_post(unit)
    assert "pipeline.done" in marker
    assert shlex.split(rel) == ["/opt/datagen/venv/bin/python", "-m", "datagen", "release", "--config",
                                str(job["config_path"]), "--gpus", "0,1,2,3,4,5,6,7", "--timeout", "120", "--router"]
    assert "Environment=PYTHONPATH=/opt/datagen/lib" in unit
    unit = render_unit(tmp_path, dict(job["vars"], sglang_datagen_use_router=False, sglang_datagen_gpus=[2, 3],
                                      sglang_datagen_release_timeout=300))
    assert shlex.split(exec_start_post(unit)[1])[-4:] == ["--gpus", "2,3", "--timeout", "300"]
    for off in ({"sglang_datagen_release_when_done": False}, {"sglang_datagen_serve": False}):
        unit = render_unit(tmp_path, dict(job["vars"], **off))
        assert len(exec_start_post(unit)) == 1 and "datagen release" not in unit, off


@pytest.fixture
def role_node(tmp_path, job):
    """A finished job on a node laid out as the role leaves it (HOME/lib, a venv python), a fake nvidia-smi and a
    stub systemctl first on PATH."""
    home = tmp_path / "home"
    home.mkdir()
    deploy_lib(home)
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").symlink_to(sys.executable)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(NVIDIA_SMI)
    (bin_dir / "systemctl").write_text(STUB.format(python=sys.executable, log=str(tmp_path / "systemctl.log")))
    (bin_dir / "systemctl").chmod(0o755)
    fake = FakeGpus(str(tmp_path), release_delay=0.3)
    role_vars = dict(job["vars"], sglang_datagen_home=str(home), sglang_datagen_release_timeout=5)
    path = str(job["config_path"])
    run, _res = play(tmp_path, role_vars, "finished.yml", [write_config_as_deploy_does(path)], name="deploy")
    assert run.rc == 0, run.output[-3000:]
    sha1 = hashlib.sha1(job["config_path"].read_bytes()).hexdigest()
    (job["work"] / "pipeline.done").write_text(f"{sha1}  {path}\n")
    env = ansible_env(PATH=f"{bin_dir}:{ansible_env()['PATH']}", FAKEGPU_DIR=fake.dir)
    yield {"vars": role_vars, "env": env, "fake": fake, "log": tmp_path / "systemctl.log", "work": job["work"]}
    fake.close()


def rerun(tmp_path, role_node, *args, ends=()):
    env = dict(role_node["env"], STUB_STOP_ENDS=" ".join(str(p.pid) for p in ends))
    return play(tmp_path, role_node["vars"], "finished.yml", [
        {"name": "done", "ansible.builtin.include_role": {"name": "gpuops.repurpose.sglang_datagen",
                                                          "tasks_from": "done.yml"}}],
        args=args, env=env, name="done")


def test_a_rerun_of_a_finished_job_releases_once_then_only_reports(tmp_path, role_node):
    worker = role_node["fake"].hold([1], mib=50000)  # an idle worker a job finished before the release left up
    run, res = rerun(tmp_path, role_node, ends=[worker])
    assert run.rc == 0, run.output[-4000:]
    step = res["Done | Give the GPUs back unless they were released for this job and nothing serves"]
    assert step["changed"] is True
    assert [json.loads(line)[0] for line in role_node["log"].read_text().splitlines()] == ["list-units", "stop", "disable"]
    assert json.loads(role_node["log"].read_text().splitlines()[1]) == ["stop", *UNITS]
    record = json.loads((role_node["work"] / "released.json").read_text())
    assert record["free"] is True
    report = res["Report"]["msg"]
    assert report[0] == "pipeline: finished for this config (nothing served or started: sglang_datagen_release_when_done)"
    assert report[1].startswith(f"gpus: released at {record['released_at']} (free), just now: datagen release: GPU "), report
    assert report[2] == f"report: {role_node['work']}/report/composition.md, the dataset: {role_node['work']}/merged"
    # again: nothing to do, nothing changed, the same record
    run, res = rerun(tmp_path, role_node)
    assert run.rc == 0, run.output[-4000:]
    assert run.json["stats"]["localhost"]["changed"] == 0
    assert res["Report"]["msg"][1] == f"gpus: released at {record['released_at']} (free)"
    # a dry run says the same without running anything
    run, res = rerun(tmp_path, role_node, "--check")
    assert run.rc == 0, run.output[-4000:]
    assert res["Report"]["msg"][1] == f"gpus: released at {record['released_at']} (free)"


def test_a_rerun_fails_naming_the_holder_when_the_gpus_stay_held(tmp_path, role_node):
    stranger = role_node["fake"].hold([6], mib=20000)
    run, res = rerun(tmp_path, role_node)
    assert run.rc != 0
    msg = " ".join(res["Done | Fail on GPUs the release could not free"]["msg"].split())
    assert "but the GPUs are not free: datagen release: GPU 0,1,2,3,4,5,6,7 NOT free" in msg, msg
    assert f"pid {stranger.pid} " in msg and "GPU 6 20004 MiB" in msg, msg
    assert json.loads((role_node["work"] / "released.json").read_text())["free"] is False


def test_main_skips_serving_for_a_finished_job_and_decides_before_the_gpu_check():
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    names = [t.get("ansible.builtin.import_tasks") or t.get("ansible.builtin.include_tasks") for t in tasks]
    assert names.index("finished.yml") < names.index("gpus_free.yml") < names.index("serve.yml")
    by_file = dict(zip(names, tasks))
    for skipped in ("gpus_free.yml", "serve.yml", "ready.yml", "launch.yml"):
        assert "not sglang_datagen__done | bool" in by_file[skipped]["when"], skipped
    assert by_file["done.yml"]["when"] == "sglang_datagen__done | bool"
    assert names[-1] == "done.yml"
