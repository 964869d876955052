"""The AWX surveys (awx/survey_*.json) are the roles' argument specs as awx/surveys.yml chooses, and cannot drift."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.surveys import SELECTION, SurveyError, rendered, survey

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
