# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The ``pct`` action group (meta/runtime.yml): ``module_defaults`` sets ``pct_path`` once for both pct modules.

The real ansible-playbook on localhost; ``pct_path`` (given only through the group) points at a stand-in
that records each call, so the test sees which modules ran it.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.support.playbook import run_playbook

pytestmark = pytest.mark.processes

PLAY = textwrap.dedent("""\
    - name: The pct group's defaults
      hosts: localhost
      connection: local
      gather_facts: false
      vars:
        ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
      module_defaults:
        group/gpuops.repurpose.pct:
          pct_path: {pct}
          pct_become_method: none
      tasks:
        - name: Exec through the group's pct
          gpuops.repurpose.proxmox_ct_exec:
            vmid: 200
            argv: ["true"]
            ensure_running: false
            timeout: 10
          ignore_errors: true

        - name: Status through the group's pct
          gpuops.repurpose.proxmox_ct_power:
            vmid: 201
            operation: status
          ignore_errors: true
    """)


def test_module_defaults_for_the_pct_group_reach_both_modules(tmp_path):
    log = tmp_path / "calls"
    pct = tmp_path / "pct"
    pct.write_text("#!/bin/sh\necho \"$@\" >> %s\necho 'status: running'\n" % log)
    pct.chmod(0o755)
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY.format(pct=pct))
    done = run_playbook(playbook, "localhost,", timeout=120)
    assert done.rc == 0, done.output[-3000:]
    calls = log.read_text().splitlines()
    assert any(" 200" in call or call.endswith("200") for call in calls), calls
    assert any("status 201" in call for call in calls), calls
