# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filters the roles use on their inputs, on the controller: misspelt variable names, regexes that do not
compile, and pip's index configuration for uv.

Each filter's documentation is the YAML file of its name beside this one (``unknown_variables.yml``,
``regex_errors.yml``, ``uv_index_args.yml``); the logic is in plugin_utils, shared with the
``validate_role_vars`` action.
"""

from __future__ import annotations

import functools
import typing as t

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.repurpose.plugins.plugin_utils._role_vars import regex_errors, unknown_variables
from ansible_collections.gpuops.repurpose.plugins.plugin_utils._uv_index import uv_index_args


def _filter(function: t.Callable[..., t.Any]) -> t.Callable[..., t.Any]:
    """FUNCTION as a filter: a wrong input (``ValueError``, naming the option) fails the template, not the run."""

    @functools.wraps(function)
    def wrapper(*args: t.Any, **kwargs: t.Any) -> t.Any:
        try:
            return function(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc

    return wrapper


class FilterModule:
    """unknown_variables, regex_errors and uv_index_args (run on the controller)."""

    def filters(self) -> dict[str, t.Callable[..., t.Any]]:
        return {function.__name__: _filter(function) for function in (unknown_variables, regex_errors, uv_index_args)}
