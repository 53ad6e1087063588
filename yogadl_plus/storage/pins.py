"""Pins: how a reader keeps the build it reads on disk until it is done with it.

A pin is a shared ``flock`` on a small file. Readers hold one for as long as a DataRef (or a
copy of it in a worker process) lives; whoever removes builds takes the lock exclusively first,
without waiting, and leaves a build alone while anyone holds it. The kernel drops a dead
process's locks, even after SIGKILL, so a crashed reader never pins a build forever. Taking a
pin writes nothing where the pin file exists, so read-only storage can be read (and, there,
nobody removes anything).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from yogadl_plus.errors import DatasetNotFound, PinGone

__all__ = ["Pin", "PinGone", "Pins", "exclusively"]


class Pin:
    """A shared lock on the file ``path``, held until ``release()`` (or garbage collection).

    ``create``: make the pin file if it is missing (where the folder is writable). ``touch``:
    set the file's mtime, as a record of the last use (for least-recently-used eviction).
    Pickled, a pin is taken again in the process that unpickles it.
    """

    def __init__(self, path: str, *, create: bool = True, touch: bool = False) -> None:
        self.path = path
        self.create = create
        self.touch = touch
        self._fd: int | None = None
        self._fd = _open_pin(path, create)
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            # Someone is removing what this pins right now.
            self.release()
            raise PinGone(path) from None
        except OSError:
            self.release()  # no flock here (some network filesystems): read unpinned
            return
        if touch:
            with contextlib.suppress(OSError):
                os.utime(self._fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    # Held by the class: a pin collected at interpreter exit (a pipeline that keeps its
    # DataRef to the end, as grain's does) is released after this module's globals are gone.
    _close = staticmethod(os.close)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._close(fd)  # closing drops the flock

    def __reduce__(self) -> tuple[Any, ...]:
        return (_repin, (self.path, self.create, self.touch))

    def __del__(self) -> None:
        self.release()


class Pins:
    """Several pins held and released together (one per build a version's chunks live in)."""

    def __init__(self, pins: Sequence[Pin] = ()) -> None:
        self.pins = list(pins)

    def release(self) -> None:
        for pin in self.pins:
            pin.release()


def _repin(path: str, create: bool, touch: bool) -> Pin:
    try:
        return Pin(path, create=create, touch=touch)
    except PinGone:
        raise DatasetNotFound(
            f"{os.path.dirname(path)}: the build this DataRef read is gone (the version was "
            "overwritten or deleted, and its old build removed, before this copy of the DataRef "
            "was unpickled); fetch the version again"
        ) from None


def _open_pin(path: str, create: bool) -> int | None:
    """A read-only descriptor of the pin file; None where it cannot exist (read-only storage
    without it); PinGone when its folder is gone."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            if not os.path.isdir(os.path.dirname(path)):
                raise PinGone(path) from None
            return None
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise PinGone(path) from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None  # read-only: nobody can remove what we read either
        raise


@contextlib.contextmanager
def exclusively(path: str) -> Iterator[bool]:
    """Yields True while holding ``path``'s pin exclusively (nobody reads what it pins), False
    if someone holds it. Never waits. A missing pin file is made (and then unpinned), dated
    0: its mtime records uses (see Pin's ``touch``), and this is none."""
    try:
        fd = _open_dated_0(path)
    except FileNotFoundError:
        yield True  # its folder is gone already
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a reader (or no flock here: then never remove)
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _open_dated_0(path: str) -> int:
    """A read-only descriptor of ``path``, made (dated 0) if it is missing: made aside and
    linked into place, so that nobody sees it dated now in between."""
    with contextlib.suppress(FileNotFoundError):
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    aside = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        fd = os.open(aside, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.close(fd)
        os.utime(aside, (0, 0))
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)  # (never replaces a pin someone made meanwhile)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        # No hard links here, or no writing: made the plain way, dated now.
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    finally:
        with contextlib.suppress(OSError):
            os.remove(aside)
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
