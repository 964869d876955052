# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A role's variables judged on the controller: wrong types, misspelt names, regexes that do not compile.

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. Each function returns one sentence per problem, naming the variable, its
value and the fix, for the ``validate_role_vars`` action and the filters
``unknown_variables`` and ``regex_errors``. A wrong input (not a list, not a
mapping) raises ``ValueError`` naming the option.
"""

from __future__ import annotations

import difflib
import json
import re
import typing as t

# difflib's default: close enough to be a typo, far enough that unrelated names are not suggested
CUTOFF = 0.6

# what each argument spec type takes, in the words of the fix
KINDS = {
    "float": "a number (e.g. 60)",
    "int": "a whole number (e.g. 8)",
    "bool": "true or false",
    "list": "a list (e.g. [a, b])",
    "dict": "a mapping (e.g. {key: value})",
    "str": "a string",
}

# ArgumentSpecValidator's words for a value it could not convert
_CONVERT = re.compile(r"argument '([a-z0-9_]+)' is of type [a-zA-Z_]+ and we were unable to convert to ([a-z]+)")


def _names(value: t.Any, option: str) -> t.List[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, t.Iterable):
        raise ValueError("%s: expected a list of variable names, got %s" % (option, type(value).__name__))
    return [str(name) for name in value]


def public_names(names: t.Iterable[str], prefix: str) -> t.List[str]:
    """The NAMES in the role's namespace: ``PREFIX_`` then a lowercase letter or digit (``PREFIX__`` is the role's own)."""
    public = re.compile("^%s_[a-z0-9]" % re.escape(prefix))
    return [str(name) for name in names if public.match(str(name))]


def unknown_variables(given: t.Any, known: t.Any) -> t.List[str]:
    """One sentence per name in ``given`` that is not in ``known``, sorted, with the closest known name if any."""
    known_names = _names(known, "known")
    sentences = []
    for name in sorted(set(_names(given, "_input")) - set(known_names)):
        close = difflib.get_close_matches(name, known_names, n=1, cutoff=CUTOFF)
        sentences.append("%s is not a variable of this role%s; it is ignored"
                         % (name, " (did you mean %s?)" % close[0] if close else ""))
    return sentences


def regex_errors(patterns: t.Any) -> t.List[str]:
    """One problem per pattern that Python's ``re`` does not compile; ``{name: [pattern, ...]}`` in, names out.

    A name with several patterns is reported as ``name[index]``; empty patterns mean "unset" and are skipped.
    """
    if not isinstance(patterns, t.Mapping):
        raise ValueError("_input: expected a mapping of variable name to pattern or list of patterns, got %s"
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


def type_errors(errors: t.Iterable[str], values: t.Mapping[str, t.Any]) -> t.List[str]:
    """The argument spec's errors in one line each: ``x="sixty" is not a number (e.g. 60): set x to a number ...``.

    An error that is not about converting a value (a choice, a missing option) is kept as it is.
    """
    sentences = []
    for error in errors:
        found = _CONVERT.search(error)
        if not found:
            sentences.append(error)
            continue
        name, kind = found.groups()
        words = KINDS.get(kind, "a " + kind)
        sentences.append("%s=%s is not %s: set %s to %s" % (name, json.dumps(str(values.get(name))), words, name, words))
    return sentences


def role_problems(prefix: str, argument_errors: t.Sequence[str], values: t.Mapping[str, t.Any],
                  unknown: t.Sequence[str], strict: bool) -> t.Tuple[t.List[str], t.List[str]]:
    """(the message that fails the run, the warning) for a role's variables; either may be empty.

    Wrong types fail first; unknown names fail only when STRICT (the role's ``PREFIX_strict_vars``), else warn.
    """
    if argument_errors:
        return ["%s: invalid variables, nothing was run:" % prefix] + type_errors(argument_errors, values), []
    if unknown and strict:
        return ["%s: unknown variables (%s_strict_vars is on), nothing was run:" % (prefix, prefix)] + list(unknown), []
    if unknown:
        return [], (["WARNING: %s: unknown variables (set %s_strict_vars: true to fail on them):" % (prefix, prefix)]
                    + list(unknown))
    return [], []
