# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The playbook's validation pass, against the CT200 lab, as an operator makes the mistakes.

Each mistake must fail (or warn) with a message that names the variable, the cause and the
fix, before the run lock, the plan and any signal: the lab trainer's pids are the same
before and after, and no lock holder is left. The datagen half is validated before the
stop half runs (its config through the pipeline's own ``datagen check-config``), and a
pipeline that can only fail after launch fails the play with its journal lines.
Skipped with the reason when the lab is not up.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from tests.support.ct200 import lock_holder, trainer_pids
from tests.support.datagen import CONVERGE, INSTALL_TASK, LAB_VARS_FILE, free_gpus, reset_pipeline
from tests.support.lab import DATAGEN_HOST, MAIN_CT, NOSUDO_USER, trainer
from tests.support.paths import FAKEGPU_DIR, LAB_INVENTORY
from tests.support.playbook import run_playbook
from tests.support.ssh import in_ct as ct
from tests.support.stop_training import play

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

LAB_VARS = yaml.safe_load(LAB_VARS_FILE.read_text())
WITH_DATAGEN = {"repurpose_datagen": True}
SQUAT_BASE = 31500  # the serving-port test's workers: see there
MISSING_SOURCE = {"name": "lab", "adapter": "messages", "category": "general", "path": "/srv/datagen/sources/missing.jsonl"}


def lab_config(**changes) -> dict:
    """The lab's datagen config (inventories/lab) with ``changes`` on top (extra vars replace it whole)."""
    config = copy.deepcopy(LAB_VARS["sglang_datagen_config"])
    config.update(changes)
    return config


@pytest.fixture(scope="module")
def running_trainer(lab):
    trainer("graceful")
    return lab


def flat(out: str) -> str:
    """The output with YAML's line wrapping undone (a message may wrap anywhere)."""
    return " ".join(out.split())


def refused_before_anything(status: dict, before: set[int], rc: int, out: str) -> None:
    """Failed in the validation play: no lock, no plan, no signal, the trainer untouched."""
    assert rc != 0, out[-3000:]
    assert "PLAY [Repurpose training containers for data generation]" not in out, out[-3000:]
    assert "Stop | Plan" not in out and "Lock |" not in out
    assert lock_holder(status) is None
    assert trainer_pids(status) == before


MISTAKES = [
    # the datagen half is checked before the stop half, by the pipeline's own validator
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(sampling={"max_tokens": 64, "temprature": 0.7})),
                 ["sglang_datagen_config.sampling.temprature: unknown sampling parameter", "temperature",
                  "python -m datagen check-config"], id="datagen-config-typo"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(sources=[MISSING_SOURCE])),
                 ["sglang_datagen_config.sources[0].path: not found: /srv/datagen/sources/missing.jsonl",
                  "sglang_datagen_extra_files"], id="datagen-source-missing"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_server_command="", sglang_datagen_model_path=""),
                 ["sglang_datagen_model_path is empty"], id="datagen-empty-model-path"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_gpus=list(range(9))),
                 ["names GPU(s) 8, which this node does not have (nvidia-smi lists 0, 1, 2, 3, 4, 5, 6, 7)"],
                 id="datagen-gpu-the-node-lacks"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(target_mix={"codng": 0.3, "general": 0.7})),
                 ["target_mix.codng: no source supplies it and the existing set does not have it",
                  "(did you mean coding?)"], id="datagen-target-mix-typo"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=dict(lab_config(), target_mixx={"coding": 1.0})),
                 ["sglang_datagen_config.target_mixx: unknown key (did you mean target_mix?)"],
                 id="datagen-config-key-typo"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(sampling={"max_tokens": 64, "seed": 7})),
                 ["sampling.seed is set, but SGLang 0.5.23 ignores", "--enable-deterministic-inference"],
                 id="datagen-seed-ignored"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(generate={"extra_body": {"rid": "x"}})),
                 ["generate.extra_body has rid: sglang-router 0.3.2 drops"], id="datagen-extra-body-dropped"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(generate={"thinking": True})),
                 ["sglang_datagen_config.generate.thinking is true, but sglang_datagen_parser_families does not say"],
                 id="datagen-thinking-unknown-family"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_tp_size=3),
                 ["sglang_datagen: bad serving layout", "a multiple of sglang_datagen_tp_size=3"],
                 id="datagen-tp-size-not-dividing"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_gpus=[0, 1, 1, 2]),
                 ["sglang_datagen: bad serving layout", "no duplicates"], id="datagen-gpu-twice"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_router_port=31002),
                 ["sglang_datagen: bad serving layout", "not one of the worker ports"], id="datagen-router-on-a-worker-port"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_ready_delay=0),
                 ["sglang_datagen: bad serving layout", "ready_delay >= 1"], id="datagen-ready-delay-zero"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_router_metrics_port=29000),
                 ["sglang_datagen_router_metrics_port=29000: in 22000-29999", "from 30000 to 32767"],
                 id="datagen-port-in-nccl-range"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_stages=["prepare", "generat"]),
                 ["sglang_datagen_stages=", "use stages from prepare, generate, tokenize, merge, report"],
                 id="datagen-stage-typo"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_concurrency="fast"),
                 ['sglang_datagen_concurrency="fast": set auto'], id="datagen-concurrency-word"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_extra_files=[{"dest": "/srv/datagen/x.jsonl"}]),
                 ["sglang_datagen_extra_files: every item needs src"], id="datagen-extra-file-without-src"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_model_path="/srv/models/Qwen3-8B"),
                 ["sglang_datagen_model_path=/srv/models/Qwen3-8B is not a directory on this node",
                  "huggingface-cli download"], id="datagen-model-dir-missing"),
    pytest.param(dict(WITH_DATAGEN, sglang_datagen_install_sglang=True, sglang_datagen_venv="/opt/datagen/venv-new",
                      sglang_datagen_venv_min_free_gb=100000),
                 ["GB free; it needs 100000 GB", "sglang_datagen_venv_min_free_gb"], id="datagen-no-room-for-venv"),
    # the stop half
    pytest.param({"stop_training_gpu_count": 4},
                 ["stop_training_gpu_count=4, but the container sees 8 GPU(s) (0, 1, 2, 3, 4, 5, 6, 7)",
                  "nothing was signalled"], id="gpu-count-the-node-lacks"),
    pytest.param({"stop_training_gpus": ["3", "9"]},
                 ["stop_training_gpus names 9, which the container does not have"], id="gpu-index-the-node-lacks"),
    pytest.param({"stop_training_ladder": []}, ["stop_training_ladder must have at least one rung"],
                 id="empty-ladder"),
    pytest.param({"stop_training_gpu_timeout": -5}, ["stop_training_gpu_timeout must be >= 0 (seconds)"],
                 id="negative-gpu-timeout"),
    pytest.param({"stop_training_kill_timeout": "sixty"},
                 ['stop_training_kill_timeout="sixty" is not a number', "set stop_training_kill_timeout to a number"],
                 id="type-error-one-line"),
    pytest.param({"stop_training_vmid": f"{MAIN_CT} "}, [f'got "{MAIN_CT} "', "proxmox_vmid"],
                 id="vmid-with-a-space-quoted"),
    pytest.param({"stop_training_vmid": 999}, ["CT 999 does not exist on lab-pve", "pct list", "Set stop_training_vmid"],
                 id="vmid-no-such-container"),
    pytest.param({"stop_training_match": "fake_trainer(\\.py"},
                 ["stop_training_match=", "is not a valid regular expression", "missing )"], id="bad-match-regex"),
    pytest.param({"stop_training_exclude": ["[unclosed"]},
                 ["stop_training_exclude[0]=", "is not a valid regular expression"], id="bad-exclude-regex"),
    pytest.param({"stop_training_tmux_session": "dflsh"},
                 [f'stop_training_tmux_session="dflsh": no such tmux session in CT {MAIN_CT}', "dflash",
                  "still selects", "Ctrl-C cannot be delivered", "stop_training_missing_session=signal"],
                 id="tmux-session-typo"),
    pytest.param({"stop_training_tmux_sesion": "dflash", "stop_training_strict_vars": True},
                 ["stop_training_tmux_sesion is not a variable of this role (did you mean stop_training_tmux_session?)"],
                 id="variable-name-typo-strict"),
    pytest.param({"ansible_user": NOSUDO_USER},
                 ["may not run /usr/sbin/pct", f"{NOSUDO_USER} ALL=(root) NOPASSWD: /usr/sbin/pct",
                  "Nothing was signalled"],
                 id="non-root-pve-user"),
]


