"""Import paths and names of the last release that moved: they keep working for one more
release, each with a DeprecationWarning that says where it is now.

A moved module's old path gives the very module at its new path (not a copy of its names), so
that a value set through either, such as ``building.starts.SERIAL_UNDER_SECONDS``, is the one
the package reads. A package's submodules move with it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "RENAMED", "install", "old_names"]

#: Old module path -> new one.
MOVED = {
    "yogadl_plus.build": "yogadl_plus.building",
    "yogadl_plus.storage.localcache": "yogadl_plus.storage.mirror",
    "yogadl_plus.storage.cachefiles": "yogadl_plus.storage.mirrorfiles",
    "yogadl_plus.storage.cachepins": "yogadl_plus.storage.mirrorpins",
}

#: Module -> {old name: new name} of the names it renamed.
RENAMED = {
    "yogadl_plus.cache.demand": {"ChunkSource": "ChunkProvider"},
    "yogadl_plus.mixture": {"Source": "Mixable"},
    "yogadl_plus.storage.eviction": {"CacheSpace": "MirrorSpace"},
    "yogadl_plus.storage.mirror": {"LocalCache": "Mirror"},
    "yogadl_plus.storage.mirrorpins": {"CachePins": "MirrorPins"},
}

# Frames the warning is not about: the import machinery's and the package's own.
_MACHINERY = (
    "<frozen importlib",
    os.path.dirname(importlib.__file__) + os.sep,
    os.path.dirname(__file__) + os.sep,
)


def _warn(message: str) -> None:
    """A DeprecationWarning pointing at the user's line that used the old path or name."""
    level, frame = 1, inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(_MACHINERY):
        name = frame.f_code.co_filename
        # (warnings itself leaves the import system's frames out of the count.)
        level += not ("importlib" in name and "_bootstrap" in name)
        frame = frame.f_back
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def moved_to(name: str) -> str | None:
    """Where the module ``name`` is now, when it is an old path (or under one); else None."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of an old path, answered with the module at the new one."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("yogadl_plus.") or moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = moved_to(spec.name)
        assert new is not None
        _warn(f"{spec.name} is deprecated and goes in the next release: import {new} instead")
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at the new path is imported already


def install() -> None:
    """Make the old paths importable (once per process). First among the finders, so that a
    moved package's submodules are not found again under its old name as new modules."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())


def old_names(module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``module``, which serves its old names (RENAMED). Set it
    under ``if not TYPE_CHECKING:``: a type checker would take any name for one it serves."""
    renamed = RENAMED[module]

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renamed[name]
        _warn(f"{module}.{name} is deprecated and goes in the next release: use {new} instead")
        return getattr(sys.modules[module], new)

    return __getattr__
