"""Role sglang_datagen's file groups (tasks/put_files.yml), run for real by ansible-playbook on localhost:
only a file that differs in content or mode is written, a dry run writes nothing, and the written list the
role's restarts depend on names exactly what changed."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.paths import DATAGEN_FILES
from tests.support.playbook import run_playbook

pytestmark = pytest.mark.timeout(300)


def put(tmp_path: Path, files: list, *args: str, fresh: bool = False):
    """Run the role's put_files.yml for FILES on localhost (FRESH: the role's dry run on a node it never
    touched); (the run, the dests it says it wrote)."""
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": {"ansible_python_interpreter": sys.executable},
             "tasks": [{"ansible.builtin.include_role": {"name": "gpuops.repurpose.sglang_datagen",
                                                         "tasks_from": "put_files"},
                        "vars": {"sglang_datagen__put": files, "sglang_datagen__fresh": fresh}}]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    run = run_playbook(playbook, "localhost,", args=args, json_results=True, timeout=240)
    if run.rc != 0:
        return run, None
    facts = next(hosts["localhost"]["ansible_facts"] for name, hosts in run.results.items()
                 if name.endswith("Files | Note what was written"))
    return run, facts["sglang_datagen__put_written"]


@pytest.fixture
def group(tmp_path):
    """A role file found by its bare name, a binary file on the controller, a rendered text of mode 0600."""
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "node"
    (out / "sub").mkdir(parents=True)
    files = [
        {"src": "requirements-datagen.txt", "dest": str(out / "requirements-datagen.txt"), "mode": "0644"},
        {"src": str(binary), "dest": str(out / "sub" / "model.bin"), "mode": 420},  # YAML's 0644, an int
        {"content": "CUDA_VISIBLE_DEVICES=0,1\n", "dest": str(out / "sub" / "worker-0.env"), "mode": "0600"},
    ]
    return files, out


def test_first_run_writes_the_group_and_a_second_writes_nothing(tmp_path, group):
    files, out = group
    _run, written = put(tmp_path, files)
    assert written == [f["dest"] for f in files]
    assert (out / "requirements-datagen.txt").read_bytes() == (DATAGEN_FILES / "requirements-datagen.txt").read_bytes()
    assert (out / "sub" / "model.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()
    assert oct(os.stat(out / "sub" / "worker-0.env").st_mode & 0o777) == "0o600"
    run, written = put(tmp_path, files)
    assert written == [] and run.json["stats"]["localhost"]["changed"] == 0
    # the point of the group: nothing unchanged is even handed to copy (a remote stat and more per file)
    copies = next(hosts["localhost"] for name, hosts in run.results.items() if name.endswith("Files | Write what differs"))
    assert [item.get("skipped") for item in copies["results"]] == [True] * len(files)


def test_a_changed_content_or_mode_is_written_a_dry_run_only_says_so(tmp_path, group):
    files, out = group
    put(tmp_path, files)
    os.chmod(out / "requirements-datagen.txt", 0o600)  # someone's chmod
    files[2]["content"] = "CUDA_VISIBLE_DEVICES=2,3\n"  # the worker moved to other GPUs
    before = hashlib.sha1((out / "sub" / "worker-0.env").read_bytes()).hexdigest()
    _run, written = put(tmp_path, files, "--check")
    assert written == [files[0]["dest"], files[2]["dest"]]
    assert hashlib.sha1((out / "sub" / "worker-0.env").read_bytes()).hexdigest() == before
    _run, written = put(tmp_path, files)
    assert written == [files[0]["dest"], files[2]["dest"]]
    assert (out / "sub" / "worker-0.env").read_text() == "CUDA_VISIBLE_DEVICES=2,3\n"
    assert oct(os.stat(out / "requirements-datagen.txt").st_mode & 0o777) == "0o644"
    assert put(tmp_path, files)[1] == []


def test_a_missing_source_fails_naming_it(tmp_path, group):
    files, _out = group
    files.append({"src": str(tmp_path / "not-there.json"), "dest": str(tmp_path / "node" / "x.json"), "mode": "0644"})
    run, written = put(tmp_path, files)
    assert run.rc != 0 and written is None
    assert "Could not find or access '%s'" % (tmp_path / "not-there.json") in run.stdout


def test_a_dry_run_on_a_fresh_node_lists_every_file_and_creates_nothing(tmp_path, group):
    files, out = group
    for file in files:  # the node has none of the directories yet
        file["dest"] = file["dest"].replace(str(out), str(tmp_path / "never-made"))
    run, written = put(tmp_path, files, "--check", fresh=True)
    assert run.rc == 0, run.stdout[-2000:]
    assert written == [f["dest"] for f in files]
    assert not (tmp_path / "never-made").exists()
