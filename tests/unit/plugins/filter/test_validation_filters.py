# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The validation pass's filters: table tests, then through a real Jinja template as the roles use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.repurpose.plugins.filter import regex_errors as regex_errors_plugin
from ansible_collections.gpuops.repurpose.plugins.filter import unknown_variables as unknown_variables_plugin
from tests.support.paths import ROOT

regex_errors = regex_errors_plugin.FilterModule().filters()["regex_errors"]
unknown_variables = unknown_variables_plugin.FilterModule().filters()["unknown_variables"]

pytestmark = pytest.mark.processes  # ansible, run for real on localhost

KNOWN = ["stop_training_tmux_session", "stop_training_match", "stop_training_exclude", "stop_training_vmid"]


@pytest.mark.parametrize("given, expected", [
    ([], []),
    (KNOWN, []),
    (["stop_training_tmux_sesion"],
     ["stop_training_tmux_sesion is not a variable of this role (did you mean stop_training_tmux_session?); it is ignored"]),
    (["gpus_wanted"], ["gpus_wanted is not a variable of this role; it is ignored"]),
    # sorted, duplicates once, known names never reported
    (["stop_training_matchh", "stop_training_exlcude", "stop_training_vmid", "stop_training_matchh"],
     ["stop_training_exlcude is not a variable of this role (did you mean stop_training_exclude?); it is ignored",
      "stop_training_matchh is not a variable of this role (did you mean stop_training_match?); it is ignored"]),
])
def test_unknown_variables(given, expected):
    assert unknown_variables(given, KNOWN) == expected


@pytest.mark.parametrize("given, known, option", [("stop_training_x", KNOWN, "_input"), (["a"], 3, "known")])
def test_unknown_variables_wants_lists_of_names(given, known, option):
    with pytest.raises(AnsibleFilterError, match="^%s: expected a list of variable names" % option):
        unknown_variables(given, known)


def test_regex_errors():
    assert regex_errors({"stop_training_match": "torchrun|train\\.py", "stop_training_exclude": ["", "^vim "],
                         "stop_training_step_regex": ""}) == []
    problems = regex_errors({"stop_training_match": "torchrun (", "stop_training_exclude": ["ok", "[unclosed"]})
    assert problems == [
        'stop_training_match="torchrun (" is not a valid regular expression (missing ), unterminated subpattern at'
        ' position 9); fix it (Python re syntax, in YAML single quotes so backslashes stay)',
        'stop_training_exclude[1]="[unclosed" is not a valid regular expression (unterminated character set at'
        ' position 0); fix it (Python re syntax, in YAML single quotes so backslashes stay)',
    ]
    with pytest.raises(AnsibleFilterError, match="^_input: expected a mapping"):
        regex_errors(["torchrun ("])


def test_the_filters_run_in_a_real_template_by_their_fqcn(tmp_path):
    """As a role calls them: ansible resolves gpuops.repurpose.* and templates the result into a list."""
    out = tmp_path / "result"
    expr = ("{{ {'given': ['stop_training_tmux_sesion'] | gpuops.repurpose.unknown_variables(%s),"
            " 'problems': {'stop_training_match': 'a('} | gpuops.repurpose.regex_errors} }}" % json.dumps(KNOWN))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-m", "ansible.builtin.copy", "-a", json.dumps({"content": expr + "\n", "dest": str(out)}),
         "-e", "ansible_python_interpreter=%s" % sys.executable],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), capture_output=True, text=True,
        timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text().replace("'", '"'))
    assert result["given"] == ["stop_training_tmux_sesion is not a variable of this role"
                               " (did you mean stop_training_tmux_session?); it is ignored"]
    assert len(result["problems"]) == 1 and result["problems"][0].startswith('stop_training_match="a(" is not')
