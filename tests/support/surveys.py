"""AWX surveys from the roles' argument specs: awx/surveys.yml chooses, this writes awx/survey_<template>.json.

``python -m tests.support.surveys`` (scripts/awx-surveys) writes them; ``--check`` only says what differs and
exits 1. Every variable of a template's roles must be listed once in awx/surveys.yml (``survey`` or
``left_out``), so a variable added to a role without a decision about the survey fails the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

import yaml

from tests.support.paths import ROOT

SELECTION = ROOT / "awx" / "surveys.yml"
# Ansible's documentation markup, as plain text for AWX: C(x), O(x), V(x), M(x), P(x#role), I(x), RV(x) -> x
MARKUP = re.compile(r"\b(?:C|O|V|M|I|RV|P|U|L)\(([^()]*)\)")
SURVEY_TYPES = {"str": "text", "path": "text", "raw": "text", "int": "integer", "float": "float"}


class SurveyError(Exception):
    """awx/surveys.yml and the argument specs disagree; the message names the variable and the fix."""


def plain(text: Any) -> str:
    lines = text if isinstance(text, list) else [text or ""]
    return MARKUP.sub(lambda m: m.group(1).split("#")[0], " ".join(str(line) for line in lines)).strip()


def role_options(root: Path, role: str) -> Dict[str, dict]:
    spec = yaml.safe_load((root / "roles" / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    return spec["argument_specs"]["main"]["options"]


def question(variable: str, option: dict) -> dict:
    """One survey question from an argument spec option (lists and mappings are refused: AWX passes text).

    No question carries a default: AWX sends a default as an extra variable, which would override the
    inventory's value; an unanswered optional question sends nothing, so the inventory, then the role's
    default, apply. The default is said in the question's text instead."""
    kind = option.get("type", "str")
    text = plain(option.get("description"))
    default = option.get("default")
    if default is not None and not (isinstance(default, str) and "{{" in default):
        shown = ("true" if default else "false") if kind == "bool" else str(default)
        text += " Unanswered: the inventory's value, else %s." % (json.dumps(shown) if shown == "" else shown)
    entry: Dict[str, Any] = {"question_name": variable, "question_description": text, "variable": variable,
                             "required": bool(option.get("required", False))}
    if kind == "bool":
        entry.update(type="multiplechoice", choices=["true", "false"])
    elif option.get("choices"):
        entry.update(type="multiplechoice", choices=[str(choice) for choice in option["choices"]])
    elif kind in SURVEY_TYPES:
        entry["type"] = SURVEY_TYPES[kind]
    else:
        raise SurveyError("%s is a %s: a survey passes text, so list it under left_out in %s" % (
            variable, kind, SELECTION.name))
    return entry


def play_question(var: dict) -> dict:
    return question(var["variable"], {"type": var["type"] if var["type"] != "text" else "str",
                                      "default": var.get("default"), "description": var["description"]})


def survey(template: str, chosen: dict, root: Path = ROOT) -> dict:
    """The AWX survey spec of TEMPLATE; SurveyError when a role variable is not listed once, or a listed one
    does not exist."""
    options: Dict[str, dict] = {}
    for role in chosen["roles"]:
        options.update(role_options(root, role))
    listed: List[str] = list(chosen.get("survey", [])) + list(chosen.get("left_out", []))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    unknown = sorted(set(listed) - set(options))
    missing = sorted(set(options) - set(listed))
    problems = []
    if missing:
        problems.append("not listed (add each to survey or left_out): %s" % ", ".join(missing))
    if unknown:
        problems.append("listed but no such variable in %s: %s" % (", ".join(chosen["roles"]), ", ".join(unknown)))
    if twice:
        problems.append("listed twice: %s" % ", ".join(twice))
    if problems:
        raise SurveyError("%s, template %s: %s" % (SELECTION.name, template, "; ".join(problems)))
    spec = [play_question(var) for var in chosen.get("play_vars", [])]
    spec += [question(name, options[name]) for name in chosen.get("survey", [])]
    return {"name": chosen["name"], "description": "Made from the argument specs of %s by scripts/awx-surveys" % (
        ", ".join("gpuops.repurpose." + role for role in chosen["roles"])), "spec": spec}


def rendered(root: Path = ROOT, selection: Path = SELECTION) -> Dict[Path, str]:
    """{awx/survey_<template>.json: its text} for every template of the selection."""
    chosen = yaml.safe_load(selection.read_text(encoding="utf-8"))
    return {root / "awx" / ("survey_%s.json" % template): json.dumps(survey(template, spec, root), indent=2) + "\n"
            for template, spec in chosen.items()}


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a survey is out of date")
    args = parser.parse_args(argv)
    try:
        files = rendered()
    except SurveyError as exc:
        print("awx-surveys: %s" % exc, file=sys.stderr)
        return 1
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print("awx-surveys: %s is out of date: run scripts/awx-surveys" % path.relative_to(ROOT), file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path], encoding="utf-8")
        print("wrote %s" % path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
