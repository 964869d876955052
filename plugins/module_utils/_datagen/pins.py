# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``venv_pins_info``'s judgement: whether a venv already holds an install set exactly, so the installer may be
skipped.

This is a PRIVATE module_utils of gpuops.repurpose; its API may change at any
time. Standard library only (it runs on targets).

"Met" only when every requirement is a plain exact pin (``name==version``), each such distribution is
installed once at exactly that version, and ``pip check`` finds every installed distribution's requirements
satisfied: then ``pip install`` of the same set would resolve for seconds and change nothing. Anything else
(a range, extras, markers, a URL, an option line, a version equal but spelled otherwise, two copies of a
distribution) is "not met".
"""

from __future__ import annotations

import json
import re
import subprocess
import typing as t

# PEP 508 name, then ==, then a version with no wildcard (``==1.0.*`` is a range, not a pin)
PIN = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([A-Za-z0-9.+!_-]+)$")
# Run by the venv's own interpreter: every distribution its sys.path holds, one [name, version] each copy
DISTRIBUTIONS_PROBE = ("import importlib.metadata as m, json; "
                       "print(json.dumps([[d.metadata['Name'] or '', d.version] for d in m.distributions()]))")
PROBE_TIMEOUT_S = 120.0

Pin = t.Tuple[str, str]
# argv, timeout -> (rc, stdout); rc None when the program could not run or did not end in time
Run = t.Callable[[t.Sequence[str], float], t.Tuple[t.Optional[int], str]]


# ---------------------------------------------------------------- pure

def canonical(name: str) -> str:
    """The PEP 503 form of a distribution name (``PyYAML`` and ``pyyaml``, ``sglang_router`` and
    ``sglang-router`` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str) -> t.Optional[Pin]:
    """(canonical name, version) of a ``name==version`` requirement line, None for anything else."""
    found = PIN.match(line.split(" #", 1)[0].strip())
    return (canonical(found.group(1)), found.group(2)) if found else None


def requirement_lines(requirements: t.Sequence[str], read: t.Callable[[str], str]) -> t.List[str]:
    """The requirement lines of the install command's arguments (``-r FILE`` read by READ), comments and
    blank lines left out; an option other than ``-r`` is kept as a line, so it is never taken for a pin."""
    lines: t.List[str] = []
    args = iter(requirements)
    for arg in args:
        if arg in ("-r", "--requirement"):
            lines += [line.strip() for line in read(next(args, "")).splitlines()]
        else:
            lines.append(arg)
    return [line for line in lines if line and not line.startswith("#")]


def unmet(lines: t.Iterable[str], installed: t.Mapping[str, t.Set[str]]) -> t.List[str]:
    """The requirement lines the installed distributions (canonical name -> versions found) do not meet
    exactly, in order; [] when every line is a pin installed once at that version."""
    missing: t.List[str] = []
    for line in lines:
        pin = parse_pin(line)
        if pin is None or installed.get(pin[0], set()) != {pin[1]}:
            missing.append(line)
    return missing


def parse_distributions(text: str) -> t.Dict[str, t.Set[str]]:
    """:data:`DISTRIBUTIONS_PROBE`'s output as canonical name -> the versions of its copies.
    Raises ValueError when it is not that output."""
    found: t.Dict[str, t.Set[str]] = {}
    for name, version in json.loads(text):
        if name:
            found.setdefault(canonical(name), set()).add(version)
    return found


# ---------------------------------------------------------------- the node

def run_bounded(argv: t.Sequence[str], timeout: float) -> t.Tuple[t.Optional[int], str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    return done.returncode, done.stdout


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def not_met(why: str, lines: t.Sequence[str], unmet_lines: t.Sequence[str] = ()) -> t.Dict[str, t.Any]:
    return {"changed": False, "met": False, "msg": "not met: " + why, "requirements": list(lines),
            "unmet": list(unmet_lines)}


def pins_met(p: t.Mapping[str, t.Any], run: Run = run_bounded,
             read: t.Callable[[str], str] = read_text) -> t.Dict[str, t.Any]:
    """``venv_pins_info``'s runner: ``{met, msg, requirements, unmet}``; reads only, never fails on what it
    finds (a venv it cannot run, as on a fresh node, is "not met")."""
    python = p["python"]
    try:
        lines = requirement_lines(p["requirements"], read)
    except OSError as exc:
        return not_met(str(exc), [])
    if not lines:
        return not_met("no requirements given", lines)
    rc, out = run([python, "-c", DISTRIBUTIONS_PROBE], PROBE_TIMEOUT_S)
    try:
        installed = parse_distributions(out) if rc == 0 else None
    except (ValueError, TypeError):
        installed = None
    if installed is None:
        return not_met("%s could not list its distributions: %s" % (python, " ".join(out.split())[:300]), lines,
                       lines)
    missing = unmet(lines, installed)
    if missing:
        return not_met(", ".join(missing[:5]), lines, missing)
    # pip changes nothing for a met pin, but it would install a dependency that went missing: pip check
    # says whether one did
    rc, out = run([python, "-m", "pip", "check"], PROBE_TIMEOUT_S)
    if rc != 0:
        return not_met("pip check: %s" % " ".join(out.split())[:300], lines)
    return {"changed": False, "met": True, "msg": "met: %d pins installed, pip check clean" % len(lines),
            "requirements": lines, "unmet": []}
