"""The package's structure, checked over its source: no import cycles, no reaching into another
module's private attributes (DESIGN.md: each layer knows only the ones below it).

Every import counts, the lazy ones inside functions included; only imports under
``if TYPE_CHECKING:`` are exempt, since they never run. An import names the module it takes
from: ``from yogadl_plus.cache.reader import ChunkSet`` is an edge to ``yogadl_plus.cache.reader``
(Python also runs the package ``__init__`` files on the way, which every package does and is no
design decision, so those implicit steps are not edges).
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import yogadl_plus

PACKAGE = pathlib.Path(yogadl_plus.__file__).parent

# Private names of the standard library that are its documented interface.
STDLIB_PRIVATE = {("os", "_exit")}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for statement in child.orelse:
                yield from _imports(statement)
            continue
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
        for statement in _imports(ast.parse(path.read_text(), str(path))):
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
    tree = ast.parse(path.read_text(), str(path))
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
