"""The package's structure, checked over its source: no import cycles, no reaching into another
module's private attributes (docs/design.md#layers: each layer knows only the ones below it).

Every import counts, the lazy ones inside functions and those under ``if TYPE_CHECKING:``
included: a type a module names is a module it knows, and a cycle of them is one a reader has
to hold in mind whole (and the type checker to untangle). An import names the module it takes
from: ``from yogadl_plus.cache.reader import ChunkSet`` is an edge to ``yogadl_plus.cache.reader``
(Python also runs the package ``__init__`` files on the way, which every package does and is no
design decision, so those implicit steps are not edges).
"""

from __future__ import annotations

import ast
import functools
import gc
import pathlib
from collections.abc import Iterator

import yogadl_plus

PACKAGE = pathlib.Path(yogadl_plus.__file__).parent

# Private names of the standard library that are its documented interface.
STDLIB_PRIVATE = {("os", "_exit"), ("sys", "_current_frames")}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


@functools.cache
def parsed(path: pathlib.Path) -> ast.Module:
    """The syntax tree of the file ``path``, parsed once for every check. The collector is off
    meanwhile: late in the suite the process holds millions of objects (every framework is
    imported), and the nodes a parse makes set off full collections that took a minute."""
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        gc.enable()


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (under ``if TYPE_CHECKING:`` too)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _imports(child)


def _owner(name: str) -> str | None:
    """The package module that ``name`` (a module or a name inside one) belongs to."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, statement: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            yield alias.name
        return
    base = statement.module or ""
    if statement.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(statement.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    for alias in statement.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in MODULES else base


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module, path in MODULES.items():
        for statement in _imports(parsed(path)):
            for target in _targets(module, statement):
                owner = _owner(target)
                if owner is not None and owner != module:
                    graph[module].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    described = ["\n".join(f"  {m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n\n".join(described)


def test_cycle_check_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_imports_for_types_only_count_too() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n"
        "    from yogadl_plus.dataref import DataRef\n"
        "if typing.TYPE_CHECKING:\n"
        "    import yogadl_plus.mixture\n"
        "else:\n"
        "    import yogadl_plus.schema\n"
        "def f():\n"
        "    from yogadl_plus.stream import Stream\n"
    )
    found = [ast.unparse(statement) for statement in _imports(tree)]
    assert found == [
        "from typing import TYPE_CHECKING",
        "import typing",
        "from yogadl_plus.dataref import DataRef",
        "import yogadl_plus.mixture",
        "import yogadl_plus.schema",
        "from yogadl_plus.stream import Stream",
    ]


def _defined_names(tree: ast.Module) -> set[str]:
    """Every name this module defines: functions, classes, variables, and the attributes its
    classes give their own instances (``self.x = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def private_reaches(path: pathlib.Path) -> list[str]:
    """Where the module at ``path`` touches a private name that another module owns, or
    writes a private attribute onto another object."""
    tree = parsed(path)
    own = _defined_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in own:
                continue
            value = node.value
            if isinstance(value, ast.Name) and (value.id, name) in STDLIB_PRIVATE:
                continue
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue  # an object's own attributes, its base classes' included
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("yogadl_plus"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno}: imports {node.module}.{alias.name}")
    return found


def test_no_private_access_across_modules() -> None:
    found = [reach for path in MODULES.values() for reach in private_reaches(path)]
    assert not found, "private names used outside the module that owns them:\n" + "\n".join(found)


def test_private_check_can_fail(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "from yogadl_plus.stream import _hidden\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, other, stream):\n"
        "        os._exit(0)\n"
        "        other._cache = {}\n"
        "        return other._mine + stream._offset_of(0, 1)\n"
    )
    assert [r.split(": ", 1)[1] for r in private_reaches(sample)] == [
        "imports yogadl_plus.stream._hidden",
        "other._cache",
        "stream._offset_of",
    ]


# --- the seams of the sequential layer ---

STREAM_LAYER = ("yogadl_plus.stream", "yogadl_plus.order")
# What tells a mixture from a dataset: their classes, and what only one of them has.
SOURCE_KINDS = {"Mixture", "DataRef", "DataRefOnDemand", "Leaf"}
SOURCE_MARKS = {"leaves", "locate", "place", "manifest", "mix_order", "counts", "weights"}


def _in_layer(module: str, layer: tuple[str, ...]) -> bool:
    return any(module == top or module.startswith(top + ".") for top in layer)


def source_kind_branches(path: pathlib.Path) -> list[str]:
    """Where the module at ``path`` asks what kind of source it has: isinstance/issubclass on
    a source class, hasattr of what only one kind has, or an import of those classes."""
    tree = parsed(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & SOURCE_KINDS:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
            if node.func.id == "hasattr" and len(node.args) == 2:
                mark = node.args[1]
                if isinstance(mark, ast.Constant) and mark.value in SOURCE_MARKS:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    for statement in _imports(tree):
        targets = [a.name for a in statement.names]
        module = statement.module if isinstance(statement, ast.ImportFrom) else None
        if module in ("yogadl_plus.mixture", "yogadl_plus.dataref") or any(
            t in ("yogadl_plus.mixture", "yogadl_plus.dataref") for t in targets
        ):
            found.append(f"{path.name}:{statement.lineno}: imports {module or targets}")
    return found


def test_the_stream_layer_never_asks_which_kind_of_source_it_has() -> None:
    found = [
        branch
        for module, path in MODULES.items()
        if _in_layer(module, STREAM_LAYER)
        for branch in source_kind_branches(path)
    ]
    assert not found, "the stream layer branches on the kind of source:\n" + "\n".join(found)


def test_source_kind_check_can_fail(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from yogadl_plus.mixture import Mixture\n"
        "def f(source, select):\n"
        "    if isinstance(source, (int, Mixture)) or hasattr(source, 'leaves'):\n"
        "        return 1\n"
        "    return hasattr(select, 'poll') or isinstance(source, str)\n"
    )
    assert [r.split(": ", 1)[1] for r in source_kind_branches(sample)] == [
        "isinstance(source, (int, Mixture))",
        "hasattr(source, 'leaves')",
        "imports yogadl_plus.mixture",
    ]


def test_adapters_import_nothing_of_the_cache_format() -> None:
    graph = import_graph()
    found = [
        f"{module} -> {target}"
        for module in graph
        if _in_layer(module, ("yogadl_plus.adapters",))
        for target in sorted(graph[module])
        if _in_layer(target, ("yogadl_plus.cache",))
    ]
    assert not found, "adapters reach into cache/:\n" + "\n".join(found)


def test_only_lifecycle_registers_fork_and_exit_hooks() -> None:
    found = []
    for module, path in MODULES.items():
        if module == "yogadl_plus.lifecycle":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and (
                (node.attr == "register_at_fork")
                or (node.attr == "register" and ast.unparse(node.value) == "atexit")
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "fork or exit hooks outside lifecycle.py:\n" + "\n".join(found)


# No function longer than this, and no class longer than that, in the package (docstrings
# included): past them, a piece does two jobs.
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def too_long(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(parsed(path)):
        limit = (
            MAX_FUNCTION_LINES
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            else MAX_CLASS_LINES
            if isinstance(node, ast.ClassDef)
            else None
        )
        if limit is not None:
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append(f"{path.name}:{node.lineno}: {node.name} has {lines} lines")
    return found


def test_no_function_or_class_is_too_long() -> None:
    found = [entry for path in MODULES.values() for entry in too_long(path)]
    assert not found, (
        f"over {MAX_FUNCTION_LINES} lines a function or {MAX_CLASS_LINES} a class:\n"
        + "\n".join(found)
    )
