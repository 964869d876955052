"""Which test files start real processes, read from their source (for tests/unit/test_process_marks.py).

A file starts processes when its code refers to one of the standard library's process starters
(:data:`STARTERS`: ``subprocess.run``, ``os.fork``, ``multiprocessing`` ...), or to a function or class of the
checkout that does, followed through the checkout's own modules (tests/support, the lab's helper scripts, the
datagen package, the collection's plugins), or when one of its test functions asks for a ``conftest.py`` fixture
that does. Functions are followed by the names they use, a class as a whole: ``Tmux().run()`` starts processes
because some method of ``Tmux`` does. What is passed in as an object (``module.run_command`` on the argument of
a module_utils function) is the caller's: the test's own stand-in decides.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from tests.support.paths import COLLECTIONS, IMPORT_DIRS, ROOT, TESTS

STARTERS: FrozenSet[str] = frozenset({
    "subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "subprocess.getoutput", "subprocess.getstatusoutput",
    "os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp",
    "pty.fork", "pty.spawn",
    "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
    "concurrent.futures.ProcessPoolExecutor",
})
# every name under these: os.execv, os.spawnl, multiprocessing.Process, multiprocessing.get_context ...
STARTER_PREFIXES: Tuple[str, ...] = ("os.exec", "os.spawn", "multiprocessing.")

MARK = "pytest.mark.processes"


def is_starter(name: str) -> bool:
    """NAME (a dotted name as imported) is one of the standard library's ways to start a process."""
    return name in STARTERS or name.startswith(STARTER_PREFIXES)


def module_file(module: str) -> Optional[Path]:
    """The checkout's source file of the dotted MODULE, or None (the standard library, a third-party package)."""
    parts = module.split(".")
    if parts[0] == "tests":
        bases = [ROOT]
    elif parts[:3] == ["ansible_collections", "gpuops", "repurpose"]:
        bases = [COLLECTIONS]
    else:
        bases = [Path(d) for d in IMPORT_DIRS[1:]]
    for base in bases:
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
    return ".".join(base + ([node.module] if node.module else []))


def import_names(tree: ast.AST, package: str = "") -> Dict[str, str]:
    """Each local name an import in TREE binds (at any depth) to the dotted name it stands for."""
    names: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, package)
            for alias in node.names:
                names[alias.asname or alias.name] = "%s.%s" % (source, alias.name)
    return names


def _dotted(node: ast.AST) -> Optional[List[str]]:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but names and attributes of names."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else base + [node.attr]
    return None


def references(tree: ast.AST, imports: Dict[str, str], module: str, defined: Set[str]) -> Set[str]:
    """The dotted names the code in TREE uses: imported names resolved through IMPORTS, the module's own
    top-level DEFINED names as ``MODULE.name``."""
    found: Set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        parts = _dotted(node)
        if not parts:
            continue
        head = parts[0]
        if head in imports:
            found.add(".".join([imports[head]] + parts[1:]))
        elif head in defined:
            found.add(".".join([module, head] + parts[1:]))
    return found


