"""files/venv_pins.py: the pin check that lets a re-run of sglang_datagen skip the installer.

Its pure parts are checked on tables; the whole script runs with a real venv's interpreter, whose pip is
real, so "met" and every "not met" are what the role would see on a node."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest
import venv_pins

from tests.support.paths import DATAGEN_FILES

SCRIPT = DATAGEN_FILES / "venv_pins.py"


@pytest.mark.parametrize("line,pin", [
    ("PyYAML==6.0.4", ("pyyaml", "6.0.4")),
    ("sglang_router == 0.3.2", ("sglang-router", "0.3.2")),
    ("numpy==2.3.5  # mistral-common needs <2.4", ("numpy", "2.3.5")),
    ("numpy>=2.3", None),
    ("numpy==2.3.*", None),
    ("requests[socks]==2.32.0", None),
    ("foo==1.0; python_version < '3.12'", None),
    ("foo @ https://example.invalid/foo-1.0.whl", None),
    ("--index-url https://example.invalid/simple", None),
])
def test_parse_pin_takes_plain_exact_pins_only(line, pin):
    assert venv_pins.parse_pin(line) == pin


def test_requirement_lines_read_files_and_keep_options_as_lines():
    files = {"/r.txt": "# a comment\n\nJinja2==3.1.6\n--extra-index-url https://example.invalid\n"}
    lines = venv_pins.requirement_lines(["sglang-router==0.3.2", "-r", "/r.txt"], read=files.__getitem__)
    assert lines == ["sglang-router==0.3.2", "Jinja2==3.1.6", "--extra-index-url https://example.invalid"]


def test_unmet_names_every_line_not_installed_once_at_its_version():
    installed = {"jinja2": {"3.1.6"}, "pyyaml": {"6.0.4", "6.0.3"}, "numpy": {"2.3.4"}}
    lines = ["Jinja2==3.1.6", "PyYAML==6.0.4", "numpy==2.3.5", "aiohttp==3.14.5", "numpy>=2"]
    assert venv_pins.unmet(lines, installed) == ["PyYAML==6.0.4", "numpy==2.3.5", "aiohttp==3.14.5", "numpy>=2"]
    assert venv_pins.unmet(["Jinja2==3.1.6"], installed) == []


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """A real venv with pip (ensurepip, offline), as the role creates on a node."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(root)
    return root / "bin" / "python"


def run(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def installed(python: Path, name: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def fake_dist(python: Path, name: str, version: str, requires: str = "") -> None:
    """A distribution's metadata in the venv's site-packages, as an installed wheel leaves it."""
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    (info / "METADATA").write_text(meta + (f"Requires-Dist: {requires}\n" if requires else ""))
    (info / "RECORD").write_text("")


def test_met_only_when_every_pin_is_installed_and_pip_check_is_clean(venv_python, tmp_path):
    pip = installed(venv_python, "pip")
    req = tmp_path / "requirements.txt"
    req.write_text(f"# the role's file\npip=={pip}\n")
    done = run(venv_python, "-r", str(req))
    assert done.returncode == 0 and done.stdout.startswith("met: 1 pins"), done
    # a version not installed, a range, a file that is not there, nothing to check: the installer must run
    for args, why in ([f"pip=={pip}", "pip==0.1"], "pip==0.1"), ([f"pip>={pip}"], f"pip>={pip}"), \
            (["-r", str(tmp_path / "absent.txt")], "No such file"), ([], "no requirements given"):
        done = run(venv_python, *args)
        assert done.returncode == 1 and done.stdout.startswith("not met") and why in done.stdout, (args, done)
    # every pin installed, but a dependency of an installed distribution went missing: pip would install
    # it, so the check must not say "met" (pip check names it)
    fake_dist(venv_python, "lab_fake", "1.0", requires="lab-missing-dependency")
    done = run(venv_python, f"pip=={pip}", "lab-fake==1.0")
    assert done.returncode == 1 and "pip check" in done.stdout and "lab-missing-dependency" in done.stdout, done
    fake_dist(venv_python, "lab_missing_dependency", "2.0")
    assert run(venv_python, f"pip=={pip}", "lab-fake==1.0").returncode == 0
