# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One generation job across two nodes, for real, against the two-node lab (``tests/lab/lab up --nodes 2``).

``playbooks/repurpose_ct200.yml`` with ``inventories/lab-fleet``: both trainers stopped, both nodes' GPUs
free, eight stand-in workers on each node (CT200's on 127.0.0.1, CT210's on 127.0.0.2 in lane 0: the lab's nodes
share this machine's network), the REAL sglang-router and the one pipeline on CT200 only, an API key that every
worker and the router require. The stand-ins' own counters (their /metrics) show which node served. Losing
CT210's workers mid-run still finishes with every id once; a re-run brings them back (one test: the two-node
play and the pipeline are paid for once). Skipped with the reason when the second node is not up.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.support.datagen import LAB_VARS_FILE, WORK, generated_rows, reset_pipeline, wait_pipeline_finished
from tests.support.lab import DATAGEN_HOST, DATAGEN_HOST2, MAIN_CT, NODE2_CT, lab_status, trainer
from tests.support.net import http, read_metrics
from tests.support.paths import FLEET_INVENTORY
from tests.support.playbook import PlaybookRun, run_playbook
from tests.support.ssh import attach
from tests.support.stop_training import REPURPOSE_PLAYBOOK
from tests.support.wait import wait_for

NODE_WORKERS = {
    MAIN_CT: [f"http://{DATAGEN_HOST}:{31000 + i}" for i in range(8)],
    NODE2_CT: [f"http://{DATAGEN_HOST2}:{31000 + i}" for i in range(8)],
}
ROUTER = f"http://{DATAGEN_HOST}:30000"
FAST = {"stop_training_ladder": [{"signal": "SIGINT", "via": "tmux", "timeout": 20}, {"signal": "SIGKILL", "timeout": 5}]}

pytestmark = [pytest.mark.lab, pytest.mark.lab_fleet, pytest.mark.timeout(1200)]


