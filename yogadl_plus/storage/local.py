"""Versions in a local directory: ``<root>/<dataset_id>/<version>/``."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator

from filelock import FileLock

from yogadl_plus.cache.manifest import MANIFEST_NAME, Manifest
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import DatasetNotFound
from yogadl_plus.storage.base import Storage, check_name

__all__ = ["LocalStorage", "is_leftover"]

# Bookkeeping entries carry a '+', which no dataset_id or version may contain.
_LOCK = "+lock."
_STAGING = "+staging."
_TRASH = "+trash."


def is_leftover(entry: str, version: str, kinds: tuple[str, ...] = (_STAGING, _TRASH)) -> bool:
    """True for ``<kind><version>.<random>`` exactly, ``+staging.`` and ``+trash.`` by default
    (not for those of a sibling version such as ``<version>.2``)."""
    for kind in kinds:
        prefix = f"{kind}{version}."
        if entry.startswith(prefix) and "." not in entry[len(prefix) :]:
            return True
    return False


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage(Storage):
    """Versioned caches in a directory on this machine (made if missing).

    A version is built in ``<root>/<id>/+staging.<version>.<random>/`` and renamed into place in
    one step once it is complete and checked, so a crash at any point leaves either no version or
    a whole one. Leftovers of crashed builders are removed by the next builder of that version.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStorage) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def path(self, dataset_id: str, version: str) -> str:
        """The folder a published version lives in."""
        return os.path.join(
            self.root, check_name("dataset_id", dataset_id), check_name("version", version)
        )

    def _manifest_exists(self, dataset_id: str, version: str) -> bool:
        return os.path.exists(os.path.join(self.path(dataset_id, version), MANIFEST_NAME))

    def _open(self, dataset_id: str, version: str) -> DataRef:
        folder = self.path(dataset_id, version)
        try:
            manifest = Manifest.read(folder)
        except FileNotFoundError:
            raise DatasetNotFound(
                f"no version {version!r} of dataset {dataset_id!r} in {self}; "
                f"published: {self.list() or 'none'}"
            ) from None
        return DataRef(folder, manifest)

    @contextlib.contextmanager
    def _builder_lock(self, dataset_id: str, version: str) -> Iterator[None]:
        folder = os.path.join(self.root, dataset_id)
        os.makedirs(folder, exist_ok=True)
        # A fresh FileLock (its own file descriptor) per call, so threads exclude each other too.
        with FileLock(os.path.join(folder, _LOCK + version), thread_local=False):
            yield

    @contextlib.contextmanager
    def _staging(self, dataset_id: str, version: str, replace: bool) -> Iterator[str]:
        parent = os.path.join(self.root, dataset_id)
        # We hold the builder lock: any staging or trash folder of this version is a dead builder's.
        for entry in os.listdir(parent):
            if is_leftover(entry, version):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        staging = os.path.join(parent, f"{_STAGING}{version}.{uuid.uuid4().hex[:12]}")
        os.makedirs(staging)
        try:
            yield staging
            final = os.path.join(parent, version)
            if replace and os.path.exists(final):
                trash = os.path.join(parent, f"{_TRASH}{version}.{uuid.uuid4().hex[:12]}")
                os.rename(final, trash)
                os.rename(staging, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                if os.path.exists(final):
                    # A folder without a manifest is no version: leftovers of an old layout.
                    shutil.rmtree(final)
                os.rename(staging, final)
            _fsync_dir(parent)
        finally:
            if os.path.exists(staging):
                shutil.rmtree(staging, ignore_errors=True)

    def _versions(self) -> Iterator[tuple[str, str]]:
        for dataset_id in os.listdir(self.root):
            folder = os.path.join(self.root, dataset_id)
            if "+" in dataset_id or not os.path.isdir(folder):
                continue
            for version in os.listdir(folder):
                if "+" not in version and os.path.exists(
                    os.path.join(folder, version, MANIFEST_NAME)
                ):
                    yield dataset_id, version

    def _remove(self, dataset_id: str, version: str) -> None:
        if not self._manifest_exists(dataset_id, version):
            raise DatasetNotFound(f"no version {version!r} of dataset {dataset_id!r} in {self}")
        self.discard(dataset_id, version)

    def discard(self, dataset_id: str, version: str) -> None:
        """Take a version's folder away in one rename, then delete it (callers hold the
        builder lock; processes with its files open keep reading them)."""
        parent = os.path.join(self.root, dataset_id)
        trash = os.path.join(parent, f"{_TRASH}{version}.{uuid.uuid4().hex[:12]}")
        os.rename(os.path.join(parent, version), trash)
        _fsync_dir(parent)
        shutil.rmtree(trash, ignore_errors=True)
