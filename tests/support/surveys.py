"""AWX surveys from the roles' argument specs: awx/surveys.yml chooses, this writes awx/survey_<template>.json.

It also writes the AWX guide's table of every extra variable each job template takes
(docs/docsite/rst/awx_variables.rst), from the same selection and specs.
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
VARIABLES_DOC = Path("docs") / "docsite" / "rst" / "awx_variables.rst"
# Ansible's documentation markup, as plain text for AWX: C(x), O(x), V(x), M(x), P(x#role), I(x), RV(x) -> x;
# an option of another plugin or role, O(ns.coll.role#role:main:x) or O(ns.coll.mod#module:x), -> x
MARKUP = re.compile(r"\b(C|O|V|M|I|RV|P|U|L)\(([^()]*)\)")
SURVEY_TYPES = {"str": "text", "path": "text", "raw": "text", "int": "integer", "float": "float"}


class SurveyError(Exception):
    """awx/surveys.yml and the argument specs disagree; the message names the variable and the fix."""


def plain(text: Any) -> str:
    lines = text if isinstance(text, list) else [text or ""]
    return MARKUP.sub(_plain_markup, " ".join(str(line) for line in lines)).strip()


def _plain_markup(m: re.Match) -> str:
    kind, arg = m.group(1), m.group(2)
    if kind in ("O", "RV") and "#" in arg:
        # the name after the plugin type (and, for a role, the entry point): what antsibull-docs shows
        plugin_type, _colon, rest = arg.split("#", 1)[1].partition(":")
        return rest.split(":", 1)[1] if plugin_type == "role" else rest
    return arg.split("#")[0]


def role_options(root: Path, role: str) -> Dict[str, dict]:
    spec = yaml.safe_load((root / "roles" / role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
    return spec["argument_specs"]["main"]["options"]


def template_options(chosen: dict, root: Path = ROOT) -> Dict[str, dict]:
    """Every option of a job template's roles (CHOSEN's ``roles``), by variable name."""
    options: Dict[str, dict] = {}
    for role in chosen["roles"]:
        options.update(role_options(root, role))
    return options


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
    options = template_options(chosen, root)
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


def _cell(text: str) -> str:
    return " ".join(text.split()) or "(none)"


def _rst_text(text: str) -> str:
    """Plain text as RST that shows it as written: inline markup characters and reference-like words escaped."""
    text = re.sub(r"([*`|\\])", r"\\\1", text)
    return re.sub(r"(\w)_(?=\W|$)", r"\1\\_", text)


def _shown_default(option: dict) -> str:
    default = option.get("default")
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "``%s``" % ("true" if default else "false")
    return "``%s``" % (json.dumps(default) if isinstance(default, (list, dict)) or default == "" else default)


def variables_page(chosen: Dict[str, dict], root: Path = ROOT) -> str:
    """The RST page listing, per job template, every extra variable it takes: the play's own, then each role's,
    with its type, default, whether it is required, and whether the survey asks it."""
    out = [".. _ansible_collections.gpuops.repurpose.docsite.awx_variables:", "",
           "Job template variables", "======================", "",
           "Every extra variable each job template takes: the playbook's own, then its roles'. *survey*: the",
           "collection's survey asks it; *extra vars*: set it in the inventory or the template's extra variables",
           "(lists and mappings cannot be survey questions). Generated from the roles' argument specs and",
           "``awx/surveys.yml``; ``ansible-doc -t role`` has each variable in full.", ""]
    for spec in chosen.values():
        title = "%s (``%s``)" % (spec["name"], spec["playbook"])
        out += [title, "-" * len(title), "", ".. list-table::", "   :header-rows: 1", "",
                "   * - variable", "     - type", "     - default", "     - required", "     - set by",
                "     - what it is"]
        rows = [(var["variable"], {"type": "bool" if var["type"] == "bool" else "str", "default": var.get("default"),
                                   "description": var["description"]}, "survey (the play's own)")
                for var in spec.get("play_vars", [])]
        options = template_options(spec, root)
        asked = set(spec.get("survey", []))
        rows += [(name, options[name], "survey" if name in asked else "extra vars") for name in sorted(options)]
        for name, option, how in rows:
            out += ["   * - ``%s``" % name, "     - %s" % option.get("type", "str"),
                    "     - %s" % _cell(_shown_default(option)),
                    "     - %s" % ("yes" if option.get("required") else "no"), "     - %s" % how,
                    "     - %s" % _rst_text(_cell(plain(option.get("description")).split(". ")[0].rstrip(".") + "."))]
        out.append("")
    return "\n".join(out)


def written_files(root: Path = ROOT, selection: Path = SELECTION) -> Dict[Path, str]:
    """Every file this writes: the surveys and the variables page."""
    files = rendered(root, selection)
    files[root / VARIABLES_DOC] = variables_page(yaml.safe_load(selection.read_text(encoding="utf-8")), root)
    return files


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a survey is out of date")
    args = parser.parse_args(argv)
    try:
        files = written_files()
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
