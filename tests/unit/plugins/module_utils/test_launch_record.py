# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The launch record: the allow-list, the secret rule no list overrides, atomic root-only files, clear errors."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._launch.record import (
    RecordError,
    allowed_env,
    build_record,
    looks_secret,
    read_record,
    record_path,
    write_record,
)

ENVIRON = {
    "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "MASTER_ADDR": "localhost",
    "MASTER_PORT": "29500", "OMP_NUM_THREADS": "8", "PYTHONPATH": "/src", "PATH": "/usr/bin", "VIRTUAL_ENV": "/venv",
    "HOME": "/root", "WANDB_PROJECT": "dflash", "HF_TOKEN": "hf_x", "WANDB_API_KEY": "k", "NCCL_SECRET": "s",
    "db_password": "p", "MASTER_KEY": "m", "SSH_AUTH_SOCK": "/tmp/agent",
}


def test_the_allow_list_keeps_what_a_relaunch_needs_and_nothing_else():
    assert allowed_env(ENVIRON) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "8", "PATH": "/usr/bin", "PYTHONPATH": "/src", "VIRTUAL_ENV": "/venv"}


@pytest.mark.parametrize("extra", [["*"], ["HF_TOKEN", "WANDB_*", "db_password", "NCCL_SECRET", "MASTER_KEY"]])
def test_no_list_lets_a_secret_like_name_through(extra):
    kept = allowed_env(ENVIRON, extra)
    assert kept["WANDB_PROJECT"] == "dflash"
    for name in ("HF_TOKEN", "WANDB_API_KEY", "NCCL_SECRET", "db_password", "MASTER_KEY"):
        assert name not in kept


@pytest.mark.parametrize("name,secret", [("HF_TOKEN", True), ("hf_token", True), ("AWS_SECRET_ACCESS_KEY", True),
                                         ("PGPASSWORD", True), ("KEYRING", True), ("NCCL_DEBUG", False),
                                         ("PATH", False), ("TOKENIZERS_PARALLELISM", True)])
def test_secret_like_names(name, secret):
    assert looks_secret(name) is secret


def test_build_record_drops_secret_like_env_given_directly():
    record = build_record(session="dflash", window="train", argv=["torchrun", "train.py"], cwd="/w", user="root", uid=0,
                          env={"HF_TOKEN": "x", "PATH": "/bin"}, step_line="step 5", step=5, checkpoint=None,
                          checkpoint_skipped=[], stopped_at=1.0, stopped_by="SIGINT via tmux")
    assert record["env"] == {"PATH": "/bin"} and record["version"] == 1


def test_write_is_atomic_and_root_only_and_read_checks_the_session(tmp_path):
    path = record_path(str(tmp_path / "launch"), "dflash")
    assert path == str(tmp_path / "launch" / "dflash.json")
    assert record_path("/d", "../etc/x y").endswith("/.._etc_x_y.json")
    record = {"argv": ["python3", "train.py"], "tmux_session": "dflash", "cwd": "/w", "user": "root"}
    write_record(path, record)
    write_record(path, dict(record, cwd="/w2"))
    assert os.listdir(tmp_path / "launch") == ["dflash.json"]  # no temporary file left
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(tmp_path / "launch").st_mode & 0o777 == 0o700
    assert read_record(path, "dflash")["cwd"] == "/w2"
    with pytest.raises(RecordError, match="is for tmux session 'dflash', not 'other'.*argv, cwd and user"):
        read_record(path, "other")


@pytest.mark.parametrize("content,message", [
    (None, "no launch record at .*stop half writes one.*argv, cwd and user"),
    ("{not json", "cannot read the launch record"),
    (json.dumps({"argv": []}), "holds no argv"),
    (json.dumps({"argv": ["ok", 3]}), "holds no argv"),
])
def test_bad_records_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "dflash.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RecordError, match=message):
        read_record(str(path))
