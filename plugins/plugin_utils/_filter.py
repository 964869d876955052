# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one wrapper that makes a plugin_utils function a Jinja2 filter.

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. Each filter is its own file under ``plugins/filter`` with its documentation
inline, the form ansible-doc and Galaxy's importer both read; the logic stays in
plugin_utils, shared with the ``validate_role_vars`` action.
"""

from __future__ import annotations

import functools
import typing as t

from ansible.errors import AnsibleFilterError


def as_filter(function: t.Callable[..., t.Any]) -> t.Callable[..., t.Any]:
    """FUNCTION as a filter: a wrong input (``ValueError``, naming the option) fails the template, not the run."""

    @functools.wraps(function)
    def wrapper(*args: t.Any, **kwargs: t.Any) -> t.Any:
        try:
            return function(*args, **kwargs)
        except ValueError as exc:
            raise AnsibleFilterError(str(exc)) from exc

    return wrapper