@pytest.mark.parametrize(("extra", "named"), MISTAKES)
def test_each_mistake_is_named_with_its_fix_before_anything_is_touched(running_trainer, extra, named):
    before = trainer_pids(running_trainer)
    assert before, "the lab trainer is not running"
    rc, out = play(extra)
    refused_before_anything(running_trainer, before, rc, out)
    for needle in named:
        assert needle in flat(out), f"{needle!r} not in:\n{out[-3000:]}"
    assert "Traceback" not in out and "_AnsibleTaggedStr" not in out
    assert "pct start 999" not in out


def test_check_mode_runs_the_same_pass(running_trainer):
    before = trainer_pids(running_trainer)
    rc, out = play(dict(WITH_DATAGEN, sglang_datagen_config=lab_config(sampling={"temprature": 0.7})), "--check")
    refused_before_anything(running_trainer, before, rc, out)
    assert "sglang_datagen_config.sampling.temprature" in flat(out)


def fake_driver(status: dict, driver: str, cuda: str) -> None:
    """What the lab's fake nvidia-smi reports as the NVIDIA driver and its CUDA version (host and containers)."""
    subprocess.run([sys.executable, str(FAKEGPU_DIR / "fakegpu.py"), "--dir", status["fakegpu"]["dir"], "config",
                    "--driver-version", driver, "--cuda-version", cuda], check=True, capture_output=True, timeout=30)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check_mode"])
