# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpuops.repurpose.put_files: the group's rules as table tests, then the action run for real by
ansible-playbook on localhost from a role: only a file that differs in content or mode is written, a
dry run writes nothing, and ``written`` names exactly what changed."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._put_files import (
    PutFile,
    content_sha1,
    file_sha1,
    find_args,
    octal_mode,
    parse_files,
    to_write,
)
from tests.support.playbook import run_playbook

SUM_A = hashlib.sha1(b"a\n").hexdigest()
SUM_B = hashlib.sha1(b"b\n").hexdigest()


@pytest.mark.parametrize("mode, octal", [
    ("0644", "0644"), ("644", "0644"), ("0600", "0600"), (" 0755 ", "0755"), ("1777", "1777"),
    (420, "0644"),  # YAML's unquoted 0644
    (0o600, "0600"),
    ("u=rw,g=r", None), ("0999", None), ("", None), (None, None), (True, None),
])
def test_octal_mode(mode, octal):
    assert octal_mode(mode) == octal


@pytest.mark.parametrize("raw, errors", [
    ([{"dest": "/a", "mode": "0644", "content": "x"}, {"dest": "/b/c", "src": "f.txt"}], []),
    ("/a", ["files: expected a list of {dest, mode, content or src}, got str"]),
    (["/a"], ["files[0]: expected a mapping, got str"]),
    ([{"dest": "a", "content": "x"}], ['files[0]: dest must be an absolute path on the node, got "a"']),
    ([{"content": "x"}], ['files[0]: dest must be an absolute path on the node, got "None"']),
    ([{"dest": "/a", "content": "x", "src": "f"}], ["files[0] (/a): give exactly one of content and src"]),
    ([{"dest": "/a"}], ["files[0] (/a): give exactly one of content and src"]),
    ([{"dest": "/a", "content": "x"}, {"dest": "/a", "content": "y"}], ["files[1]: dest /a is in the group twice"]),
    ([{"dest": "/a", "content": "x", "owner": "root"}],
     ["files[0]: unknown key(s) owner (a file has dest, mode, and content or src)"]),
])
def test_parse_files_names_each_bad_entry(raw, errors):
    assert parse_files(raw)[1] == errors


def test_parse_files_writes_lists_and_mappings_as_json_as_copy_does():
    files, _errors = parse_files([{"dest": "/a", "content": {"k": [1]}}, {"dest": "/b", "content": 7}])
    assert [f.content for f in files] == ['{"k": [1]}', "7"]


def test_find_args_list_only_the_groups_names_in_its_directories():
    files = [PutFile("/etc/x/a.service"), PutFile("/etc/x/b+c.env"), PutFile("/opt/w/a.service")]
    args = find_args(files)
    assert args["paths"] == ["/etc/x", "/opt/w"]
    assert args["patterns"] == ["^a\\.service$", "^b\\+c\\.env$"]
    assert args["use_regex"] and args["hidden"] and args["get_checksum"]


A = PutFile("/d/a", mode="0644", content="a\n")
NO_MODE = PutFile("/d/a", content="a\n")
SYMBOLIC = PutFile("/d/a", mode="u=rw", content="a\n")


@pytest.mark.parametrize("file, want, found, differs", [
    (A, SUM_A, [{"path": "/d/a", "checksum": SUM_A, "mode": "0644"}], False),
    (A, SUM_A, [], True),  # not on the node
    (A, SUM_B, [{"path": "/d/a", "checksum": SUM_A, "mode": "0644"}], True),  # content
    (A, SUM_A, [{"path": "/d/a", "checksum": SUM_A, "mode": "0600"}], True),  # someone's chmod
    (A, SUM_A, [{"path": "/e/a", "checksum": SUM_A, "mode": "0644"}], True),  # the same name elsewhere
    (A, None, [{"path": "/d/a", "checksum": SUM_A, "mode": "0644"}], True),  # a directory source: copy decides
    (NO_MODE, SUM_A, [{"path": "/d/a", "checksum": SUM_A, "mode": "0600"}], False),  # no mode: not compared
    (SYMBOLIC, SUM_A, [{"path": "/d/a", "checksum": SUM_A, "mode": "0600"}], True),  # copy decides
])
def test_to_write(file, want, found, differs):
    assert to_write([file], {file.dest: want}, found) == ([file] if differs else [])


def test_sums_on_the_controller(tmp_path):
    (tmp_path / "f").write_bytes(b"a\n")
    assert file_sha1(str(tmp_path / "f")) == content_sha1("a\n") == SUM_A
    assert file_sha1(str(tmp_path)) is None
    assert file_sha1(str(tmp_path / "missing")) is None


