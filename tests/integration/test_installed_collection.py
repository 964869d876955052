# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The installed collection runs the playbook on the lab: from the tarball, and through AWX's engine.

The tarball is built from a copy of the checkout, installed into a temporary
collections path, and the playbook is run by its FQCN
(``gpuops.repurpose.repurpose_ct200``) with a config of its own and a cwd outside
the checkout: the checkout's ``.collections`` symlink and ``ansible.cfg`` are not
in play. Only the inventory is the checkout's ``inventories/lab``. The stop half
runs (``repurpose_datagen=false``: the datagen half is covered by
test_role_sglang_datagen.py and needs minutes of pip installs in the container).

The AWX-style run uses ansible-runner (AWX's engine) on a private data dir laid
out as AWX lays it out: ``project/`` (a copy of the checkout),
``requirements_collections/`` (installed by ``collections/requirements.yml``,
its git source served from a local repository), ``inventory/hosts`` (an
executable printing ``ansible-inventory --list --export``, as AWX writes an
imported inventory), ``env/extravars``, ``env/envvars`` and ``env/cmdline``
(``--check``). The role's summary is asserted in the job events, not in stdout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import built_collection as bc
from tests.support.ct200 import trainer_pids
from tests.support.lab import trainer
from tests.support.paths import LAB_INVENTORY as INVENTORY
from tests.support.playbook import recap
from tests.support.stop_training import FAST

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("trainer_back_afterwards"), pytest.mark.timeout(600)]


def trainer_running(status: dict) -> bool:
    return bool(trainer_pids(status))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("installed")
    bc.copy_checkout(work / "src")
    tarball = bc.build(work / "src", work / "dist")
    collections = work / "user" / "collections"
    collections.mkdir(parents=True)
    bc.install(tarball, collections)
    return collections


def play(collections: Path, *args: str) -> tuple[int, str]:
    argv = [str(bc.BIN / "ansible-playbook"), "-i", str(INVENTORY), "gpuops.repurpose.repurpose_ct200",
            "-e", json.dumps(FAST), *args]
    done = subprocess.run(argv, cwd=collections.parent, env=bc.installed_env(collections, PYTHONUNBUFFERED="1"),
                          capture_output=True, text=True, timeout=500, check=False)
    return done.returncode, done.stdout + done.stderr


def test_the_installed_collection_runs_the_playbook_and_a_rerun_changes_nothing(lab, installed):
    trainer("graceful")
    assert trainer_running(lab)
    rc, out = play(installed, "-vv")
    assert rc == 0, out[-4000:]
    # the roles and plugins came from the installed copy, never from the checkout
    assert str(installed / "ansible_collections" / "gpuops" / "repurpose") in out
    assert str(bc.ROOT / ".collections") not in out and str(bc.ROOT / "roles") not in out
    assert "by rung SIGINT via tmux" in out and re.search(r"GPU memory after: +8 GPU\(s\) free", out), out[-4000:]
    assert not trainer_running(lab)
    assert recap(out)["failed"] == 0

    rc, out = play(installed)
    assert rc == 0, out[-4000:]
    assert "Stopped: nothing, no process was selected" in out
    assert recap(out)["changed"] == 0


# ---------------------------------------------------------------- AWX: ansible-runner


