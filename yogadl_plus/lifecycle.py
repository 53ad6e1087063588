"""What yogadl_plus does when its process forks or exits, and the process limits it raises.

Every fork and exit hook of the package goes through this module, and only this module calls
``os.register_at_fork`` and ``atexit.register``. A module whose objects hold what a forked child
must not use (LMDB handles, threads, locks another thread may hold) keeps them in a
``Registry``, which says what each live object does before a fork, after it (in the parent and
in the child) and at exit. Module-level state with a fork duty (a lock, a helper pool) says so
with ``on_fork``. ``allow_open_files`` raises the open-file limit where a version's chunks need it.

Hooks run in the order Python gives its own: before a fork, the last registered first; after
it, the first registered first; at exit, the last registered first. ``multiprocessing``'s exit
handler is registered before ours, so ours run first: it waits for worker processes, and a
worker stuck in a transform must be ended before it does.
"""

from __future__ import annotations

import atexit
import contextlib

# Imported for its exit handler, which must be registered before ours (see above).
import multiprocessing.util  # noqa: F401
import os
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "allow_open_files", "at_exit", "on_fork", "registries"]

T = TypeVar("T")
Hook = Callable[[], None]

# File descriptors kept free for everything else the process opens.
_SPARE_FILES = 1024

_BEFORE_FORK: list[Hook] = []
_AFTER_FORK_IN_PARENT: list[Hook] = []
_AFTER_FORK_IN_CHILD: list[Hook] = []
_AT_EXIT: list[Hook] = []
_REGISTRIES: list[Registry[Any]] = []


def on_fork(
    *,
    before: Hook | None = None,
    after_in_parent: Hook | None = None,
    after_in_child: Hook | None = None,
) -> None:
    """Run these when the process forks (``os.register_at_fork``'s three moments)."""
    for hooks, hook in (
        (_BEFORE_FORK, before),
        (_AFTER_FORK_IN_PARENT, after_in_parent),
        (_AFTER_FORK_IN_CHILD, after_in_child),
    ):
        if hook is not None:
            hooks.append(hook)


def at_exit(hook: Hook) -> None:
    """Run ``hook`` when the interpreter exits, while it is still whole."""
    _AT_EXIT.append(hook)


class Registry(Generic[T]):
    """The live objects of one kind in this process, and what each does when the process forks
    or exits (each hook is called with the object).

    Held weakly: an object leaves when it is collected. ``weak=False`` holds them until
    ``discard`` (worker processes: the exit handler must end those of pools already dropped).
    """

    def __init__(
        self,
        name: str,
        *,
        before_fork: Callable[[T], None] | None = None,
        after_fork_in_parent: Callable[[T], None] | None = None,
        after_fork_in_child: Callable[[T], None] | None = None,
        at_exit: Callable[[T], None] | None = None,
        weak: bool = True,
    ) -> None:
        self.name = name
        self._objects: weakref.WeakSet[Any] | dict[int, Any] = weakref.WeakSet() if weak else {}
        for hooks, hook in (
            (_BEFORE_FORK, before_fork),
            (_AFTER_FORK_IN_PARENT, after_fork_in_parent),
            (_AFTER_FORK_IN_CHILD, after_fork_in_child),
            (_AT_EXIT, at_exit),
        ):
            if hook is not None:
                hooks.append(_for_each(self, hook))
        _REGISTRIES.append(self)

    def add(self, obj: T) -> None:
        if isinstance(self._objects, dict):
            self._objects[id(obj)] = obj
        else:
            self._objects.add(obj)

    def discard(self, obj: T) -> None:
        if isinstance(self._objects, dict):
            self._objects.pop(id(obj), None)
        else:
            self._objects.discard(obj)

    def clear(self) -> None:
        """Forget every object (a forked child forgets those that are its parent's)."""
        self._objects.clear()

    def __iter__(self) -> Iterator[T]:
        """The objects now (a copy: hooks may add or drop objects while they run)."""
        objects = self._objects.values() if isinstance(self._objects, dict) else self._objects
        return iter(list(objects))

    def __len__(self) -> int:
        return len(self._objects)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self)} live)"


def registries() -> list[Registry[Any]]:
    """Every registry of the process, in the order they were made (for tests and debugging)."""
    return list(_REGISTRIES)


def allow_open_files(count: int) -> None:
    """Raise this process's soft limit on open files (up to its hard limit) so that ``count``
    more can be open at once, with room to spare for everything else: each open chunk of a
    version holds a descriptor (and one more while it is read ahead), and a shuffle over 10^4
    chunks opens them all. Soft limits of 1024 are common, hard ones higher."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + _SPARE_FILES
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _for_each(registry: Registry[T], hook: Callable[[T], None]) -> Hook:
    def run() -> None:
        for obj in registry:
            hook(obj)

    return run


def _run(hooks: list[Hook], reverse: bool) -> None:
    # Each hook runs whatever the others did, as separate atexit handlers would: one that
    # failed must not leave worker processes running for multiprocessing's handler to wait on.
    for hook in reversed(hooks) if reverse else list(hooks):
        try:
            hook()
        except Exception:
            traceback.print_exc()


os.register_at_fork(
    before=lambda: _run(_BEFORE_FORK, reverse=True),
    after_in_parent=lambda: _run(_AFTER_FORK_IN_PARENT, reverse=False),
    after_in_child=lambda: _run(_AFTER_FORK_IN_CHILD, reverse=False),
)
atexit.register(lambda: _run(_AT_EXIT, reverse=True))