# --- the action, for real -------------------------------------------------------------------------------

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def put(tmp_path: Path, files: list, *args: str, task: dict | None = None, json_results: bool = True):
    """Run put_files for FILES on localhost from a role whose files/ holds role-file.txt; (the run, what it
    says it wrote: None without JSON_RESULTS, where the default callback's output is the point)."""
    role = tmp_path / "roles" / "putter"
    (role / "files").mkdir(parents=True, exist_ok=True)
    (role / "files" / "role-file.txt").write_text("from the role\n")
    (role / "tasks").mkdir(exist_ok=True)
    (role / "tasks" / "main.yml").write_text(json.dumps([dict({
        "name": "Put the group", "gpuops.repurpose.put_files": {"files": "{{ putter_files }}"},
        "register": "putter_put"}, **(task or {}))]))
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": {"ansible_python_interpreter": sys.executable, "putter_files": files}, "roles": ["putter"]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    run = run_playbook(playbook, "localhost,", args=args, json_results=json_results, timeout=240)
    if not json_results:
        return run, None
    result = next((hosts["localhost"] for name, hosts in run.results.items() if name.endswith("Put the group")), {})
    return run, result.get("written") if run.rc == 0 else None


@pytest.fixture
def group(tmp_path):
    """A role file found by its bare name, a binary file on the controller, a rendered text of mode 0600."""
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "node"
    (out / "sub").mkdir(parents=True)
    files = [
        {"src": "role-file.txt", "dest": str(out / "role-file.txt"), "mode": "0644"},
        {"src": str(binary), "dest": str(out / "sub" / "model.bin"), "mode": 420},  # YAML's 0644, an int
        {"content": "CUDA_VISIBLE_DEVICES=0,1\n", "dest": str(out / "sub" / "worker-0.env"), "mode": "0600"},
    ]
    return files, out


def test_first_run_writes_the_group_and_a_second_writes_nothing(tmp_path, group):
    files, out = group
    _run, written = put(tmp_path, files)
    assert written == [f["dest"] for f in files]
    assert (out / "role-file.txt").read_text() == "from the role\n"
    assert (out / "sub" / "model.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()
    assert oct(os.stat(out / "sub" / "worker-0.env").st_mode & 0o777) == "0o600"
    run, written = put(tmp_path, files)
    assert written == [] and run.json["stats"]["localhost"]["changed"] == 0


def test_a_changed_content_or_mode_is_written_a_dry_run_only_says_so(tmp_path, group):
    files, out = group
    put(tmp_path, files)
    os.chmod(out / "role-file.txt", 0o600)  # someone's chmod
    files[2]["content"] = "CUDA_VISIBLE_DEVICES=2,3\n"  # the worker moved to other GPUs
    before = hashlib.sha1((out / "sub" / "worker-0.env").read_bytes()).hexdigest()
    run, written = put(tmp_path, files, "--check", "--diff")
    assert written == [files[0]["dest"], files[2]["dest"]]
    assert hashlib.sha1((out / "sub" / "worker-0.env").read_bytes()).hexdigest() == before
    diff = next(h["localhost"] for n, h in run.results.items() if n.endswith("Put the group"))["diff"]
    assert any("CUDA_VISIBLE_DEVICES=2,3" in d.get("after", "") for d in diff), diff
    _run, written = put(tmp_path, files)
    assert written == [files[0]["dest"], files[2]["dest"]]
    assert (out / "sub" / "worker-0.env").read_text() == "CUDA_VISIBLE_DEVICES=2,3\n"
    assert oct(os.stat(out / "role-file.txt").st_mode & 0o777) == "0o644"
    assert put(tmp_path, files)[1] == []


def test_no_log_keeps_the_content_out_of_the_output_also_in_diff_mode(tmp_path, group):
    files, _out = group
    files[2]["content"] = "API_KEY=s3cret-value\n"
    run, _written = put(tmp_path, files, "--diff", "-vvv", task={"no_log": True}, json_results=False)
    assert run.rc == 0 and "changed=1" in run.stdout, run.stdout[-2000:]
    assert "s3cret-value" not in run.stdout + run.stderr


def test_a_missing_source_fails_naming_it_before_anything_is_written(tmp_path, group):
    files, out = group
    files.append({"src": str(tmp_path / "not-there.json"), "dest": str(out / "x.json"), "mode": "0644"})
    run, written = put(tmp_path, files)
    assert run.rc != 0 and written is None
    assert "Could not find or access '%s'" % (tmp_path / "not-there.json") in run.stdout
    assert not (out / "role-file.txt").exists()


def test_a_dry_run_on_a_fresh_node_lists_every_file_and_creates_nothing(tmp_path, group):
    files, out = group
    for file in files:  # the node has none of the directories yet
        file["dest"] = file["dest"].replace(str(out), str(tmp_path / "never-made"))
    run, written = put(tmp_path, files, "--check")
    assert run.rc == 0, run.stdout[-2000:]
    assert written == [f["dest"] for f in files]
    assert not (tmp_path / "never-made").exists()
