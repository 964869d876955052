"""Whether the venv already holds the role's install set exactly, so a re-run can skip the installer.

Run on the node with the venv's interpreter (standard library only), with the install command's own
requirement arguments::

    venv_pins.py sglang-router==0.3.2 -r /opt/datagen/requirements-datagen.txt

Exit status 0 ("met") only when every requirement is a plain exact pin (``name==version``), each such
distribution is installed once at exactly that version, and ``pip check`` finds every installed
distribution's requirements satisfied: then ``pip install`` of the same set would resolve for seconds
and change nothing. Anything else (a range, extras, markers, a URL, an option line, a version equal but
spelled otherwise, two copies of a distribution) is "not met" (exit status 1), and the role runs the
installer as before. One line on stdout says why.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

# PEP 508 name, then ==, then a version with no wildcard (``==1.0.*`` is a range, not a pin)
PIN = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([A-Za-z0-9.+!_-]+)$")

Pin = Tuple[str, str]


def canonical(name: str) -> str:
    """The PEP 503 form of a distribution name (``PyYAML`` and ``pyyaml``, ``sglang_router`` and
    ``sglang-router`` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str) -> Optional[Pin]:
    """(canonical name, version) of a ``name==version`` requirement line, None for anything else."""
    found = PIN.match(line.split(" #", 1)[0].strip())
    return (canonical(found.group(1)), found.group(2)) if found else None


def requirement_lines(argv: List[str], read=lambda path: Path(path).read_text(encoding="utf-8")) -> List[str]:
    """The requirement lines of the install command's arguments (``-r FILE`` read by READ), comments and
    blank lines left out; an option other than ``-r`` is kept as a line, so it is never taken for a pin."""
    lines: List[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-r", "--requirement"):
            text = read(next(args, ""))
            lines += [line.strip() for line in text.splitlines()]
        else:
            lines.append(arg)
    return [line for line in lines if line and not line.startswith("#")]


def unmet(lines: Iterable[str], installed: Mapping[str, Set[str]]) -> List[str]:
    """The requirement lines the installed distributions (canonical name -> versions found) do not meet
    exactly, in order; [] when every line is a pin installed once at that version."""
    missing: List[str] = []
    for line in lines:
        pin = parse_pin(line)
        if pin is None or installed.get(pin[0], set()) != {pin[1]}:
            missing.append(line)
    return missing


def installed_versions() -> Dict[str, Set[str]]:
    """Every distribution this interpreter sees: canonical name -> the versions of its copies."""
    found: Dict[str, Set[str]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), set()).add(dist.version)
    return found


def main(argv: List[str]) -> int:
    try:
        lines = requirement_lines(argv)
    except OSError as exc:
        print(f"not met: {exc}")
        return 1
    missing = unmet(lines, installed_versions())
    if missing or not lines:
        print(f"not met: {', '.join(missing[:5]) or 'no requirements given'}")
        return 1
    # pip changes nothing for a met pin, but it would install a dependency that went missing: pip check
    # says whether one did
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        print(f"not met: pip check: {' '.join(check.stdout.split())[:300]}")
        return 1
    print(f"met: {len(lines)} pins installed, pip check clean")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
