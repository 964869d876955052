# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""pip's index configuration as the same options for ``uv pip install`` (the ``uv_index_args`` filter).

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. uv reads neither ``pip.conf`` nor ``PIP_*`` variables, so a node whose pip
uses a mirror would have uv resolve against PyPI without these options.
"""

from __future__ import annotations

import shlex
import typing as t

SECTIONS = ("global", "install", ":env:")
# pip's key -> uv's option; the keys whose value is a whitespace-separated list
OPTIONS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"),
           ("trusted-host", "--allow-insecure-host"), ("constraint", "--constraint"))
LISTS = {"extra-index-url", "find-links", "trusted-host", "constraint"}
TRUE = {"1", "true", "yes", "on"}


def pip_settings(text: str) -> dict[str, str]:
    """``{key: value}`` from ``pip config list`` lines (``section.key='value'``), as pip install sees them.

    pip config list prints its lines sorted, not in precedence order: an ``install`` setting overrides a
    ``global`` one, and the environment (``:env:``) overrides both, as in pip."""
    by_section: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in text.splitlines():
        name, sep, quoted = line.strip().partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        try:
            value = " ".join(shlex.split(quoted))
        except ValueError:
            value = quoted.strip("'\"")
        by_section[section][key] = value
    settings: dict[str, str] = {}
    for section in SECTIONS:  # lowest precedence first
        settings.update(by_section[section])
    return settings


def uv_index_args(text: t.Any) -> dict[str, t.Any]:
    """The ``uv pip install`` options (``args``) and environment (``env``) matching pip's configuration TEXT."""
    if not isinstance(text, str):
        raise ValueError("_input: expected the text of 'pip config list', got %s" % type(text).__name__)
    settings = pip_settings(text)
    args: list[str] = []
    if settings.get("no-index", "").lower() in TRUE:
        args.append("--no-index")
    for key, option in OPTIONS:
        values = settings.get(key, "").split() if key in LISTS else [settings.get(key, "")]
        for value in values:
            if value:
                args += [option, value]
    return {"args": args, "env": {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}}
