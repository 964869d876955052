"""One adapter per dataset, each in its own module here: ``ADAPTERS`` is built from the files.

A module ``<name>.py`` defines ``ADAPTER = Adapter("<name>", ...)``, and a source's ``adapter: <name>`` picks it;
its docstring gives the dataset's schema as read. Adding a dataset is adding its module (and its tests): the
config's list of adapters, its errors and the mix check all read ``ADAPTERS``. Modules whose name starts with
``_`` are not adapters. A module without ``ADAPTER``, or whose ``ADAPTER`` has another name, stops the import,
so the file's name is always the name a config uses.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Dict, Iterable, Iterator

from datagen.prompts import Adapter

__all__ = ["ADAPTERS", "Adapter", "adapters_of"]


def _modules(package: str, path: Iterable[str]) -> Iterator[ModuleType]:
    """The adapter modules of PACKAGE (found on PATH), by name: every one not starting with ``_``."""
    for name in sorted(info.name for info in pkgutil.iter_modules(list(path))):
        if not name.startswith("_"):
            yield importlib.import_module(f"{package}.{name}")


def adapters_of(modules: Iterable[ModuleType]) -> Dict[str, Adapter]:
    """{name: adapter} of MODULES; ImportError names a module without ``ADAPTER`` or whose adapter has another name."""
    found: Dict[str, Adapter] = {}
    for module in modules:
        name = module.__name__.rpartition(".")[2]
        adapter = getattr(module, "ADAPTER", None)
        if not isinstance(adapter, Adapter):
            raise ImportError(f"{module.__name__} must define ADAPTER = Adapter({name!r}, ...), "
                              f"got {type(adapter).__name__}")
        if adapter.name != name:
            raise ImportError(f"{module.__name__}: ADAPTER is named {adapter.name!r}; an adapter is named for its "
                              f"module ({name!r}), which is what a source's adapter: picks")
        found[name] = adapter
    return found


ADAPTERS: Dict[str, Adapter] = adapters_of(_modules(__name__, __path__))
