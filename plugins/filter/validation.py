# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters for the roles' validation pass: misspelt variable names and regexes that do not compile.

Their documentation is in unknown_variables.yml and regex_errors.yml next to this file.
They run on the controller, so a validation pass needs no ``python -c`` of its own.
"""

from __future__ import annotations

import difflib
import json
import re
import typing as t

from ansible.errors import AnsibleFilterError

# difflib's default: close enough to be a typo, far enough that unrelated names are not suggested
CUTOFF = 0.6


def _names(value: t.Any, option: str) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, t.Iterable):
        raise AnsibleFilterError("%s: expected a list of variable names, got %s" % (option, type(value).__name__))
    return [str(name) for name in value]


def unknown_variables(given: t.Any, known: t.Any) -> list[str]:
    """One sentence per name in ``given`` that is not in ``known``, sorted, with the closest known name if any."""
    known_names = _names(known, "known")
    sentences = []
    for name in sorted(set(_names(given, "_input")) - set(known_names)):
        close = difflib.get_close_matches(name, known_names, n=1, cutoff=CUTOFF)
        sentences.append("%s is not a variable of this role%s; it is ignored"
                         % (name, " (did you mean %s?)" % close[0] if close else ""))
    return sentences


def regex_errors(patterns: t.Any) -> list[str]:
    """One problem per pattern that Python's ``re`` does not compile; ``{name: [pattern, ...]}`` in, names out.

    A name with several patterns is reported as ``name[index]``; empty patterns mean "unset" and are skipped.
    """
    if not isinstance(patterns, t.Mapping):
        raise AnsibleFilterError("_input: expected a mapping of variable name to pattern or list of patterns, got %s"
                                 % type(patterns).__name__)
    problems = []
    for name, value in patterns.items():
        several = not isinstance(value, str) and isinstance(value, t.Iterable)
        for index, pattern in enumerate(value if several else [value]):
            if not pattern:
                continue
            try:
                re.compile(str(pattern))
            except re.error as exc:
                where = "%s[%d]" % (name, index) if several else str(name)
                problems.append("%s=%s is not a valid regular expression (%s); fix it (Python re syntax, "
                                "in YAML single quotes so backslashes stay)" % (where, json.dumps(str(pattern)), exc))
    return problems


class FilterModule:
    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {"unknown_variables": unknown_variables, "regex_errors": regex_errors}
