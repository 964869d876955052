"""The role's exact install set resolves together with SGLang's own pins (a resolver dry run against PyPI).

tasks/install.yml installs ``sglang==V``, ``sglang-router==R`` and ``files/requirements-datagen.txt`` in one
resolution; this test gives pip the same set, with the role's default versions, for the node's platform
(CPython 3.11, manylinux x86_64, wheels only). pip reads the wheels' metadata from PyPI (PEP 658) and downloads
no CUDA wheel. A pin that contradicts SGLang's (sglang 0.5.23's METADATA pins transformers==5.19.0 and
tokenizers==0.23.2; mistral-common needs numpy<2.4) makes the resolution impossible, and the test fails: the
second test proves that with the pins the role shipped before. Skipped, with the reason, only when PyPI
cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from tests.support.paths import ROOT

ROLE = ROOT / "roles" / "sglang_datagen"
REQUIREMENTS = ROLE / "files" / "requirements-datagen.txt"
INDEX = "https://pypi.org/simple"
# the node: CPython 3.11 on glibc x86_64 (sglang 0.5.23's wheel is manylinux_2_34; pip takes --platform literally)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(34, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]

pytestmark = [pytest.mark.timeout(900), pytest.mark.processes]


def ca_bundle() -> List[str]:
    """pip --isolated ignores pip.conf and PIP_CERT: pass the CA bundle the machine uses (a TLS proxy's)."""
    for path in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if path and os.path.isfile(path):
            return ["--cert", path]
    return []


def pypi_reachable() -> str:
    """'' when PyPI answers, else why not."""
    import ssl

    cert = ca_bundle()
    ctx = ssl.create_default_context(cafile=cert[1] if cert else None)
    try:
        with urllib.request.urlopen(INDEX + "/sglang-router/", timeout=15, context=ctx) as resp:
            return "" if resp.status == 200 else f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as exc:
        return str(exc)


def role_install_set(requirements: Path) -> List[str]:
    """What tasks/install.yml hands the installer, with the role's default versions."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return [f"sglang=={defaults['sglang_datagen_sglang_version']}",
            f"sglang-router=={defaults['sglang_datagen_router_version']}", "-r", str(requirements)]


def dry_run(install_set: List[str], report: Path) -> subprocess.CompletedProcess:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "--index-url", INDEX, *ca_bundle(), "--python-version", "3.11",
           *platform_args, "--only-binary=:all:", *install_set]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=800, check=False)


def pins(requirements: Path) -> Dict[str, str]:
    out = {}
    for line in requirements.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            out[canonical(m.group(1))] = m.group(2)
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def pypi():
    why = pypi_reachable()
    if why:
        pytest.skip(f"PyPI ({INDEX}) is not reachable from here, so the resolver dry run cannot run: {why}")


def test_role_install_set_resolves_with_sglangs_own_pins(pypi, tmp_path):
    report = tmp_path / "report.json"
    done = dry_run(role_install_set(REQUIREMENTS), report)
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {canonical(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
    versions = {name: item["metadata"]["version"] for name, item in resolved.items()}
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert versions["sglang"] == defaults["sglang_datagen_sglang_version"]
    assert versions["sglang-router"] == defaults["sglang_datagen_router_version"]
    # every pipeline pin is what gets installed (nothing of ours was replaced) ...
    for name, version in pins(REQUIREMENTS).items():
        assert versions[name] == version, (name, versions[name], version)
    # ... and every exact pin of SGLang's is what gets installed too (its own versions win)
    sglang_pins = {}
    for req in resolved["sglang"]["metadata"].get("requires_dist", []):
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*(;.*)?$", req)
        if m and not (m.group(3) and ("extra ==" in m.group(3) or "aarch64" in m.group(3))):
            sglang_pins[canonical(m.group(1))] = m.group(2)
    assert {"transformers", "tokenizers"} <= set(sglang_pins), sglang_pins
    # the CUDA build SGLang pins ([cuNN] extras) is the one the role's node check asks the driver for
    needs = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["sglang_datagen__sglang_needs"]
    cuda = {int(m) for req in resolved["sglang"]["metadata"].get("requires_dist", [])
            for m in re.findall(r"\[cu(\d+)\]", req)}
    assert cuda == {needs[versions["sglang"]]["cuda_major"]}, cuda
    wrong = {n: (v, versions.get(n)) for n, v in sglang_pins.items() if n in versions and versions[n] != v}
    assert not wrong, wrong
    # no CUDA wheel was fetched to find this out: pip used the metadata PyPI serves next to each wheel
    assert "torch" in versions and not list(tmp_path.glob("*.whl"))


def test_a_pin_against_sglangs_makes_the_resolution_fail(pypi, tmp_path):
    # the transformers pin the role shipped before, newer than SGLang's transformers==5.19.0
    text = re.sub(r"(?m)^transformers==\S+", "transformers==5.24.0", REQUIREMENTS.read_text())
    bad = tmp_path / "requirements-datagen.txt"
    bad.write_text(text)
    done = dry_run(role_install_set(bad), tmp_path / "report.json")
    assert done.returncode != 0
    assert "ResolutionImpossible" in done.stderr, done.stderr[-3000:]
    assert "transformers==5.24.0" in done.stderr and "sglang==0.5.23" in done.stderr, done.stderr[-3000:]


def pypi_get(url: str, accept: str = "") -> bytes:
    import ssl

    cert = ca_bundle()
    ctx = ssl.create_default_context(cafile=cert[1] if cert else None)
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=60, context=ctx) as resp:
        return resp.read()


def test_the_node_needs_of_the_default_sglang_are_read_from_its_wheels(pypi):
    """vars/main.yml's sglang_datagen__sglang_needs row for the default SGLang, against PyPI's index: the CPython
    range, Requires-Python and the manylinux glibc of its x86_64 wheels."""
    version = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["sglang_datagen_sglang_version"]
    needs = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["sglang_datagen__sglang_needs"][version]
    files = json.loads(pypi_get(INDEX + "/sglang/", "application/vnd.pypi.simple.v1+json"))["files"]
    wheels = [f for f in files if re.match(rf"sglang-{re.escape(version)}-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64\.whl$",
                                           f["filename"])]
    assert wheels, [f["filename"] for f in files if version in f["filename"]]
    minors = sorted(int(re.search(r"-cp3(\d+)-", w["filename"]).group(1)) for w in wheels)
    assert (needs["python_min"], needs["python_max"]) == ("3.%d" % minors[0], "3.%d" % minors[-1])
    glibc = {re.search(r"manylinux_(\d+)_(\d+)_", w["filename"]).group(0) for w in wheels}
    assert glibc == {"manylinux_%s_" % needs["glibc"].replace(".", "_")}, glibc
    assert {w.get("requires-python") for w in wheels} == {">=" + needs["python_min"]}
    # the CUDA major is checked against the [cuNN] extras of SGLang's METADATA in the resolver dry run above
