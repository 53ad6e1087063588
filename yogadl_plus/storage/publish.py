"""Publishing a build of a version in a bucket (the remote layout: remote.py).

Every build attempt uploads into its own ``<build>`` folder and names those files in its
manifest, so two builders (one of them cut off from its lease, say) never overwrite each
other's chunks, and the manifest's conditional write lets exactly one of them publish. Chunk
folders no manifest names are garbage of dead or beaten builders; the builder that publishes
removes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence

from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest
from yogadl_plus.errors import StorageError
from yogadl_plus.storage.lease import BuildLease
from yogadl_plus.storage.mirror import Mirror, RemoteManifest
from yogadl_plus.storage.objects import ObjectStore
from yogadl_plus.storage.parallel import in_threads

__all__ = ["BucketBuild", "BucketPublisher"]

OnTransfer = Callable[[int], object] | None


@dataclasses.dataclass(frozen=True)
class BucketBuild:
    """One build attempt of a version: its chunks go under ``<base><id>/`` in the bucket."""

    base: str  # "<dataset_id>/<version>/"
    id: str  # "b-<16 hex>", a new one per attempt

    @property
    def prefix(self) -> str:
        return f"{self.base}{self.id}/"


class BucketPublisher:
    """Publishes builds into ``objects``, moving at most ``threads`` objects at once. A build
    folder nobody has written to for ``lease_ttl`` seconds (server clock) is garbage once
    another build is published; a machine's build becomes its ``local_cache``'s copy."""

    def __init__(
        self, objects: ObjectStore, local_cache: Mirror, threads: int, lease_ttl: float
    ) -> None:
        self.objects = objects
        self.local_cache = local_cache
        self.threads = threads
        self.lease_ttl = lease_ttl

    def publish(
        self,
        folder: str,
        build: BucketBuild,
        replace: bool,
        lease: BuildLease,
        on_transfer: OnTransfer = None,
    ) -> None:
        """Upload the chunks built in ``folder`` (those tasks did not upload already) into
        ``build``'s remote folder and publish its manifest, unless ``lease`` was lost.
        ``on_transfer(bytes)`` is called after each chunk uploaded."""
        built = Manifest.read(folder)
        manifest_key = build.base + MANIFEST_NAME
        old = self.objects.token(manifest_key)
        if old is not None and not replace:
            return  # published by a builder that lost its lease to us: theirs stands
        if lease.lost:
            raise StorageError(
                f"{self.objects.url}/{lease.key}: this builder lost its build lease (it could "
                "not renew it for lease_ttl seconds) and another took over: nothing was "
                "published; fetch the version, or build again"
            )
        here = [c for c in built.chunks if "/" not in c.file]  # the rest: uploaded by tasks
        try:
            self.upload_chunks(folder, here, build.prefix, on_transfer)
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; the next builder collects it
                once = self.objects.retrying(self.objects.retries.at_most(0.0))
                for key in [k for k, _ in once.keys(build.prefix)]:
                    once.delete(key)
            raise
        manifest = dataclasses.replace(
            built,
            chunks=[
                c if "/" in c.file else dataclasses.replace(c, file=f"{build.id}/{c.file}")
                for c in built.chunks
            ],
        )
        body = manifest.to_json().encode()
        if not self._write_manifest(manifest_key, body, old):
            # Another build published first (only possible after we lost the lease): keep theirs.
            self.delete([k for k, _ in self.objects.keys(build.prefix)])
            return
        if not lease.lost:
            self.collect_garbage(build.base)
        if len(here) == len(built.chunks):
            remote = RemoteManifest(manifest.dataset_id, manifest.version, body, manifest)
            self.local_cache.adopt(remote, folder)

    def _write_manifest(self, key: str, body: bytes, old: str | None) -> bool:
        """Write the manifest ``body`` if the one there is still ``old`` (None: none is);
        whether it is ours now."""
        if old is None:
            won = self.objects.create(key, body)
        else:
            won = self.objects.replace(key, body, old)
        if won is None:
            # Our write may have landed while its reply was lost, and the retry was refused.
            found = self.objects.read(key)
            return found is not None and found[0] == body
        return True

    def upload_chunks(
        self, folder: str, chunks: Sequence[ChunkInfo], prefix: str, on_transfer: OnTransfer
    ) -> None:
        """Upload the chunk files of ``folder`` under ``prefix`` in parallel."""

        def one(info: ChunkInfo) -> None:
            path = os.path.join(folder, info.file)
            self.objects.upload(prefix + info.file, path)
            if on_transfer is not None:
                on_transfer(info.bytes)

        in_threads(one, list(chunks), self.threads)

    def collect_garbage(self, base: str) -> None:
        """Remove the build folders under ``base`` that the published manifest does not name
        and that nobody has written to for a whole lease_ttl (server clock): those of dead
        builders, of builders that lost the race, and of the version this build replaced."""
        listing = list(self.objects.keys(base))
        published = self.objects.read(base + MANIFEST_NAME)
        if published is None:
            return
        stamps = {k: t for k, t in listing if k == base + MANIFEST_NAME}
        now = stamps.get(base + MANIFEST_NAME, max((t for _, t in listing), default=0.0))
        live = {
            c.file.split("/", 1)[0]
            for c in Manifest.parse(published[0], base).chunks
            if "/" in c.file
        }
        newest: dict[str, float] = {}
        for key, modified in listing:
            rest = key[len(base) :]
            if "/" in rest:
                build = rest.split("/", 1)[0]
                newest[build] = max(newest.get(build, 0.0), modified)
        stale = {b for b, t in newest.items() if b not in live and now - t > self.lease_ttl}
        self.delete([k for k, _ in listing if k[len(base) :].split("/", 1)[0] in stale])

    def delete(self, keys: list[str]) -> None:
        """Delete these objects in parallel."""
        in_threads(self.objects.delete, keys, self.threads)
