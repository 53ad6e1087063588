"""Versions in a local directory: ``<root>/<dataset_id>/<version>/``.

A version folder holds its manifest and one folder per build::

    <root>/<dataset_id>/<version>/manifest.json             names the chunks of one build
    <root>/<dataset_id>/<version>/b-<build>/chunk-00000.mdb  the chunks of that build
    <root>/<dataset_id>/<version>/b-<build>/+pin             held (shared) by its readers

Builds are immutable. A build is written in ``<root>/<dataset_id>/+staging.<version>.<random>/``,
moved into the version folder as ``b-<build>/`` in one rename, and published by replacing the
manifest in one rename; so a crash at any step leaves the old version or the new one, whole.
A reader pins the builds its manifest names; a build the manifest no longer names is removed
once nobody pins it (by the next build, overwrite, delete or open of that version). A reader of
an old build therefore reads it to the end, never a mix of builds.

Versions written by yogadl_plus 0.1.0 (chunk files directly in the version folder) are read
as they are; an overwrite puts the new build beside them and removes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
import uuid
from collections.abc import Iterator

from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest, read_manifest_bytes
from yogadl_plus.cache.version_writer import BUILD_FILE
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import CacheCorrupted, DatasetNotFound, PinGone, StorageError, unwritable
from yogadl_plus.files import fsync_dir, write_durably
from yogadl_plus.storage.base import OnTransfer, Storage, check_name
from yogadl_plus.storage.pins import Pin, Pins, exclusively
from yogadl_plus.storage.versionlock import remove_lock, version_lock

__all__ = [
    "LocalStorage",
    "build_pin_path",
    "builds_named",
    "default_root",
    "default_storage",
    "is_leftover",
]

# Bookkeeping entries carry a '+', which no dataset_id or version may contain.
_LOCK = "+lock."
_STAGING = "+staging."
_TRASH = "+trash."
_PIN = "+pin"
_BUILD = "b-"
_OPEN_ATTEMPTS = 20


def is_leftover(entry: str, version: str, kinds: tuple[str, ...] = (_STAGING, _TRASH)) -> bool:
    """True for ``<kind><version>.<random>`` exactly, ``+staging.`` and ``+trash.`` by default
    (not for those of a sibling version such as ``<version>.2``)."""
    for kind in kinds:
        prefix = f"{kind}{version}."
        if entry.startswith(prefix) and "." not in entry[len(prefix) :]:
            return True
    return False


def builds_named(manifest: Manifest) -> set[str]:
    """The build folders a manifest's chunks live in ("" for chunk files in the version folder
    itself, as yogadl_plus 0.1.0 wrote them)."""
    return {c.file.split("/", 1)[0] if "/" in c.file else "" for c in manifest.chunks}


def build_pin_path(folder: str, build: str) -> str:
    """The pin of build folder ``build`` (see pins.py) of the version in ``folder``."""
    return os.path.join(folder, build, _PIN)


class LocalStorage(Storage):
    """Versioned caches in a directory on this machine (made if missing).

    Each build of a version lives in a folder of its own and the version's manifest is switched
    to it in one step once it is complete and checked, so a crash at any point leaves the old
    version or the new one, whole; readers of an old build keep reading it to the end.
    Leftovers of crashed builders are removed by the next builder of that version.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        try:
            os.makedirs(self.root, exist_ok=True)
        except FileExistsError:
            raise StorageError(f"{self.root}: exists and is not a folder") from None
        except OSError as exc:
            raise unwritable(self.root, exc) from None

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

    def _check_root(self) -> None:
        if not os.path.isdir(self.root):
            raise StorageError(
                f"{self.root}: the storage folder does not exist any more (was it removed or "
                "unmounted?); make it again, or point the storage elsewhere"
            )

    def _not_found(self, dataset_id: str, version: str) -> DatasetNotFound:
        return DatasetNotFound(
            f"no version {version!r} of dataset {dataset_id!r} in {self}; "
            f"published: {self.list() or 'none'}"
        )

    def _manifest_exists(self, dataset_id: str, version: str) -> bool:
        return os.path.isfile(os.path.join(self.path(dataset_id, version), MANIFEST_NAME))

    # --- reading ---

    def _read(self, dataset_id: str, version: str) -> tuple[bytes, Manifest]:
        folder = self.path(dataset_id, version)
        path = os.path.join(folder, MANIFEST_NAME)
        try:
            data = read_manifest_bytes(path)
        except FileNotFoundError:
            self._check_root()
            # A deleted version's builds that were read until now go once nobody reads them.
            self._collect_if_idle(dataset_id, version, None)
            raise self._not_found(dataset_id, version) from None
        manifest = Manifest.parse(data, path)
        if (manifest.dataset_id, manifest.version) != (dataset_id, version):
            raise CacheCorrupted(
                f"{path} describes {manifest.dataset_id}:{manifest.version}, not "
                f"{dataset_id}:{version} (a manifest copied from elsewhere?)"
            )
        return data, manifest

    def _open(self, dataset_id: str, version: str, on_transfer: OnTransfer = None) -> DataRef:
        # (Nothing to transfer: the files are here.)
        folder = self.path(dataset_id, version)
        for _ in range(_OPEN_ATTEMPTS):
            data, manifest = self._read(dataset_id, version)
            try:
                pins = Pins(
                    [Pin(build_pin_path(folder, b)) for b in sorted(builds_named(manifest))]
                )
            except PinGone as gone:
                if self._still(folder, data):
                    build = os.path.relpath(os.path.dirname(str(gone)), folder)
                    raise CacheCorrupted(
                        f"{folder}: the build folder {build}/ its manifest names is gone (removed "
                        "by hand?); the version is damaged: rebuild it (overwrite=True)"
                    ) from None
                time.sleep(0.01)  # replaced since we read the manifest: read it again
                continue
            if self._still(folder, data):
                self._collect_if_idle(dataset_id, version, manifest)
                return DataRef(folder, manifest, hold=pins)
            pins.release()
        raise StorageError(
            f"{folder}: the version was replaced {_OPEN_ATTEMPTS} times while it was opened; "
            "try again"
        )

    @staticmethod
    def _still(folder: str, data: bytes) -> bool:
        """Whether the version in ``folder`` is still the one whose manifest is ``data``."""
        try:
            return read_manifest_bytes(os.path.join(folder, MANIFEST_NAME)) == data
        except FileNotFoundError:
            return False

    # --- building and publishing ---

    def lock_path(self, dataset_id: str, version: str) -> str:
        """The lock file of (dataset_id, version): see lock()."""
        return os.path.join(self.root, dataset_id, _LOCK + version)

    def version_lock(
        self, dataset_id: str, version: str, *, wait: bool = True
    ) -> contextlib.AbstractContextManager[bool]:
        """The lock of (dataset_id, version), held for a block: yields True, or without
        ``wait`` False at once when another holds it (see storage/versionlock.py)."""
        return version_lock(self.lock_path(dataset_id, version), wait=wait)

    def lock(self, dataset_id: str, version: str) -> contextlib.AbstractContextManager[None]:
        """Held by whoever changes (dataset_id, version): one at a time, across threads and
        processes on this machine (and machines sharing the folder, where flock works)."""
        return self._builder_lock(dataset_id, version)

    @contextlib.contextmanager
    def _builder_lock(self, dataset_id: str, version: str) -> Iterator[None]:
        folder = os.path.join(self.root, dataset_id)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise unwritable(folder, exc) from None
        path = self.lock_path(dataset_id, version)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(version_lock(path))
            except OSError as exc:
                raise unwritable(path, exc) from None
            yield

    @contextlib.contextmanager
    def _staging(
        self, dataset_id: str, version: str, replace: bool, lock: None, on_transfer: OnTransfer
    ) -> Iterator[str]:
        # (Nothing to upload: the build is published where it is.)
        parent = os.path.join(self.root, dataset_id)
        # We hold the builder lock: any staging or trash folder of this version is a dead builder's.
        for entry in os.listdir(parent):
            if is_leftover(entry, version):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        staging = os.path.join(parent, f"{_STAGING}{version}.{uuid.uuid4().hex[:12]}")
        try:
            os.makedirs(staging)
        except OSError as exc:
            raise unwritable(staging, exc) from None
        try:
            yield staging
            try:
                self._publish(dataset_id, version, staging)
            except OSError as exc:
                if isinstance(exc, StorageError):
                    raise
                raise unwritable(staging, exc) from exc
        finally:
            if os.path.exists(staging):
                shutil.rmtree(staging, ignore_errors=True)

    def _publish(self, dataset_id: str, version: str, staging: str) -> None:
        """Make the build in ``staging`` the version: move it in as a build folder, then switch
        the manifest to it. Each step leaves the old version or the new one."""
        built = Manifest.read(staging)
        build = f"{_BUILD}{uuid.uuid4().hex[:16]}"
        _drop_staging_files(staging)
        with open(os.path.join(staging, _PIN), "wb"):
            pass
        fsync_dir(staging)
        folder = self.path(dataset_id, version)
        os.makedirs(folder, exist_ok=True)
        fsync_dir(os.path.dirname(folder))
        os.rename(staging, os.path.join(folder, build))
        manifest = dataclasses.replace(built, chunks=[_in_build(c, build) for c in built.chunks])
        try:
            fsync_dir(folder)
            fsync_dir(os.path.dirname(folder))
            write_durably(os.path.join(folder, MANIFEST_NAME), manifest.to_json().encode())
        except BaseException:
            current = self._current(folder)
            if current is None or build not in builds_named(current):
                shutil.rmtree(os.path.join(folder, build), ignore_errors=True)
            raise
        self._collect(folder, manifest)

    def _collect_if_idle(self, dataset_id: str, version: str, manifest: Manifest | None) -> None:
        """Remove builds the manifest (None: no version) no longer names, if there are any and
        nobody is changing the version right now (never waits)."""
        folder = self.path(dataset_id, version)
        try:
            entries = os.listdir(folder)
        except OSError:
            return
        named = builds_named(manifest) if manifest is not None else set()
        if not any(_unnamed(e, named) for e in entries):
            return
        try:
            with version_lock(self.lock_path(dataset_id, version), wait=False) as held:
                if held:  # (else a builder is at work)
                    self._collect(folder, self._current(folder))
        except OSError:  # a read-only storage
            return

    @staticmethod
    def _current(folder: str) -> Manifest | None:
        try:
            return Manifest.read(folder)
        except (FileNotFoundError, CacheCorrupted):
            return None

    @staticmethod
    def _collect(folder: str, manifest: Manifest | None) -> None:
        """Under the version's lock: remove what ``manifest`` (None: no version) does not name
        and no reader pins: old builds, leftovers of killed publishers."""
        named = builds_named(manifest) if manifest is not None else set()
        try:
            entries = os.listdir(folder)
        except FileNotFoundError:
            return
        for entry in entries:
            path = os.path.join(folder, entry)
            if _is_build(entry) and entry not in named:
                with exclusively(build_pin_path(folder, entry)) as free:
                    if free:
                        shutil.rmtree(path, ignore_errors=True)
            elif entry.startswith(MANIFEST_NAME + ".") and entry.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    os.remove(path)
        if "" not in named and any(_is_flat_chunk(e) for e in entries):
            # Chunks of a yogadl_plus 0.1.0 build, in the version folder itself.
            with exclusively(build_pin_path(folder, "")) as free:
                if free:
                    for entry in [*entries, _PIN]:
                        if _is_flat_chunk(entry) or entry == _PIN:
                            with contextlib.suppress(OSError):
                                os.remove(os.path.join(folder, entry))
        if manifest is None:
            with contextlib.suppress(OSError):
                left = os.listdir(folder)
                if not left or left == [_PIN]:
                    shutil.rmtree(folder, ignore_errors=True)

    def _versions(self) -> Iterator[tuple[str, str]]:
        self._check_root()
        for dataset_id in os.listdir(self.root):
            folder = os.path.join(self.root, dataset_id)
            if "+" in dataset_id or not os.path.isdir(folder):
                continue
            for version in os.listdir(folder):
                if "+" not in version and os.path.isfile(
                    os.path.join(folder, version, MANIFEST_NAME)
                ):
                    yield dataset_id, version

    def delete(self, dataset_id: str, version: str) -> None:
        """Remove a published version; readers of it read on (see the module's docstring)."""
        self._check_root()  # the lock would make the folder again
        if not os.path.isdir(self.path(dataset_id, version)):
            # Nothing to unpublish nor to collect: no lock file is left for a version that never
            # was (the lock would make one).
            raise self._not_found(dataset_id, version)
        super().delete(dataset_id, version)

    def _remove(self, dataset_id: str, version: str) -> None:
        """Unpublish in one step (remove the manifest); builds go once nobody reads them."""
        folder = self.path(dataset_id, version)
        if not self._manifest_exists(dataset_id, version):
            self._check_root()
            self._collect(folder, None)  # what readers of a deleted version left
            raise self._not_found(dataset_id, version)
        os.remove(os.path.join(folder, MANIFEST_NAME))
        fsync_dir(folder)
        self._collect(folder, None)
        with contextlib.suppress(OSError):  # (not empty: a reader still reads its build)
            os.rmdir(folder)
        if not os.path.exists(folder):  # nothing of the version is left: nor its lock
            remove_lock(self.lock_path(dataset_id, version))

    def remove_discarded(self) -> None:
        """What discards killed half-way left (renamed away: nobody can read it)."""
        with contextlib.suppress(OSError):
            for dataset in os.scandir(self.root):
                if dataset.is_dir() and "+" not in dataset.name:
                    for entry in os.scandir(dataset.path):
                        if entry.name.startswith(_TRASH) and entry.is_dir():
                            shutil.rmtree(entry.path, ignore_errors=True)

    def discard(self, dataset_id: str, version: str) -> None:
        """Take a version's folder away in one rename, then delete it, pinned or not: for a
        caller that knows nobody reads it (a local cache's eviction), holding the lock."""
        parent = os.path.join(self.root, dataset_id)
        trash = os.path.join(parent, f"{_TRASH}{version}.{uuid.uuid4().hex[:12]}")
        os.rename(os.path.join(parent, version), trash)
        fsync_dir(parent)
        shutil.rmtree(trash, ignore_errors=True)


