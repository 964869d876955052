"""_datagen.secret, a random secret written once: on real files, then ``secret_file`` in its own processes, several
racing for one file as two AWX slices would."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import secret
from tests.support.module import run_module

pytestmark = pytest.mark.processes


def test_write_once_writes_a_private_file_and_never_replaces_one(tmp_path):
    path = str(tmp_path / "key")
    assert secret.write_once(path, "first") is True
    assert secret.write_once(path, "second") is False
    assert open(path, encoding="ascii").read() == "first"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["key"]  # no temporary file left, whoever won


@pytest.mark.parametrize("check_mode,changed,exists", [(False, True, True), (True, True, False)])
def test_ensure_secret_creates_the_directory_and_the_file_unless_check_mode(tmp_path, check_mode, changed, exists):
    path = str(tmp_path / "home" / "api-key")
    out = secret.ensure_secret({"path": path, "nbytes": 32}, check_mode)
    assert (out["changed"], out["created"], os.path.exists(path)) == (changed, exists, exists), out
    if exists:
        assert len(open(path, encoding="ascii").read()) == 43  # token_urlsafe(32): 43 characters
        assert secret.ensure_secret({"path": path, "nbytes": 32}) == {"changed": False, "created": False, "path": path}


def test_ensure_secret_fails_naming_the_path_it_cannot_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = secret.ensure_secret({"path": str(blocker / "api-key"), "nbytes": 32})
    assert out["failed"] and str(blocker / "api-key") in out["msg"], out


# ---------------------------------------------------------------- the module, in its own processes


def test_racing_runs_make_one_secret_and_return_none_of_it(tmp_path):
    path = str(tmp_path / "home" / "api-key")
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda _i: run_module("secret_file", {"path": path}), range(6)))
    assert all(out["rc"] == 0 for out in outs), outs
    assert sum(out["created"] for out in outs) == 1 and sum(out["changed"] for out in outs) == 1, outs
    key = open(path, encoding="ascii").read()
    assert len(key) == 43 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path / "home") == ["api-key"]
    assert not any(key in repr(out) for out in outs)
    again = run_module("secret_file", {"path": path})
    assert (again["changed"], again["created"]) == (False, False) and open(path, encoding="ascii").read() == key


def test_check_mode_creates_nothing_and_says_it_would(tmp_path):
    path = tmp_path / "home" / "api-key"
    out = run_module("secret_file", {"path": str(path), "nbytes": 16}, check_mode=True)
    assert out["rc"] == 0 and out["changed"] and not out["created"] and not path.parent.exists(), out
    out = run_module("secret_file", {"path": str(path), "nbytes": 16})
    assert out["created"] and len(path.read_text()) == 22, out  # token_urlsafe(16)
    assert run_module("secret_file", {"path": str(path)}, check_mode=True)["changed"] is False
