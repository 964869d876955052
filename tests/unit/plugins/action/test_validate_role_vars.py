# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpuops.repurpose.validate_role_vars: the sentences as table tests, then the action run for real by
ansible-playbook from a role with an argument spec, as the roles' validation passes run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._role_vars import (
    public_names,
    role_problems,
    type_errors,
)
from tests.support.playbook import run_playbook

CONVERT = "argument '%s' is of type %s and we were unable to convert to %s: <class 'ValueError'>"


@pytest.mark.parametrize("error, value, sentence", [
    (CONVERT % ("st_timeout", "str", "float"), "sixty",
     'st_timeout="sixty" is not a number (e.g. 60): set st_timeout to a number (e.g. 60)'),
    (CONVERT % ("st_gpus", "str", "list"), "0,1",
     'st_gpus="0,1" is not a list (e.g. [a, b]): set st_gpus to a list (e.g. [a, b])'),
    (CONVERT % ("st_count", "float", "int"), 2.5,
     'st_count="2.5" is not a whole number (e.g. 8): set st_count to a whole number (e.g. 8)'),
    (CONVERT % ("st_on", "str", "bool"), "maybe", 'st_on="maybe" is not true or false: set st_on to true or false'),
    (CONVERT % ("st_odd", "str", "path"), "x", 'st_odd="x" is not a path: set st_odd to a path'),  # a kind not listed
    # not about converting a value: kept as the spec said it
    ("value of st_mode must be one of: a, b, got: c", None, "value of st_mode must be one of: a, b, got: c"),
])
def test_type_errors(error, value, sentence):
    name = error.split("'")[1] if "'" in error else ""
    assert type_errors([error], {name: value}) == [sentence]


def test_public_names_leave_out_the_roles_own_facts_and_other_prefixes():
    names = ["st_match", "st_2", "st__plan", "st_", "stx_match", "other_st_match", "st_Upper"]
    assert public_names(names, "st") == ["st_match", "st_2"]


UNKNOWN = ["st_x is not a variable of this role; it is ignored"]


@pytest.mark.parametrize("errors, unknown, strict, failure, warning", [
    ([], [], False, [], []),
    ([], [], True, [], []),
    ([], UNKNOWN, False, [], ["WARNING: st: unknown variables (set st_strict_vars: true to fail on them):"] + UNKNOWN),
    ([], UNKNOWN, True, ["st: unknown variables (st_strict_vars is on), nothing was run:"] + UNKNOWN, []),
    # wrong types first: an unknown name is not even mentioned until they are fixed
    (["value of st_mode must be one of: a, b, got: c"], UNKNOWN, True,
     ["st: invalid variables, nothing was run:", "value of st_mode must be one of: a, b, got: c"], []),
])
def test_role_problems(errors, unknown, strict, failure, warning):
    assert role_problems("st", errors, {}, unknown, strict) == (failure, warning)


# --- the action, for real -------------------------------------------------------------------------------

SPEC = {"argument_specs": {"main": {"options": {
    "checker_timeout": {"type": "float", "default": 60},
    "checker_mode": {"type": "str", "choices": ["fast", "slow"], "default": "fast"},
    "checker_strict_vars": {"type": "bool", "default": False},
}}}}


def validate(tmp_path: Path, host_vars: dict, task_vars: dict | None = None, *args: str):
    """The role ``checker``'s tasks/validate.yml runs validate_role_vars (not main: include_role would check the
    argument spec itself first); HOST_VARS are the inventory's, TASK_VARS the include's."""
    role = tmp_path / "roles" / "checker"
    (role / "meta").mkdir(parents=True, exist_ok=True)
    (role / "meta" / "argument_specs.yml").write_text(json.dumps(SPEC))
    (role / "tasks").mkdir(exist_ok=True)
    (role / "tasks" / "validate.yml").write_text(json.dumps([{
        "name": "Check the variables",
        "gpuops.repurpose.validate_role_vars": {"prefix": "checker", "strict": "{{ checker_strict_vars }}"}}]))
    (role / "defaults").mkdir(exist_ok=True)
    (role / "defaults" / "main.yml").write_text(json.dumps({"checker_strict_vars": False}))
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": dict(
        host_vars, ansible_connection="local", ansible_python_interpreter=sys.executable)}}}))
    play = [{"hosts": "localhost", "gather_facts": False,
             "tasks": [{"ansible.builtin.include_role": {"name": "checker", "tasks_from": "validate"},
                        "vars": task_vars or {}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    run = run_playbook(tmp_path / "play.yml", inventory, args=args, timeout=120)
    return run.rc, " ".join(run.stdout.split())


pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def test_a_wrong_type_fails_in_one_line_with_the_value_and_the_fix(tmp_path):
    rc, out = validate(tmp_path, {"checker_mode": "fast"}, {"checker_timeout": "sixty"})
    assert rc != 0
    assert "checker: invalid variables, nothing was run:" in out
    assert 'checker_timeout="sixty" is not a number (e.g. 60): set checker_timeout to a number (e.g. 60)' in out
    assert "_AnsibleTaggedStr" not in out and "cannot be converted" not in out  # no raw spec error in the result


def test_a_misspelt_name_warns_without_v_and_the_run_goes_on(tmp_path):
    rc, out = validate(tmp_path, {"checker_timout": 5, "checker__plan": "the role's own fact"}, None, "--check")
    assert rc == 0, out[-2000:]
    assert "WARNING: checker: unknown variables (set checker_strict_vars: true to fail on them):" in out
    assert "checker_timout is not a variable of this role (did you mean checker_timeout?); it is ignored" in out
    assert "checker__plan" not in out


def test_a_misspelt_name_fails_when_strict(tmp_path):
    rc, out = validate(tmp_path, {"checker_timout": 5, "checker_strict_vars": True})
    assert rc != 0
    assert "checker: unknown variables (checker_strict_vars is on), nothing was run:" in out
    assert "checker_timout is not a variable of this role (did you mean checker_timeout?)" in out


def test_known_variables_of_the_right_types_pass_quietly(tmp_path):
    rc, out = validate(tmp_path, {"checker_timeout": "30", "checker_mode": "slow"})
    assert rc == 0, out[-2000:]
    assert "WARNING" not in out and "ok: [localhost]" in out and "failed=0" in out