class Module:
    """One source file: its top-level functions and classes and the names each of them uses."""

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self.tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.imports = import_names(self.tree, package)
        self.defs = {node.name: node for node in self.tree.body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self._uses: Dict[int, Set[str]] = {}

    def uses(self, node: ast.AST) -> Set[str]:
        """The dotted names NODE (this module's tree or a part of it) uses (:func:`references`)."""
        if id(node) not in self._uses:
            self._uses[id(node)] = references(node, self.imports, self.name, set(self.defs))
        return self._uses[id(node)]


# the modules read so far, by dotted name (a conftest.py outside the checkout is known only from here)
_LOADED: Dict[str, Optional[Module]] = {}


def load(module: str, path: Optional[Path] = None) -> Optional[Module]:
    """The dotted MODULE, read from PATH (default: where :func:`module_file` finds it) once; None if not ours."""
    if module not in _LOADED:
        path = path or module_file(module)
        _LOADED[module] = None if path is None else Module(path, module)
    return _LOADED[module]


def _split(name: str) -> Iterator[Tuple[str, str]]:
    """("module", "Def") for each way to read the dotted NAME as a module and a top-level name in it."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        yield ".".join(parts[:cut]), parts[cut]


# the verdict on each top-level function or class already judged, by dotted name
_VERDICTS: Dict[str, bool] = {}


def _def_starts(key: str, source: Module, top: str, seen: Set[str]) -> bool:
    """Whether SOURCE's top-level TOP (dotted KEY) reaches a starter; SEEN: what this search already visited
    (a graph search: whatever a visited name reaches is judged where it was first met)."""
    if key in _VERDICTS:
        return _VERDICTS[key]
    if key in seen:
        return False
    seen.add(key)
    verdict = any(_starts(used, seen) for used in source.uses(source.defs[top]))
    if verdict:
        _VERDICTS[key] = True
    return verdict


def _starts(name: str, seen: Set[str]) -> bool:
    if is_starter(name):
        return True
    for module, top in _split(name):
        source = load(module)
        if source is not None and top in source.defs:
            return _def_starts("%s.%s" % (module, top), source, top, seen)
    return False


def starts_processes(name: str) -> bool:
    """Using the dotted NAME can start a process: it is a starter, or the checkout's function or class it names
    uses one (followed to any depth)."""
    seen: Set[str] = set()
    verdict = _starts(name, seen)
    if not verdict:  # nothing reached from NAME starts one: neither does anything on the way
        _VERDICTS.update(dict.fromkeys(seen, False))
    return verdict


def dotted_name(path: Path, top: Path) -> str:
    """The module name of PATH, a file under TOP, as imported from TOP's parent (``tests.unit.x.test_y``)."""
    return ".".join(path.relative_to(top.parent).with_suffix("").parts)


def conftest_fixtures(test_file: Path, top: Path) -> Dict[str, str]:
    """The functions of the ``conftest.py`` files from TOP down to TEST_FILE's folder, by name (the nearest
    conftest wins), as their dotted names: the fixtures its tests may ask for."""
    fixtures: Dict[str, str] = {}
    for folder in reversed([test_file.parent, *test_file.parent.parents]):
        conftest = folder / "conftest.py"
        if (folder == top or top in folder.parents) and conftest.is_file():
            name = dotted_name(conftest, top)
            for function in load(name, conftest).defs:
                fixtures[function] = "%s.%s" % (name, function)
    return fixtures


def _requested(tree: ast.AST) -> Set[str]:
    """The argument names of every function in TREE: the fixtures its tests and fixtures ask for."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(arg.arg for arg in node.args.args + node.args.kwonlyargs)
    return names


def process_starts(test_file: Path, top: Path = TESTS) -> List[str]:
    """What in TEST_FILE (a file under TOP) starts processes: the dotted names it uses, and the conftest fixtures
    its functions ask for, that do; sorted, [] for a file of pure tests."""
    name = dotted_name(test_file, top)
    source = _LOADED[name] = Module(test_file, name)  # read afresh: the file may have changed
    for key in [key for key in _VERDICTS if key.startswith(name + ".")]:
        del _VERDICTS[key]
    used = source.uses(source.tree)
    fixtures = conftest_fixtures(test_file, top)
    used.update(fixtures[arg] for arg in _requested(source.tree) if arg in fixtures and arg not in source.defs)
    return sorted(n for n in used if starts_processes(n))


def _pytestmark(tree: ast.Module) -> Optional[ast.expr]:
    """The value of the module-level ``pytestmark = ...`` in TREE, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "pytestmark":
            return node.value
    return None


def has_processes_mark(test_file: Path) -> bool:
    """TEST_FILE's module-level ``pytestmark`` is, or lists, ``pytest.mark.processes``."""
    value = _pytestmark(ast.parse(test_file.read_text(encoding="utf-8"), str(test_file)))
    marks = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value] if value is not None else []
    return any(_dotted(mark) == MARK.split(".") for mark in marks)
