# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpuops.repurpose.validate_role_vars: a role's variables, judged on the controller before anything runs.

Types and choices from the role's argument spec (as ``validate_argument_spec`` checks
them), said in one line per variable with its value and the fix; then the host's
``PREFIX_*`` variables the role does not know, with the name probably meant. Nothing
connects to the host: its connection settings may be the mistake.
"""

from __future__ import annotations

import os
import typing as t

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._role_vars import (
    public_names,
    role_problems,
    type_errors,
    unknown_variables,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("prefix", "strict", "argument_spec"))

    def run(self, tmp: t.Any = None, task_vars: dict | None = None) -> dict:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        prefix = str(self._task.args.get("prefix") or "")
        if not prefix:
            raise AnsibleError("validate_role_vars: prefix is required (the role's variable prefix, e.g. stop_training)")
        spec = self._task.args.get("argument_spec") or self._role_spec(task_vars)
        values = self._templar.template({name: task_vars[name] for name in spec if name in task_vars})
        checked = ArgumentSpecValidator(spec).validate(values, validate_role_argument_spec=True)
        host_vars = task_vars["hostvars"][task_vars["inventory_hostname"]]
        unknown = unknown_variables(public_names(host_vars.keys(), prefix), list(spec))
        failure, warning = role_problems(prefix, checked.error_messages, values, unknown,
                                         boolean(self._task.args.get("strict", False), strict=False))
        # the spec's raw errors name Ansible's internal types; what is returned is the line per variable the msg has
        result.update(changed=False, argument_errors=type_errors(checked.error_messages, values), unknown=unknown)
        if failure:
            result.update(failed=True, msg=failure)
        elif warning:
            # shown without -v, as debug shows its msg: an operator must see the typo that kept a default
            result.update(msg=warning, _ansible_verbose_always=True)
        return result

    def _role_spec(self, task_vars: dict) -> dict:
        """The options of the role's main entry point (meta/argument_specs.yml of the role running this task)."""
        path = os.path.join(str(task_vars.get("role_path", "")), "meta", "argument_specs.yml")
        try:
            specs = self._loader.load_from_file(path)
            return dict(specs["argument_specs"]["main"]["options"])
        except (AnsibleError, KeyError, TypeError) as exc:
            raise AnsibleError("validate_role_vars: no argument_spec given and none read from %s (%s)" % (path, exc)) from exc