def test_a_driver_too_old_for_sglangs_cuda_build_is_refused_before_the_training_is_touched(running_trainer, check):
    """An r570 driver (CUDA 12.8) on a node that is to install SGLang 0.5.23, a CUDA 13 build."""
    before = trainer_pids(running_trainer)
    fake_driver(running_trainer, "570.124.06", "12.8")
    try:
        rc, out = play(dict(WITH_DATAGEN, sglang_datagen_install_sglang=True), *(["--check"] if check else []))
    finally:
        fake_driver(running_trainer, "580.95.05", "13.0")
    refused_before_anything(running_trainer, before, rc, out)
    for needle in ("This node cannot run SGLang 0.5.23; nothing was stopped or installed",
                   "NVIDIA driver 570.124.06 is older than 580, the oldest that runs CUDA 13 builds",
                   "Fix: upgrade the NVIDIA driver on the PVE host", "sglang_datagen_sglang_version"):
        assert needle in flat(out), f"{needle!r} not in:\n{out[-3000:]}"


def test_a_variable_name_typo_is_a_warning_with_the_closest_name(running_trainer):
    before = trainer_pids(running_trainer)
    rc, out = play({"stop_training_tmux_sesion": "x"}, "--check")
    assert rc == 0, out[-3000:]
    out = flat(out)
    assert "WARNING: stop_training: unknown variables" in out
    assert "stop_training_tmux_sesion is not a variable of this role (did you mean stop_training_tmux_session?)" in out
    assert trainer_pids(running_trainer) == before


def test_missing_session_with_signal_says_ctrl_c_cannot_be_delivered_in_the_plan(running_trainer):
    before = trainer_pids(running_trainer)
    rc, out = play({"stop_training_tmux_session": "dflsh", "stop_training_missing_session": "signal"}, "--check")
    assert rc == 0, out[-3000:]
    out = flat(out)
    assert 'tmux session "dflsh" does not exist: Ctrl-C cannot be delivered' in out
    assert "SIGINT goes straight to the processes stop_training_match selects" in out
    # the plan's ladder has no tmux rung left to wait on
    plan = out[out.index("DRY RUN (check mode): nothing will be signalled"):]
    ladder = plan.split("Ladder:")[1].split("'")[0]
    assert "Will stop" in plan and "SIGINT" in ladder and "tmux" not in ladder, ladder
    assert trainer_pids(running_trainer) == before


def test_a_pipeline_that_fails_after_launch_fails_the_play_with_its_journal(running_trainer):
    """A glob that matches nothing passes the up-front check (its directory exists); prepare then
    refuses it, the unit loops in auto-restart, and the play fails with the journal lines."""
    bad = lab_config(sources=[{"name": "lab", "adapter": "messages", "category": "general",
                               "path": "/srv/datagen/sources/*.parquet"}])
    extra = {"sglang_datagen_config": bad, "sglang_datagen_pipeline_ready_timeout": 120}
    free_gpus()  # the data half alone serves only on free GPUs; the trainer is back for the tests after it
    try:
        done = run_playbook(CONVERGE, LAB_INVENTORY, [extra], timeout=800)
        out = flat(done.output)
        assert done.rc != 0, out[-3000:]
        assert "datagen-pipeline.service failed and loops in auto-restart" in out or \
            "datagen-pipeline.service failed" in out, out[-3000:]
        assert "no .jsonl/.json/.parquet file matches /srv/datagen/sources/*.parquet" in out, out[-3000:]
        assert "pipeline: running" not in out and "pipeline: started" not in out
    finally:
        ct(running_trainer, "systemctl", "stop", "datagen-pipeline.service", check=False)
        ct(running_trainer, "systemctl", "reset-failed", "datagen-pipeline.service", check=False)
        trainer("graceful")


