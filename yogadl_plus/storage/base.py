"""What every storage does with versions: validate names, build each version once, publish it
whole, and hand out DataRefs. Subclasses say where the bytes live."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.cache.version_writer import build_of, write_version
from yogadl_plus.checks import check_name

if TYPE_CHECKING:
    from yogadl_plus.dataref import DataRef
    from yogadl_plus.storage.sink import ChunkSink

__all__ = ["OnTransfer", "Storage", "check_name"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
# Called with a chunk's size in bytes after each chunk a storage uploads or downloads.
OnTransfer = Callable[[int], object] | None


class Storage(ABC):
    """A place where versioned caches live; see LocalStorage."""

    # --- what a concrete storage provides ---

    @abstractmethod
    def _manifest_exists(self, dataset_id: str, version: str) -> bool: ...

    @abstractmethod
    def _open(self, dataset_id: str, version: str, on_transfer: OnTransfer = None) -> DataRef:
        """The DataRef of a published version; DatasetNotFound if there is none.
        ``on_transfer(bytes)``: called after each chunk downloaded to open it (if any)."""

    @abstractmethod
    def _builder_lock(
        self, dataset_id: str, version: str
    ) -> contextlib.AbstractContextManager[Any]:
        """Held by the one builder of (dataset_id, version), across threads, processes, machines.
        Yields what ``_staging`` is handed as ``lock``: a bucket's build lease (which can be
        lost), or None (a file lock, which cannot)."""

    @abstractmethod
    def _staging(
        self, dataset_id: str, version: str, replace: bool, lock: Any, on_transfer: OnTransfer
    ) -> contextlib.AbstractContextManager[str]:
        """A private local folder to build into; published whole when the block ends cleanly.
        ``lock``: what ``_builder_lock`` yielded, held around the whole block.
        ``on_transfer(bytes)``: called after each chunk uploaded to publish it (if any)."""

    @abstractmethod
    def _versions(self) -> Iterator[tuple[str, str]]: ...

    @abstractmethod
    def _remove(self, dataset_id: str, version: str) -> None: ...

    # --- the public face (docs/api.md#storage) ---

    def fetch(self, dataset_id: str, version: str) -> DataRef:
        """The DataRef of a published version; raises DatasetNotFound if it is not there."""
        return self._open(check_name("dataset_id", dataset_id), check_name("version", version))

    def list(self) -> list[tuple[str, str]]:
        """Every published (dataset_id, version), sorted."""
        return sorted(self._versions())

    def delete(self, dataset_id: str, version: str) -> None:
        """Remove a published version; raises DatasetNotFound if it is not there."""
        check_name("dataset_id", dataset_id)
        check_name("version", version)
        with self._builder_lock(dataset_id, version):
            self._remove(dataset_id, version)

    def verify(self, dataset_id: str, version: str) -> None:
        """Re-check every chunk's checksum; raises CacheCorrupted naming the first bad chunk."""
        self.fetch(dataset_id, version).verify()

    def cacheable(self, dataset_id: str, version: str) -> Callable[[F], Callable[..., DataRef]]:
        """Decorator: the function makes a source, and runs only when the version is missing."""
        check_name("dataset_id", dataset_id)
        check_name("version", version)

        def decorate(make_source: F) -> Callable[..., DataRef]:
            @functools.wraps(make_source)
            def cached(*args: Any, **kwargs: Any) -> DataRef:
                return self.get_or_build(
                    dataset_id,
                    version,
                    lambda directory: write_version(
                        directory, make_source(*args, **kwargs), dataset_id, version
                    ),
                )

            return cached

        return decorate

    # --- the build protocol used by cache_dataset ---

    def chunk_sink(self, folder: str, distributed: bool) -> ChunkSink:
        """Where the tasks of a parallel build building into staging ``folder`` put their
        chunks. ``distributed``: the tasks may run on other machines (Ray), which then need to
        see ``folder`` (a local storage's root on a shared filesystem)."""
        from yogadl_plus.storage.sink import FolderSink

        return FolderSink(folder)

    def get_or_build(
        self,
        dataset_id: str,
        version: str,
        build: Callable[[str], Manifest],
        *,
        overwrite: bool = False,
        on_transfer: OnTransfer = None,
    ) -> DataRef:
        """The version, built by ``build(folder)`` first if it is missing (or ``overwrite``).

        Only one caller builds; the others wait for the lock and then read what it published.
        ``on_transfer(bytes)``: called after each chunk a remote storage uploads or downloads
        meanwhile (for a progress bar), from the transfer threads.
        """
        check_name("dataset_id", dataset_id)
        check_name("version", version)
        if not overwrite and self._manifest_exists(dataset_id, version):
            return self._open(dataset_id, version, on_transfer)
        with self._builder_lock(dataset_id, version) as lock:
            exists = self._manifest_exists(dataset_id, version)
            if exists and not overwrite:
                return self._open(dataset_id, version, on_transfer)
            began = time.monotonic()
            with self._staging(dataset_id, version, exists, lock, on_transfer) as folder:
                build_of(folder)  # the build's id, there before any of its tasks writes a chunk
                manifest = build(folder)
            log.info(
                "%s %s:%s in %s: %s records, %s bytes, %.1f s",
                "overwrote" if exists else "built",
                dataset_id,
                version,
                self,
                f"{manifest.num_records:,}",
                f"{sum(c.bytes for c in manifest.chunks):,}",
                time.monotonic() - began,
            )
        return self._open(dataset_id, version, on_transfer)
