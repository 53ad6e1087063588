"""The few object-store operations a remote storage needs, so S3 and GCS differ in one place.

Keys are relative to the storage's prefix. A *token* is what the store gives each written
object (an S3 ETag, a GCS generation): conditional writes compare it, so exactly one of two
racing writers wins, whatever the clocks say.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from yogadl_plus.errors import StorageError, YogaError

__all__ = ["ObjectStore", "TransientStorageError", "object_gone", "with_retries"]

T = TypeVar("T")


class TransientStorageError(StorageError):
    """A failure worth retrying: a dropped connection, a 5xx, throttling."""


def object_gone(url: str, key: str) -> StorageError:
    """The error for an object that vanished under a download."""
    return StorageError(
        f"{url}/{key}: the object is gone (was the version replaced or deleted while it was "
        "pulled?)"
    )


class ObjectStore(ABC):
    """One bucket and prefix of a remote object store.

    It travels to other processes (the tasks of a parallel build) by making its client again
    there: ``remake`` is (a picklable function returning a new client, the constructor's other
    arguments); it is None for a ready client the user passed, which cannot travel.
    """

    url: str  # "s3://bucket/prefix", for messages
    remake: tuple[Callable[[], Any], tuple[Any, ...]] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        if self.remake is None:
            raise YogaError(
                f"{self.url}: this storage was made with a ready client (client=), which cannot "
                "be sent to build tasks in other processes; make it without client= (endpoint "
                "and credentials as keywords, or from the environment) to build on workers"
            )
        return (_remade, (type(self), *self.remake))

    @abstractmethod
    def read(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and token, or None if there is no such object."""

    @abstractmethod
    def token(self, key: str) -> str | None:
        """The object's token, or None if there is no such object."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> str | None:
        """Write ``key`` only if it does not exist: its token, or None if it already existed."""

    @abstractmethod
    def replace(self, key: str, data: bytes, token: str) -> str | None:
        """Overwrite ``key`` only if its token is still ``token``: the new token, else None."""

    @abstractmethod
    def delete(self, key: str, token: str | None = None) -> None:
        """Remove ``key`` (only if its token is still ``token``, when given); absent is fine."""

    @abstractmethod
    def upload(self, key: str, path: str) -> None:
        """Write the local file ``path`` as ``key`` (multipart when large)."""

    @abstractmethod
    def download(self, key: str, path: str) -> None:
        """Write object ``key`` into the local file ``path`` (ranged in parallel when the client
        can); StorageError if the object is gone."""

    @abstractmethod
    def keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(key, last modified as a POSIX time on the server's clock) of every key under
        ``prefix``, recursively."""

    @abstractmethod
    def folders(self, prefix: str) -> list[str]:
        """The names of the "folders" directly under ``prefix`` (which ends with '/')."""

    @abstractmethod
    def check(self) -> None:
        """Raise StorageError naming the URL and what to check if the bucket cannot be used."""


def _remade(
    cls: type[ObjectStore], make_client: Callable[[], Any], args: tuple[Any, ...]
) -> ObjectStore:
    store = cls(make_client(), *args)  # type: ignore[call-arg]
    store.remake = (make_client, args)
    return store


def with_retries(call: Callable[[], T], attempts: int = 5, base_delay: float = 0.2) -> T:
    """``call()``, retried with jittered exponential backoff while it fails transiently."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            if attempt == attempts - 1 or not isinstance(exc, TransientStorageError):
                raise
            time.sleep(base_delay * 2**attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")