@pytest.fixture(scope="module")
def private_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import yaml

    pdd = tmp_path_factory.mktemp("awx-job")
    project = pdd / "project"
    bc.copy_checkout(project)
    # project sync: collections/requirements.yml, its git URL served from a repository of this tree
    repo = pdd.parent / (pdd.name + "-origin")
    shutil.copytree(project, repo, symlinks=True)
    bc.git_snapshot(repo)
    (entry,) = yaml.safe_load((project / "collections" / "requirements.yml").read_text())["collections"]
    collections = pdd / "requirements_collections"
    done = bc.install_requirements(entry, repo, "HEAD", pdd.parent / (pdd.name + "-requirements.yml"), collections,
                                   cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    # the inventory as AWX imports it: --export keeps group_vars unrendered, hosts in groups
    exported = subprocess.run(
        [str(bc.BIN / "ansible-inventory"), "-i", str(INVENTORY), "--list", "--export"],
        cwd=bc.ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(bc.ROOT / "ansible.cfg")},
        check=True, capture_output=True, text=True,
    ).stdout
    assert "ct200" in json.loads(exported)["_meta"]["hostvars"]
    # imported elsewhere, the inventory still names files that exist (no inventory_dir-relative paths)
    assert "inventory_dir" not in exported
    extra = json.loads(exported)["training_containers"]["vars"]["sglang_datagen_extra_files"]
    assert extra and all(Path(item["src"]).is_file() for item in extra), extra
    (pdd / "inventory").mkdir()
    script = pdd / "inventory" / "hosts"
    script.write_text("#!/bin/sh\ncat <<'INVENTORY'\n%s\nINVENTORY\n" % exported)
    script.chmod(0o700)
    (pdd / "env").mkdir()
    (pdd / "env" / "extravars").write_text(yaml.safe_dump(FAST))
    # AWX puts requirements_collections first on the collections path
    (pdd / "env" / "envvars").write_text(yaml.safe_dump({
        "ANSIBLE_COLLECTIONS_PATH": f"{collections}:~/.ansible/collections:/usr/share/ansible/collections",
        "ANSIBLE_NOCOLOR": "1",
    }))
    return pdd


def runner_job(pdd: Path, ident: str, *, check: bool = False) -> tuple[str, list[dict]]:
    """``ansible-runner run`` on the private data dir; returns (status, job events)."""
    cmdline = pdd / "env" / "cmdline"
    cmdline.write_text("--check" if check else "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = f"{bc.BIN}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [str(bc.BIN / "ansible-runner"), "run", str(pdd), "-p", "playbooks/repurpose_ct200.yml", "--ident", ident],
        env=env, capture_output=True, text=True, timeout=500, check=False,
    )
    artifacts = pdd / "artifacts" / ident
    status = (artifacts / "status").read_text().strip() if (artifacts / "status").exists() else "none"
    event_files = sorted((artifacts / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-", 1)[0]))
    events = [json.loads(p.read_text()) for p in event_files]
    assert events, done.stdout[-3000:] + done.stderr[-3000:]
    return status, events


def summary(events: list[dict]) -> str:
    """The role's one summary, from its runner_on_ok event (a debug msg that is a list of lines)."""
    found = [e for e in events if e.get("event") == "runner_on_ok"
             and e["event_data"].get("task") == "Report | Summary" and e["event_data"].get("host") == "ct200"]
    assert len(found) == 1, [e["event_data"].get("task") for e in events if e.get("event") == "runner_on_ok"]
    msg = found[0]["event_data"]["res"]["msg"]
    return "\n".join(msg) if isinstance(msg, list) else str(msg)


def stats(events: list[dict]) -> dict:
    (final,) = [e for e in events if e.get("event") == "playbook_on_stats"]
    return final["event_data"]


def test_awx_engine_runs_the_playbook_check_then_real_then_a_rerun_changes_nothing(lab, private_data_dir):
    trainer("graceful")
    assert trainer_running(lab)

    status, events = runner_job(private_data_dir, "check", check=True)
    assert status == "successful", summary(events) if events else status
    text = summary(events)
    assert "DRY RUN (check mode)" in text and re.search(r"Last step line before the first signal: step \d+", text)
    assert trainer_running(lab), "check mode signalled the trainer"
    # the roles ran from requirements_collections, never from the project's .collections link
    # a line printed outside the callback (a Python warning, say) is a "verbose" event, with no event_data
    paths = {e["event_data"]["task_path"] for e in events if e.get("event_data", {}).get("task_path")}
    role_paths = {p for p in paths if "/roles/stop_training/" in p}
    assert role_paths and all(p.startswith(str(private_data_dir / "requirements_collections")) for p in role_paths)

    status, events = runner_job(private_data_dir, "real")
    assert status == "successful", summary(events)
    text = summary(events)
    assert "training stopped, GPUs free" in text and "by rung SIGINT via tmux" in text, text
    assert not trainer_running(lab)
    assert stats(events)["changed"].get("ct200", 0) > 0

    status, events = runner_job(private_data_dir, "rerun")
    assert status == "successful", summary(events)
    assert "Stopped: nothing, no process was selected" in summary(events)
    assert stats(events)["changed"].get("ct200", 0) == 0, stats(events)
    assert stats(events)["failures"] == {}
