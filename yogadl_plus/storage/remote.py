"""Versions in an object store (S3, GCS), pulled into a local cache and read at local speed,
or read on demand through it when they do not fit (see ondemand.py).

Remote layout, under the storage's prefix::

    <dataset_id>/<version>/manifest.json           written last, with a conditional write
    <dataset_id>/<version>/lease.json              the build lease (see lease.py)
    <dataset_id>/<version>/<build>/chunk-00000.mdb the chunks of one build attempt

A version exists once its manifest exists. Every build attempt uploads into its own ``<build>``
folder and names those files in its manifest, so two builders (one of them cut off from its
lease, say) never overwrite each other's chunks, and the manifest's conditional write lets
exactly one of them publish. Chunk folders no manifest names are garbage of dead or beaten
builders; the next builder of the version removes them (see publish.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from yogadl_plus.cache.manifest import MANIFEST_NAME, Manifest
from yogadl_plus.cache.version_writer import build_of
from yogadl_plus.checks import check_int
from yogadl_plus.dataref import DataRef, DataRefOnDemand
from yogadl_plus.errors import CacheCorrupted, DatasetNotFound, StorageError
from yogadl_plus.storage.base import OnTransfer, Storage, check_name
from yogadl_plus.storage.chunkdownload import download_chunks
from yogadl_plus.storage.lease import BuildLease
from yogadl_plus.storage.local import default_storage, is_leftover
from yogadl_plus.storage.manifestshare import forget, read_once_per_machine
from yogadl_plus.storage.mirror import Mirror, RemoteManifest
from yogadl_plus.storage.objects import DEFAULT_RETRY_TIMEOUT, ObjectStore, Retries
from yogadl_plus.storage.ondemand import ChunkFetcher, DemandSettings, check_fits
from yogadl_plus.storage.publish import BucketBuild, BucketPublisher
from yogadl_plus.storage.sink import ChunkSink, UploadSink

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_RETRY_TIMEOUT",
    "DEFAULT_TRANSFERS",
    "RemoteSettings",
    "RemoteStorage",
    "check_location",
]

LEASE_NAME = "lease.json"
DEFAULT_LEASE_TTL = 60.0
DEFAULT_TRANSFERS = 8
_PULL_ATTEMPTS = 3
_BUILD = "+build."


@dataclasses.dataclass(frozen=True)
class RemoteSettings:
    """What a bucket storage is made with besides its bucket and client: where its local
    copies go (``local_cache``; None: a folder of the default storage's root) and how many
    bytes of chunks they may hold (``local_cache_limit``; None: no limit), how long a build
    lease lives unrenewed (``lease_ttl`` seconds), how many objects move at once
    (``max_transfers``), and how long each call keeps trying while the store fails
    transiently (``retry_timeout`` seconds, then a StorageError)."""

    local_cache: str | os.PathLike[str] | None = None
    local_cache_limit: int | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    max_transfers: int = DEFAULT_TRANSFERS
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    #: How each call of the store tries again (within ``retry_timeout``).
    retries: Retries = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "retries", Retries(timeout=self.retry_timeout))
        if not self.lease_ttl > 0:
            raise ValueError(f"lease_ttl must be > 0 seconds, got {self.lease_ttl!r}")
        set_(self, "max_transfers", check_int("max_transfers", self.max_transfers, 1))


class RemoteStorage(Storage):
    """What S3Storage and GCSStorage share: everything but the client calls (an ObjectStore).

    ``connect(bucket, prefix, retries)``: the store of the checked bucket and prefix (its
    client made, where the subclass makes one)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        connect: Callable[[str, str, Retries], ObjectStore],
        settings: RemoteSettings,
    ) -> None:
        self.bucket, self.prefix = check_location(bucket, prefix)
        objects = connect(self.bucket, self.prefix, settings.retries)
        self.objects = objects
        self.url = objects.url
        local_cache = settings.local_cache
        if local_cache is None:
            local_cache = os.path.join(default_storage().root, "+remote", _url_folder(self.url))
        self.local_cache = Mirror(os.fspath(local_cache), settings.local_cache_limit)
        self.lease_ttl = float(settings.lease_ttl)
        self.max_transfers = settings.max_transfers
        self.publisher = BucketPublisher(
            objects, self.local_cache, self.max_transfers, self.lease_ttl
        )
        self._bucket_checked = False
        # The builds being staged here, by staging folder (chunk_sink looks them up).
        self._staged: dict[str, BucketBuild] = {}
        self._staged_lock = threading.Lock()

    def _check_bucket(self) -> None:
        """Fail early, naming the URL, if the bucket is missing or closed to us (some stores
        would otherwise create a bucket on the first write)."""
        if not self._bucket_checked:
            self.objects.check()
            self._bucket_checked = True

    def get_or_build(self, dataset_id: str, version: str, build: Any, **options: Any) -> DataRef:
        self._check_bucket()
        return super().get_or_build(dataset_id, version, build, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, local_cache={self.local_cache.root!r})"

    # --- keys ---

    @staticmethod
    def _key(dataset_id: str, version: str, name: str = "") -> str:
        return f"{dataset_id}/{version}/{name}"

    # --- reading ---

    def _manifest_exists(self, dataset_id: str, version: str) -> bool:
        key = self._key(dataset_id, version, MANIFEST_NAME)
        return self.objects.token(key) is not None

    def _read_manifest(
        self, dataset_id: str, version: str, shared: bool = False
    ) -> tuple[bytes, Manifest]:
        """The version's manifest in the bucket (its bytes, parsed); ``shared``: downloaded once
        for the processes of this machine (storage/manifestshare.py)."""
        key = self._key(dataset_id, version, MANIFEST_NAME)

        def read() -> tuple[bytes, str]:
            found = self.objects.read(key)
            if found is None:
                raise DatasetNotFound(
                    f"no version {version!r} of dataset {dataset_id!r} in {self.url}; "
                    f"published: {self.list() or 'none'}"
                )
            return found

        where = f"{self.url}/{key}"

        def parsed(data: bytes) -> Manifest:
            manifest = Manifest.parse(data, where)
            if (manifest.dataset_id, manifest.version) != (dataset_id, version):
                raise CacheCorrupted(
                    f"{where} describes {manifest.dataset_id}:{manifest.version}, "
                    f"not {dataset_id}:{version}"
                )
            return manifest

        if not shared:
            data = read()[0]
            return data, parsed(data)
        return read_once_per_machine(
            self.local_cache.root,
            (dataset_id, version),
            where,
            read,
            lambda: self.objects.token(key),
            parsed,
        )

    def fetch(
        self,
        dataset_id: str,
        version: str,
        *,
        shards: tuple[int, int] | None = None,
        on_demand: bool | None = None,
        on_transfer: OnTransfer = None,
    ) -> DataRef:
        """The version, pulled into the local cache first unless the local copy is current,
        or read on demand through the cache when it does not fit.

        ``shards=(rank, num_shards)`` pulls only the chunks ``rank, rank + num_shards, ...``:
        what ``stream(shard_by="chunks", shard_rank=rank, num_shards=num_shards)`` reads.
        ``on_demand``: None (the default) reads on demand exactly when the chunks to pull
        exceed ``local_cache_limit``; True always does, pulling nothing now; False always
        pulls first (over the limit, with a CacheLimitWarning). Reading on demand, chunks
        are fetched when a read needs them or ahead of a stream's reads, kept in the local
        cache and evicted least recently used, never while in use (docs/storage/remote.md).
        ``on_transfer(bytes)``: called after each chunk downloaded, now or, reading on demand,
        later (for a progress bar), from the transfer threads.
        """
        check_name("dataset_id", dataset_id)
        check_name("version", version)
        if on_demand not in (None, True, False):
            raise ValueError(f"on_demand must be None, True or False, got {on_demand!r}")
        return self._pull(dataset_id, version, shards, on_demand, on_transfer)

    def verify(self, dataset_id: str, version: str) -> None:
        """Check the local copy against the manifest; a damaged one is pulled again (every
        download is sha256-checked), so CacheCorrupted means the remote version is damaged."""
        if self._local_copy_is_whole(dataset_id, version):
            return
        self.local_cache.remove(dataset_id, version)
        self.fetch(dataset_id, version).verify()

    def _local_copy_is_whole(self, dataset_id: str, version: str) -> bool:
        """Whether the local copy (pulled first if missing) has every chunk's checksum; the
        DataRef, and its pin, are gone when this returns, so a damaged copy can be dropped."""
        try:
            dataref = self.fetch(dataset_id, version)
            try:
                dataref.verify()
            finally:
                dataref.close()
        except CacheCorrupted:
            return False
        return True

    def _open(self, dataset_id: str, version: str, on_transfer: OnTransfer = None) -> DataRef:
        return self._pull(dataset_id, version, None, None, on_transfer)

    def _pull(
        self,
        dataset_id: str,
        version: str,
        shards: tuple[int, int] | None,
        on_demand: bool | None,
        on_transfer: OnTransfer,
    ) -> DataRef:
        base = self._key(dataset_id, version)
        for attempt in range(_PULL_ATTEMPTS):
            data, manifest = self._read_manifest(dataset_id, version, shared=True)
            wanted = _shard_chunks(len(manifest.chunks), shards)
            limit = self.local_cache.limit
            if on_demand or (
                on_demand is None
                and limit is not None
                and sum(manifest.chunks[n].bytes for n in wanted) > limit
            ):
                remote = RemoteManifest(dataset_id, version, data, manifest)
                return self._open_on_demand(remote, on_transfer)
            try:
                folder, pins = self.local_cache.sync(
                    RemoteManifest(dataset_id, version, data, manifest),
                    wanted,
                    lambda jobs: download_chunks(
                        self.objects, base, jobs, self.max_transfers, on_transfer
                    ),
                )
            except (StorageError, CacheCorrupted):
                # Rebuilt (overwrite=True) while we pulled? Then its old chunks are going away:
                # pull the new version. Otherwise the error, naming the chunk, stands.
                if attempt == _PULL_ATTEMPTS - 1 or not self._replaced(dataset_id, version, data):
                    raise
                continue
            # The pins are held while the DataRef (or a copy in a worker) lives.
            return DataRef(folder, manifest, hold=pins)
        raise AssertionError("unreachable")

    def _replaced(self, dataset_id: str, version: str, data: bytes) -> bool:
        """Whether the version's manifest in the bucket is no longer ``data`` (rebuilt or
        removed meanwhile). One try: the store has just failed a pull, and waiting on it again
        for retry_timeout would only put off the error that names what failed; no answer is
        taken for "not replaced"."""
        once = self.objects.retrying(self.objects.retries.at_most(0.0))
        try:
            found = once.read(self._key(dataset_id, version, MANIFEST_NAME))
        except (StorageError, CacheCorrupted):
            return False
        return found is None or found[0] != data

    def _open_on_demand(self, remote: RemoteManifest, on_transfer: OnTransfer) -> DataRef:
        """The version read on demand through the local cache (nothing pulled now)."""
        dataset_id, version, manifest = remote.dataset_id, remote.version, remote.manifest
        base = self._key(dataset_id, version)
        check_fits(manifest.chunks, self.local_cache.limit, f"{self.url}/{base}")
        folder, pins = self.local_cache.open_on_demand(remote)
        settings = DemandSettings.for_cache(
            self.local_cache.limit, self.max_transfers, wait_s=self._others_wait_s()
        )
        fetcher = ChunkFetcher(
            self.objects,
            self.local_cache,
            folder,
            base,
            manifest.chunks,
            settings,
            (dataset_id, version),
            on_fetch=on_transfer,
        )
        return DataRefOnDemand(folder, manifest, pins, fetcher)

    def _others_wait_s(self) -> float:
        """How long a process waits for another of its machine fetching a chunk from the
        bucket before it calls that one stuck: two of its calls, and some."""
        return 2 * self.objects.retries.longest_call() + 60.0

    def _versions(self) -> Iterator[tuple[str, str]]:
        self._check_bucket()
        for dataset_id in self.objects.folders(""):
            if not _valid_name(dataset_id):
                continue
            for version in self.objects.folders(dataset_id + "/"):
                if _valid_name(version) and self._manifest_exists(dataset_id, version):
                    yield dataset_id, version

    # --- building and publishing ---

    def _builder_lock(self, dataset_id: str, version: str) -> BuildLease:
        """The version's build lease (yielded as itself: _publish checks it was not lost)."""
        return BuildLease(self.objects, self._key(dataset_id, version, LEASE_NAME), self.lease_ttl)

    @contextlib.contextmanager
    def _staging(
        self,
        dataset_id: str,
        version: str,
        replace: bool,
        lock: BuildLease,
        on_transfer: OnTransfer,
    ) -> Iterator[str]:
        """Build into a local folder; then upload it as a new build and publish its manifest."""
        cache_parent = os.path.join(self.local_cache.root, dataset_id)
        os.makedirs(cache_parent, exist_ok=True)
        # We hold the lease: a build folder of this version left here is a dead builder's.
        for entry in os.listdir(cache_parent):
            if is_leftover(entry, version, (_BUILD,)):
                shutil.rmtree(os.path.join(cache_parent, entry), ignore_errors=True)
        folder = os.path.join(cache_parent, f"{_BUILD}{version}.{uuid.uuid4().hex[:12]}")
        os.makedirs(folder)
        # The remote folder of this build, known before it starts (tasks may upload into it).
        build = BucketBuild(self._key(dataset_id, version), f"b-{uuid.uuid4().hex[:16]}")
        with self._staged_lock:
            self._staged[folder] = build
        try:
            yield folder
            self.publisher.publish(folder, build, replace, lock, on_transfer)
        finally:
            with self._staged_lock:
                del self._staged[folder]
            shutil.rmtree(folder, ignore_errors=True)

    def chunk_sink(self, folder: str, distributed: bool) -> ChunkSink:
        """Pool tasks on this machine write into the staging folder (then uploaded and adopted
        as the local copy); distributed tasks upload their chunks into the build themselves."""
        if not distributed:
            return super().chunk_sink(folder, distributed)
        with self._staged_lock:
            build = self._staged.get(folder)
        if build is None:
            raise ValueError(f"{folder} is not the staging folder of a build of {self.url}")
        return UploadSink(self.objects, build.base, build.id, build_of(folder))

    def _remove(self, dataset_id: str, version: str) -> None:
        manifest_key = self._key(dataset_id, version, MANIFEST_NAME)
        if self.objects.token(manifest_key) is None:
            raise DatasetNotFound(f"no version {version!r} of dataset {dataset_id!r} in {self.url}")
        # The manifest goes first: from then on the version does not exist for anyone.
        self.objects.delete(manifest_key)
        base = self._key(dataset_id, version)
        self.publisher.delete([k for k, _ in self.objects.keys(base) if not k.endswith(LEASE_NAME)])
        self.local_cache.remove(dataset_id, version)
        forget(self.local_cache.root, (dataset_id, version))


