"""The AWX surveys (awx/survey_*.json) are the roles' argument specs as awx/surveys.yml chooses, and cannot drift."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.surveys import SELECTION, VARIABLES_DOC, SurveyError, rendered, survey, written_files

pytestmark = pytest.mark.processes

CHOSEN = yaml.safe_load(SELECTION.read_text(encoding="utf-8"))


def test_the_committed_surveys_are_what_the_specs_make():
    for path, text in rendered().items():
        assert path.read_text(encoding="utf-8") == text, "%s is out of date: run scripts/awx-surveys" % path.name


def test_no_question_has_a_default_and_each_names_a_role_or_play_variable():
    for path in rendered():
        spec = json.loads(path.read_text(encoding="utf-8"))["spec"]
        assert spec and all("default" not in q for q in spec), path.name
        assert all(q["type"] in ("text", "integer", "float", "multiplechoice") for q in spec)


def spec_root(tmp_path, role, add=None):
    """A copy of ROLE's argument spec under tmp_path/roles, with ADD ({name: option}) added."""
    for name in {r for t in CHOSEN.values() for r in t["roles"]}:
        dest = tmp_path / "roles" / name / "meta"
        dest.mkdir(parents=True)
        shutil.copy(ROOT / "roles" / name / "meta" / "argument_specs.yml", dest)
    if add:
        path = tmp_path / "roles" / role / "meta" / "argument_specs.yml"
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec["argument_specs"]["main"]["options"].update(add)
        path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return tmp_path


def test_a_role_variable_added_without_a_survey_decision_fails(tmp_path):
    knob = {"restore_training_new_knob": {"type": "int", "default": 3, "description": "new"}}
    root = spec_root(tmp_path, "restore_training", knob)
    with pytest.raises(SurveyError, match="template restore_training: not listed .*restore_training_new_knob"):
        survey("restore_training", CHOSEN["restore_training"], root)
    # listed: the check passes, and the question says its default without sending it
    chosen = copy.deepcopy(CHOSEN["restore_training"])
    chosen["survey"].append("restore_training_new_knob")
    asked = survey("restore_training", chosen, root)["spec"][-1]
    assert asked == {"question_name": "restore_training_new_knob", "variable": "restore_training_new_knob",
                     "question_description": "new Unanswered: the inventory's value, else 3.", "required": False,
                     "type": "integer"}


def test_a_listed_variable_that_no_role_has_and_a_list_in_the_survey_fail(tmp_path):
    root = spec_root(tmp_path, "restore_training")
    chosen = copy.deepcopy(CHOSEN["restore_training"])
    chosen["left_out"].append("restore_training_gone")
    with pytest.raises(SurveyError, match="no such variable in restore_training: restore_training_gone"):
        survey("restore_training", chosen, root)
    chosen = copy.deepcopy(CHOSEN["restore_training"])
    chosen["left_out"].remove("restore_training_gpus")
    chosen["survey"].append("restore_training_gpus")
    with pytest.raises(SurveyError, match="restore_training_gpus is a list: a survey passes text"):
        survey("restore_training", chosen, root)


AWX_EXAMPLE = ROOT / "examples" / "awx" / "configure_awx.yml"


def test_the_awx_example_configures_what_the_surveys_and_playbooks_name(tmp_path):
    """examples/awx/configure_awx.yml: a valid playbook (ansible-lint checks its awx.awx arguments) whose job
    templates run the collection's playbooks with the committed surveys, and whose workflow runs those templates."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "--syntax-check", str(AWX_EXAMPLE),
         "-e", "awx_pveops_key_file=/dev/null"], capture_output=True, text=True, check=False, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tasks = {task["name"]: task for task in yaml.safe_load(AWX_EXAMPLE.read_text(encoding="utf-8"))[0]["tasks"]}
    templates = tasks["Create the job templates, each with its survey"]["loop"]
    assert {(ROOT / t["playbook"]).is_file() and (ROOT / "awx" / t["survey"]).is_file() for t in templates} == {True}
    assert sorted(t["survey"] for t in templates) == sorted(path.name for path in rendered())
    nodes = tasks["Create the workflow repurpose, wait for the generation, restore"]["awx.awx.workflow_job_template"]
    run = [n["unified_job_template"]["name"] for n in nodes["workflow_nodes"]
           if n["unified_job_template"]["type"] == "job_template"]
    assert run == [t["name"] for t in templates]


def test_the_variables_page_is_current_and_lists_every_variable_of_each_template():
    page = ROOT / VARIABLES_DOC
    assert page.read_text(encoding="utf-8") == written_files()[page], "run scripts/awx-surveys"
    text = page.read_text(encoding="utf-8")
    for chosen in CHOSEN.values():
        names = [var["variable"] for var in chosen.get("play_vars", [])]
        names += list(chosen.get("survey", [])) + list(chosen.get("left_out", []))
        assert not [name for name in names if "   * - ``%s``\n" % name not in text]
