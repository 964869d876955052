"""uv_index_args: pip's index configuration, as real ``pip config list`` prints it, turned into uv's options."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.repurpose.plugins.filter.uv_index_args import FilterModule

uv_index_args = FilterModule().filters()["uv_index_args"]

pytestmark = pytest.mark.processes  # pip config list, run for real


def pip_config_list(**env: str) -> str:
    """What ``pip config list`` prints with no configuration file (PIP_CONFIG_FILE=/dev/null: pip loads none) and
    ENV as its only settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    clean.update(PIP_CONFIG_FILE=os.devnull, **env)
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, env=clean,
                          timeout=60, check=True)
    return done.stdout


def test_a_mirror_set_in_the_environment_reaches_uv():
    text = pip_config_list(PIP_INDEX_URL="https://pypi.example.internal/simple",
                           PIP_EXTRA_INDEX_URL="https://a.example.internal/simple https://b.example.internal/simple",
                           PIP_TRUSTED_HOST="pypi.example.internal", PIP_CERT="/etc/ssl/corp.pem",
                           PIP_FIND_LINKS="/srv/wheels")
    assert uv_index_args(text) == {
        "args": ["--index-url", "https://pypi.example.internal/simple",
                 "--extra-index-url", "https://a.example.internal/simple",
                 "--extra-index-url", "https://b.example.internal/simple",
                 "--find-links", "/srv/wheels", "--allow-insecure-host", "pypi.example.internal"],
        "env": {"SSL_CERT_FILE": "/etc/ssl/corp.pem"}}


def test_no_configuration_means_no_options():
    assert uv_index_args(pip_config_list()) == {"args": [], "env": {}}


# settings as ``pip config list`` prints them: section.key='value', sorted (so the environment comes first)
FILES = """:env:.index-url='https://env.example.internal/simple'
download.index-url='https://download-only.example.internal/simple'
global.find-links='/srv/global-wheels'
global.index-url='https://pypi.example.internal/simple'
global.no-index='true'
install.find-links='/srv/wheels /srv/more'
"""


def test_install_overrides_global_and_the_environment_overrides_both():
    assert uv_index_args(FILES) == {"args": ["--no-index", "--index-url", "https://env.example.internal/simple",
                                             "--find-links", "/srv/wheels", "--find-links", "/srv/more"], "env": {}}


def test_anything_but_text_is_refused():
    with pytest.raises(AnsibleFilterError, match="expected the text of 'pip config list'"):
        uv_index_args(["global.index-url='x'"])