def _shard_chunks(num_chunks: int, shards: tuple[int, int] | None) -> list[int]:
    if shards is None:
        return list(range(num_chunks))
    try:
        rank, count = shards
    except (TypeError, ValueError):
        raise ValueError(f"shards must be (rank, num_shards), got {shards!r}") from None
    count = check_int("num_shards", count, 1)
    rank = check_int("shard_rank", rank, 0, count - 1)
    return list(range(rank, num_chunks, count))


def _valid_name(name: str) -> bool:
    try:
        check_name("name", name)
    except ValueError:
        return False
    return True


def _url_folder(url: str) -> str:
    """A folder name for a remote URL: readable, and distinct for distinct URLs."""
    readable = "".join(c if c.isalnum() or c in "._-" else "_" for c in url)[:80]
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


def check_location(bucket: object, prefix: object) -> tuple[str, str]:
    """(bucket, prefix as '' or 'a/b/'), or ValueError for a bad bucket name, a '.' or '..'
    segment in the prefix."""
    if not isinstance(bucket, str) or not bucket or "/" in bucket:
        raise ValueError(f"bucket must be a bucket name (no '/'), got {bucket!r}")
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, got {prefix!r}")
    parts = [p for p in prefix.strip("/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"prefix {prefix!r} must not contain '.' or '..' segments")
    return bucket, "".join(p + "/" for p in parts)