def default_storage() -> LocalStorage:
    """LocalStorage at $YOGADL_PLUS_HOME, or ~/.cache/yogadl_plus."""
    return LocalStorage(default_root())


def default_root() -> str:
    """The folder of ``default_storage()``: $YOGADL_PLUS_HOME, or ~/.cache/yogadl_plus."""
    return os.path.abspath(
        os.environ.get("YOGADL_PLUS_HOME")
        or os.path.join(os.path.expanduser("~"), ".cache", "yogadl_plus")
    )


def _drop_staging_files(staging: str) -> None:
    """What a staged build holds besides its chunks: its manifest (written again, naming the
    build folder) and its build's id (which the manifest names)."""
    os.remove(os.path.join(staging, MANIFEST_NAME))
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(staging, BUILD_FILE))


def _in_build(chunk: ChunkInfo, build: str) -> ChunkInfo:
    return dataclasses.replace(chunk, file=f"{build}/{chunk.file}")


def _unnamed(entry: str, named: set[str]) -> bool:
    """Whether a version folder's entry is (part of) a build that ``named`` leaves out."""
    if _is_build(entry):
        return entry not in named
    return _is_flat_chunk(entry) and "" not in named


def _is_build(entry: str) -> bool:
    return entry.startswith(_BUILD) and "." not in entry


def _is_flat_chunk(entry: str) -> bool:
    return entry.startswith("chunk-") and (entry.endswith(".mdb") or ".mdb." in entry)
