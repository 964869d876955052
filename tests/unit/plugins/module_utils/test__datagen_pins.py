"""_datagen.pins, the check that lets a re-run of sglang_datagen skip the installer: its rules on tables; then
``venv_pins_info`` in its own process on a real venv, whose pip is real, so "met" and every "not met" are what
the role would see on a node."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen import pins
from tests.support.module import run_module

pytestmark = pytest.mark.processes


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
    assert pins.parse_pin(line) == pin


def test_requirement_lines_read_files_and_keep_options_as_lines():
    files = {"/r.txt": "# a comment\n\nJinja2==3.1.6\n--extra-index-url https://example.invalid\n"}
    lines = pins.requirement_lines(["sglang-router==0.3.2", "-r", "/r.txt"], read=files.__getitem__)
    assert lines == ["sglang-router==0.3.2", "Jinja2==3.1.6", "--extra-index-url https://example.invalid"]


def test_unmet_names_every_line_not_installed_once_at_its_version():
    installed = {"jinja2": {"3.1.6"}, "pyyaml": {"6.0.4", "6.0.3"}, "numpy": {"2.3.4"}}
    lines = ["Jinja2==3.1.6", "PyYAML==6.0.4", "numpy==2.3.5", "aiohttp==3.14.5", "numpy>=2"]
    assert pins.unmet(lines, installed) == ["PyYAML==6.0.4", "numpy==2.3.5", "aiohttp==3.14.5", "numpy>=2"]
    assert pins.unmet(["Jinja2==3.1.6"], installed) == []


@pytest.mark.parametrize("text,found", [
    ('[["PyYAML", "6.0.4"], ["pyyaml", "6.0.3"], ["sglang_router", "0.3.2"]]',
     {"pyyaml": {"6.0.4", "6.0.3"}, "sglang-router": {"0.3.2"}}),
    ('[["", "1.0"]]', {}),  # a distribution without a name (broken metadata) is no pin's copy
    ("[]", {}),
])
def test_parse_distributions(text, found):
    assert pins.parse_distributions(text) == found


@pytest.mark.parametrize("text", ["", "Traceback", '{"a": 1}x'])
def test_parse_distributions_refuses_what_the_probe_does_not_print(text):
    with pytest.raises(ValueError):
        pins.parse_distributions(text)


# ---------------------------------------------------------------- the module, in its own process, on a real venv


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """A real venv with pip (ensurepip, offline), as the role creates on a node."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(root)
    return root / "bin" / "python"


def check(python: Path, *requirements: str) -> dict:
    return run_module("venv_pins_info", {"python": str(python), "requirements": list(requirements)}, timeout=240)


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
    out = check(venv_python, "-r", str(req))
    assert out["rc"] == 0 and out["met"] and out["msg"].startswith("met: 1 pins") and not out["changed"], out
    assert out["requirements"] == [f"pip=={pip}"] and out["unmet"] == []
    # a version not installed, a range, a file that is not there, nothing to check, a venv that is not there:
    # the installer must run
    for args, why in ([f"pip=={pip}", "pip==0.1"], "pip==0.1"), ([f"pip>={pip}"], f"pip>={pip}"), \
            (["-r", str(tmp_path / "absent.txt")], "No such file"), ([], "no requirements given"):
        out = check(venv_python, *args)
        assert out["rc"] == 0 and not out["met"] and out["msg"].startswith("not met") and why in out["msg"], (args, out)
    out = check(tmp_path / "no-venv" / "bin" / "python", f"pip=={pip}")
    assert not out["met"] and "could not list its distributions" in out["msg"], out
    # every pin installed, but a dependency of an installed distribution went missing: pip would install
    # it, so the check must not say "met" (pip check names it)
    fake_dist(venv_python, "lab_fake", "1.0", requires="lab-missing-dependency")
    out = check(venv_python, f"pip=={pip}", "lab-fake==1.0")
    assert not out["met"] and "pip check" in out["msg"] and "lab-missing-dependency" in out["msg"], out
    fake_dist(venv_python, "lab_missing_dependency", "2.0")
    assert check(venv_python, f"pip=={pip}", "lab-fake==1.0")["met"] is True
    # two copies of one distribution: pip could not say which one imports
    fake_dist(venv_python, "Lab.Fake", "1.1")
    out = check(venv_python, f"pip=={pip}", "lab-fake==1.0")
    assert not out["met"] and out["unmet"] == ["lab-fake==1.0"], out