def test_missing_session_with_signal_stops_the_job_with_sigint_without_waiting_on_tmux(running_trainer):
    """For real: the Ctrl-C rung becomes a SIGINT straight to the matched launcher; it ends the job."""
    assert trainer_pids(running_trainer)
    try:
        rc, out = play({"stop_training_tmux_session": "dflsh", "stop_training_missing_session": "signal"})
        assert rc == 0, out[-3000:]
        out = flat(out)
        assert "Ctrl-C cannot be delivered" in out
        assert "by rung SIGINT" in out and "by rung SIGINT via tmux" not in out, out[-3000:]
        assert not trainer_pids(running_trainer)
    finally:
        trainer("graceful")


def test_a_serving_port_another_program_holds_is_refused_before_the_training_is_touched(running_trainer):
    """A program in CT200 already listens on worker 3's port: SGLang worker 3 would crash-loop on "address already
    in use" after the training was stopped. Named with its holder; the role's own workers on their ports (a
    re-run) are not a problem, which the lab's other data-half runs show."""
    # a job still to serve: a finished one (an earlier test's) serves nothing, so no port of it can clash
    reset_pipeline(running_trainer)
    before = trainer_pids(running_trainer)
    # The lanes' containers share the host's network: each lane serves on its own datagen address, and the role's
    # default worker ports (31000-31007) may be held by this lane's own workers of an earlier test. The workers
    # of this run start at SQUAT_BASE instead (inside the lab's reserved ports, which no host test picks and no
    # lane serves on), and the squatter takes worker 3's port on this lane's address.
    ct(running_trainer, "systemctl", "stop", "sglang-datagen.target", "datagen-pipeline.service", check=False)
    port = SQUAT_BASE + 3
    ct(running_trainer, "systemd-run", "--unit", "lab-port-squatter", "--", "python3", "-m", "http.server",
       "--bind", DATAGEN_HOST, str(port))
    try:
        ct(running_trainer, "python3", "-c", "import socket, time\nfor _ in range(100):\n    try:\n"
           "        socket.create_connection((%r, %d), 1).close()\n        break\n"
           "    except OSError:\n        time.sleep(0.2)\nelse:\n    raise SystemExit('nothing listens')" % (DATAGEN_HOST, port))
        squatter = ct(running_trainer, "systemctl", "is-active", "lab-port-squatter", check=False).stdout.strip()
        assert squatter == "active", ct(running_trainer, "sh", "-c", "journalctl -u lab-port-squatter --no-pager -n 20;"
                                        " ss -ltnp 'sport = :%d'" % port, check=False).stdout
        rc, out = play(dict(WITH_DATAGEN, sglang_datagen_worker_base_port=SQUAT_BASE))
    finally:
        ct(running_trainer, "systemctl", "stop", "lab-port-squatter", check=False)
        ct(running_trainer, "systemctl", "reset-failed", "lab-port-squatter", check=False)
    refused_before_anything(running_trainer, before, rc, out)
    text = flat(out)
    assert "port %d (sglang_datagen_worker_base_port + 3) is in use on %s by pid" % (port, DATAGEN_HOST) in text, out[-3000:]
    assert "lab-port-squatter.service" in text and "Fix: stop what holds the port" in text


@pytest.mark.parametrize("check", [False, True], ids=["run", "check_mode"])
def test_the_data_half_alone_refuses_gpus_the_training_holds(running_trainer, check):
    """``--tags sglang_datagen`` while the training still runs: the workers would start beside it (and the play
    reported success). Refused naming the holders, before anything is installed; a dry run says it would be."""
    # a job still to serve: a finished one (an earlier test's) needs no GPU and serves nothing whatever holds them
    reset_pipeline(running_trainer)
    before = trainer_pids(running_trainer)
    rc, out = play(WITH_DATAGEN, "--tags", "sglang_datagen", *(["--check"] if check else []))
    text = flat(out)
    assert "sglang_datagen_gpus=[0, 1, 2, 3, 4, 5, 6, 7] are in use (GPU 0, 1, 2, 3, 4, 5, 6, 7, held by pid" in text, \
        out[-3000:]
    assert "fake_trainer" in text and "Stop that job first" in text
    assert trainer_pids(running_trainer) == before
    if check:
        assert "Dry run: sglang_datagen_gpus=" in text
    else:
        assert rc != 0 and "Nothing was installed or started." in text
        assert "Create the venv" not in out and INSTALL_TASK not in out and "Write the systemd units" not in out
