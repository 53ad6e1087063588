"""The files of a machine's local cache of remote versions, by name, and how a process waits
for the lock on one.

Layout (a LocalStorage folder): ``<root>/<id>/<version>/`` holds the remote manifest's exact
bytes and the chunk files it names, mirrored (``b-<build>/chunk-00000.mdb``). Every process
reading the copy holds a shared ``flock`` (see pins.py; the kernel drops it when a process dies,
even by SIGKILL) on ``<root>/<id>/+pin.<version>``, whose mtime records the last use for
least-recently-used eviction, and on ``b-<build>/+pin`` of each build it reads: a copy is evicted
only when nobody reads it, and a build the manifest no longer names once nobody reads that build.

A version read on demand (storage/ondemand.py) is a copy with only some chunks present. Its
readers hold ``<root>/<id>/+demand.<version>`` instead of the copy's pin (the copy is not
evicted as a whole while read, but its chunks may be), and each chunk they have open by a pin
beside it (``chunk-00000.mdb.pin``, its mtime the chunk's last use), each chunk fetched ahead
of a reader by a softer one (``chunk-00000.mdb.ahead``: fetches ahead never evict it, a
reader that finds no other room does);
``chunk-00000.mdb.lock`` makes one process fetch a chunk while the others wait, and the
fetch writes into ``chunk-00000.mdb.fetching``, made at its full size first. Downloads of a
whole copy go to ``chunk-00000.mdb.part`` first. Making room (under ``<root>/+lock.space``, so
that the processes of a machine count together) is eviction.py's.

The cache's limit counts the bytes of chunks (``holds_chunk_bytes``): a chunk of exactly the
limit fits. The bookkeeping beside them (manifests, stamps, pins, locks: a few hundred bytes a
chunk, and each copy's manifest) is not counted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from filelock import FileLock, Timeout

from yogadl_plus.errors import StorageError

__all__ = [
    "AHEAD_PIN",
    "CHUNK_LOCK",
    "CHUNK_PIN",
    "FETCHING",
    "PART",
    "POLL_S",
    "SPACE_LOCK",
    "copy_pin_path",
    "demand_pin_path",
    "holding",
    "holds_chunk_bytes",
]

# Beside each chunk file: its reader's pin, its fetch-ahead pin, the lock of the one fetching
# it, and the file being fetched.
CHUNK_PIN = ".pin"
AHEAD_PIN = ".ahead"
CHUNK_LOCK = ".lock"
FETCHING = ".fetching"
# A chunk file of a whole copy being downloaded.
PART = ".part"
# In the root: the machine's lock on the cache's size.
SPACE_LOCK = "+lock.space"
# How often a waiter for a lock held briefly (space) or by a fetch (a chunk) tries it again.
POLL_S = 0.002

_COPY_PIN = "+pin."
_DEMAND_PIN = "+demand."


def holds_chunk_bytes(name: str) -> bool:
    """Whether the cache's file ``name`` holds a chunk's bytes, which its limit counts: a chunk,
    one being fetched or pulled, or the download client's temporary file of one."""
    return name.endswith((".mdb", ".mdb" + FETCHING)) or ".mdb" + PART in name


def copy_pin_path(root: str, dataset_id: str, version: str) -> str:
    """The pin every reader of the whole copy of (dataset_id, version) holds."""
    return os.path.join(root, dataset_id, _COPY_PIN + version)


def demand_pin_path(root: str, dataset_id: str, version: str) -> str:
    """The pin every reader of (dataset_id, version) on demand holds."""
    return os.path.join(root, dataset_id, _DEMAND_PIN + version)


@contextlib.contextmanager
def holding(lock_file: str, timeout: float, stuck: str) -> Iterator[None]:
    """Hold the lock ``lock_file`` for the block (a fresh one per call, so that threads
    exclude each other too), waiting for it at most ``timeout`` seconds; then a StorageError
    saying ``stuck``: what holds it, and what to do."""
    lock = FileLock(lock_file, thread_local=False)
    try:
        lock.acquire(timeout=timeout, poll_interval=POLL_S)
    except Timeout:
        raise StorageError(stuck) from None
    try:
        yield
    finally:
        lock.release()