def in_ct(lab: dict, vmid: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command inside container VMID straight through lxc-attach (the lab's own path, not the code under test)."""
    return attach(lab, *argv, vmid=vmid, timeout=120, check=check)


def served(url: str) -> float:
    """Chat requests this stand-in answered (its own counter, /metrics needs no key, as in SGLang)."""
    return read_metrics(url + "/metrics")["standin_ok_total"]


def worker_invocation(lab: dict, vmid: str, index: int) -> str:
    """systemd's InvocationID of worker INDEX in container VMID: a new one means the worker (and its counters)
    started afresh."""
    return in_ct(lab, vmid, "systemctl", "show", "-p", "InvocationID", "--value",
                 f"sglang-datagen-worker@{index}.service").stdout.strip()


def api_key(lab: dict) -> str:
    return in_ct(lab, MAIN_CT, "cat", "/opt/datagen/api-key").stdout.strip()


def worker_args(*extra: str) -> dict:
    """The lab's worker arguments, then EXTRA; the serving kept up after the job (the re-run below checks that it
    brings the second node's workers back behind the router)."""
    args = yaml.safe_load(LAB_VARS_FILE.read_text())["sglang_datagen_worker_extra_args"]
    return {"sglang_datagen_worker_extra_args": [*args, *extra], "sglang_datagen_release_when_done": False}


def play(*args: str, extra: dict | None = None) -> PlaybookRun:
    """The repurpose playbook on the two-node lab's inventory with ``FAST``, then EXTRA, then ARGS; it must pass."""
    done = run_playbook(REPURPOSE_PLAYBOOK, FLEET_INVENTORY, [FAST] + ([extra] if extra else []), args, timeout=900)
    fatal = [line[:400] for line in done.stdout.splitlines() if line.startswith(("fatal:", "failed:"))][:5]
    assert done.rc == 0, "\n".join(fatal) + "\n" + done.stdout[-5000:] + done.stderr[-2000:]
    return done


def reset_pipelines(lab: dict) -> None:
    """No finished marker nor generated rows on either node (the tests then prove CT210 never gets any), and no
    API key: the run makes a new one, which no file of an earlier run (an older release's journal) can hold."""
    for vmid in (MAIN_CT, NODE2_CT):
        reset_pipeline(lab, vmid)
        in_ct(lab, vmid, "rm", "-f", "/opt/datagen/api-key", "/opt/datagen/api-key.env",
              "/opt/datagen/sglang-secrets.yaml")


def generated_ids(lab: dict) -> list[str]:
    return [row["id"] for row in generated_rows(lab)]


def prompt_ids(lab: dict) -> list[str]:
    return [json.loads(line)["id"] for line in in_ct(lab, MAIN_CT, "cat", f"{WORK}/prompts.jsonl").stdout.splitlines()]


def served_since(lab: dict, before: dict, vmid: str) -> float:
    """Chat requests container VMID's workers answered since BEFORE (a worker restarted since counts from 0)."""
    return sum(served(url) - (before[url][1] if before[url][0] == worker_invocation(lab, vmid, i) else 0.0)
               for i, url in enumerate(NODE_WORKERS[vmid]))


def test_one_job_on_two_nodes_through_one_router_with_an_api_key_a_lost_node_and_a_rerun(fleet, tmp_path):
    """Both trainers stopped, one pipeline served by both nodes' workers through one router with an API key.
    Then CT210's workers all stop mid-generation: the router sends everything to CT200's, every id once. A
    re-run of the playbook starts CT210's workers again and the router routes to them again. (One test, so
    the two-node play and the pipeline are paid for once.)"""
    started = tmp_path / "started"  # files newer than this on the controller are what the test's runs wrote
    started.touch()
    for vmid in (MAIN_CT, NODE2_CT):
        trainer("graceful", vmid)
    reset_pipelines(fleet)
    # a worker the play restarts (its unit changed since an earlier run) counts from 0 again
    before = {url: (worker_invocation(fleet, vmid, i), served(url) if http(url + "/health")[0] == 200 else 0.0)
              for vmid, urls in NODE_WORKERS.items() for i, url in enumerate(urls)}
    # slow workers (10 s a request, 16 in flight: about 60 s for the 100 rows), so the loss lands mid-generation
    done = play(extra=worker_args("--latency", "10"))
    out = done.output
    # the stop half on both nodes, then the fleet summary
    assert f"RESULT: CT {MAIN_CT} on lab-pve: training stopped, GPUs free." in out
    assert f"RESULT: CT {NODE2_CT} on lab-pve2: training stopped, GPUs free." in out
    status = lab_status()
    assert not status["trainer"]["running"] and not status["node2"]["trainer"]["running"]
    assert "FLEET: 2 of 2 container(s) stopped with their GPUs free" in out
    # workers on both nodes; the router and the pipeline on CT200 only
    for vmid in (MAIN_CT, NODE2_CT):
        for i in range(8):
            assert in_ct(fleet, vmid, "systemctl", "is-active", f"sglang-datagen-worker@{i}.service").stdout.strip() == "active"
    assert in_ct(fleet, NODE2_CT, "systemctl", "is-active", "sglang-datagen-router.service",
                 check=False).stdout.strip() != "active"
    assert in_ct(fleet, NODE2_CT, "test", "-e", "/etc/systemd/system/datagen-pipeline.service",
                 check=False).returncode != 0
    key = api_key(fleet)
    assert len(key) >= 32
    # the router lists all 16 workers healthy, and both nodes' workers serve chat requests (a first answer
    # takes the workers' 10 s)
    status, body = http(ROUTER + "/workers", key=key)
    assert status == 200, body
    listed = {w["url"].rstrip("/"): w["is_healthy"] for w in json.loads(body)["workers"]}
    assert listed == {url: True for urls in NODE_WORKERS.values() for url in urls}, listed
    wait_for(lambda: served_since(fleet, before, NODE2_CT) > 0, 60, "CT210's workers answering")  # asked while there

    # CT210 lost: all its workers die at once (a graceful stop would drain the requests the router keeps sending
    # for up to the units' TimeoutStopSec, as SGLang's SIGTERM does); stopped, so that none restarts
    in_ct(fleet, NODE2_CT, "sh", "-c", "systemctl stop --no-block sglang-datagen.target && "
          "systemctl kill --signal=SIGKILL 'sglang-datagen-worker@*.service'")
    wait_for(lambda: not any(_answers(url) for url in NODE_WORKERS[NODE2_CT]), 60, "CT210's workers gone")
    assert in_ct(fleet, MAIN_CT, "systemctl", "is-active", "datagen-pipeline.service",
                 check=False).stdout.strip() == "activating"
    left = 100 - len(generated_ids(fleet))
    assert left >= 30, f"only {left} rows left when CT210 went away"
    wait_pipeline_finished(fleet, 400)
    # one pipeline: every prepared id exactly once, no error, and no dataset on the second node
    prompts, ids = prompt_ids(fleet), generated_ids(fleet)
    assert len(prompts) == len(set(prompts)) == 100
    assert sorted(ids) == sorted(prompts), (len(ids), len(set(ids)))
    assert in_ct(fleet, MAIN_CT, "test", "-s", f"{WORK}/generate.errors.jsonl", check=False).returncode != 0
    assert in_ct(fleet, NODE2_CT, "test", "-e", f"{WORK}/generated.jsonl", check=False).returncode != 0
    assert served_since(fleet, before, MAIN_CT) > 0

    # the re-run brings CT210's workers back; its gate on CT200 waits until the router lists them healthy
    rerun = play(extra=worker_args("--latency", "10")).output
    for i in range(8):
        assert in_ct(fleet, NODE2_CT, "systemctl", "is-active",
                     f"sglang-datagen-worker@{i}.service").stdout.strip() == "active"
    status, body = http(ROUTER + "/workers", key=key)
    listed = {w["url"].rstrip("/"): w["is_healthy"] for w in json.loads(body)["workers"]}
    assert listed == {url: True for urls in NODE_WORKERS.values() for url in urls}, listed

    # every worker port refuses a request without the key (401, as SGLang's auth.py) and takes it with it;
    # the router (sglang-router 0.3.2) refuses chat and its worker list without it (its /v1/models stays open)
    chat = {"model": "lab-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for url in NODE_WORKERS[MAIN_CT] + NODE_WORKERS[NODE2_CT]:
        assert http(url + "/v1/models")[0] == 401, url
        assert http(url + "/v1/chat/completions", body=chat)[0] == 401, url
        assert http(url + "/v1/models", key="wrong")[0] == 401, url
        assert http(url + "/v1/models", key=key)[0] == 200, url
    assert http(ROUTER + "/v1/chat/completions", body=chat)[0] == 401
    assert http(ROUTER + "/v1/chat/completions", key="wrong", body=chat)[0] == 401
    assert http(ROUTER + "/workers")[0] == 401
    assert http(ROUTER + "/v1/chat/completions", key=key, body=chat)[0] == 200
    # the key: in no play output, no process's argv or environment, no journal line and no unit, and in no file
    # but the role's 0600 ones, on either node and on this controller (every file written since the test began)
    assert key not in out and key not in rerun
    key_files = {"/opt/datagen/api-key.env", "/opt/datagen/sglang-secrets.yaml"}
    for vmid in (MAIN_CT, NODE2_CT):
        processes = in_ct(fleet, vmid, "ps", "axww", "e", "-o", "args").stdout
        assert "sglang::router" in processes or vmid == NODE2_CT, processes[-2000:]
        assert key not in processes, vmid
        journal = in_ct(fleet, vmid, "journalctl", "--no-pager", "-o", "cat", "--since", "-30min").stdout
        assert key not in journal, vmid
        # SGLang's start-up line logs the key; it reached the journal redacted
        worker_log = in_ct(fleet, vmid, "journalctl", "--no-pager", "-o", "cat", "-u", "sglang-datagen-worker@0").stdout
        assert "<redacted>" in worker_log, vmid
        units = in_ct(fleet, vmid, "sh", "-c", "cat /etc/systemd/system/sglang-datagen* "
                      "/etc/systemd/system/datagen-pipeline.service 2>/dev/null; systemctl show -p ExecStart "
                      "'sglang-datagen-*'").stdout
        assert key not in units and "serve_keyed.py" in units, vmid
        holding = in_ct(fleet, vmid, "sh", "-c", 'for d in /*; do case "$d" in /proc|/sys|/dev) ;; *) '
                        'grep -rlsF -e "$1" "$d";; esac; done; true', "sh", key).stdout.split()
        expected = key_files | ({"/opt/datagen/api-key"} if vmid == MAIN_CT else set())
        assert set(holding) == expected, (vmid, holding)
        modes = in_ct(fleet, vmid, "stat", "-c", "%a %n", *holding).stdout.split("\n")
        assert all(line.startswith("600 ") for line in modes if line), (vmid, modes)
    written = subprocess.run(["sh", "-c", 'find / -xdev \\( -path /proc -o -path /sys -o -path "$1" \\) -prune -o '
                              '-type f -newer "$2" -print0 | xargs -0r grep -lsF -e "$3"; true', "sh",
                              fleet["lxcpath"], str(started), key], capture_output=True, text=True, timeout=300,
                             check=False).stdout
    assert written.split() == [], written


def _answers(url: str) -> bool:
    """Something listens at URL (any HTTP status; 0 means no HTTP answer: refused, dropped or timed out)."""
    return http(url + "/health")[0] != 0
