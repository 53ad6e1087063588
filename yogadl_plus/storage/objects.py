"""The few object-store operations a remote storage needs, so S3 and GCS differ in one place.

Keys are relative to the storage's prefix. A *token* is what the store gives each written
object (an S3 ETag, a GCS generation): conditional writes compare it, so exactly one of two
racing writers wins, whatever the clocks say.

Every operation of a store rides out outages by itself (``@retried``): a try that fails
transiently (a refused or dropped connection, a timeout, a 5xx, throttling) is made again with
jittered exponential backoff until the store's ``Retries.timeout`` has passed, then the call
fails with a StorageError naming the URL and how long it tried. A conditional write whose reply
was lost is tried again too: the store then answers "already there" / "changed", and the caller
reads the object to learn whether the write that landed was its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from yogadl_plus.errors import CacheCorrupted, StorageError, TransientStorageError, YogaError
from yogadl_plus.storage.waiting import waiting_on

__all__ = [
    "DEFAULT_RETRY_TIMEOUT",
    "ObjectStore",
    "RangeSink",
    "Retries",
    "TransientStorageError",
    "again_if_damaged",
    "retried",
]

T = TypeVar("T")
S = TypeVar("S", bound="ObjectStore")

log = logging.getLogger(__name__)
# While a call keeps failing, a warning at its first retry and then about this often.
_WARN_EVERY = 30.0

DEFAULT_RETRY_TIMEOUT = 600.0  # seconds: a training run waits out a 5-minute outage, with room
MIN_TRY_TIMEOUT = 5.0  # a healthy server is never this long silent; a short budget stops here


@dataclasses.dataclass(frozen=True)
class Retries:
    """How long and how often a remote storage tries a call again while it fails transiently.

    A call is tried again, after a jittered exponential backoff (``first_delay`` doubling up to
    ``max_delay``), until ``timeout`` seconds have passed since its first try; then it fails
    with a StorageError. One try lasts at most about ``connect_timeout + read_timeout`` (the
    time to connect, and the longest silence while waiting for the server), both capped at
    ``timeout`` (but not below MIN_TRY_TIMEOUT) so that a short budget also notices a hung
    server early: a call gives up at most about ``timeout + sum(request_timeouts())`` after it
    started.
    """

    timeout: float = DEFAULT_RETRY_TIMEOUT
    first_delay: float = 0.2
    max_delay: float = 5.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            name = "retry_timeout" if field.name == "timeout" else field.name  # its keyword
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value >= 0)
            ):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")

    def at_most(self, seconds: float) -> Retries:
        """These settings, trying for no longer than ``seconds``."""
        return dataclasses.replace(self, timeout=min(self.timeout, seconds))

    def longest_call(self) -> float:
        """The most seconds a call takes before it gives up: ``timeout`` and one more try."""
        return self.timeout + sum(self.request_timeouts())

    def request_timeouts(self) -> tuple[float, float]:
        """(connect, read) timeouts of one try, in seconds."""
        cap = max(self.timeout, MIN_TRY_TIMEOUT)
        return min(self.connect_timeout, cap), min(self.read_timeout, cap)

    def call(
        self,
        attempt: Callable[[], T],
        interrupt: threading.Event | None = None,
        store: str | None = None,
    ) -> T:
        """``attempt()``, tried again while it raises TransientStorageError, until ``timeout``
        has passed (or ``interrupt`` is set); then StorageError saying how long it tried. While
        it fails, a WARNING at its first retry and then every 30 s; with ``store`` (its URL),
        one such warning for all the calls to that store that fail at the same time."""
        start = time.monotonic()
        tries = 0
        own = _Throttle()  # (a call of no named store speaks for itself)
        while True:
            tries += 1
            try:
                result = attempt()
            except TransientStorageError as exc:
                now = time.monotonic()
                left = self.timeout - (now - start)
                quiet = (own if store is None else _STORES).turn(store or "", now)
                if quiet is not None and left > 0:
                    others = f"; {quiet} other retries since the last warning" if quiet else ""
                    log.warning(
                        "%s: retrying (try %d, %.0f s so far, giving up after %g s%s)",
                        exc,
                        tries,
                        now - start,
                        self.timeout,
                        others,
                    )
                else:
                    log.debug("%s: retrying (try %d)", exc, tries)
                delay = min(self.max_delay, self.first_delay * 2 ** min(tries - 1, 30))
                delay = min(delay * (0.5 + random.random() / 2), max(left, 0.0))
                if interrupt is None:
                    time.sleep(delay)
                if left <= 0 or (interrupt is not None and interrupt.wait(delay)):
                    raise StorageError(
                        f"{exc} (gave up after {tries} {'try' if tries == 1 else 'tries'} in "
                        f"{time.monotonic() - start:.0f} s; retry_timeout={self.timeout:g} s)"
                    ) from exc
                continue
            if tries > 1:
                log.info("succeeded after %d tries in %.1f s", tries, time.monotonic() - start)
            return result


class _Throttle:
    """At most one warning every _WARN_EVERY seconds per key: eight fetches in flight through
    an outage would otherwise say the same thing eight times every 30 s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def turn(self, key: str, now: float) -> int | None:
        """None: stay quiet (counted); else warn now, and how many were quiet since the last."""
        with self._lock:
            if now - self._last.get(key, -math.inf) < _WARN_EVERY:
                self._quiet[key] = self._quiet.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._quiet.pop(key, 0)


# The warnings of the calls to each store (by its URL), in this process.
_STORES = _Throttle()


# Reads of an object whose bytes arrive failing the store's checksum, before the call fails.
DAMAGED_TRIES = 3


class _ArrivedDamaged(CacheCorrupted):
    """Bytes that failed the client's checksum on the way (``ObjectStore.arrived_damaged``)."""


# What each call of an ObjectStore does, as the lines said while it waits name it.
_DOING = {
    "token": "head",
    "read_range_into": "ranged read",
    "keys": "listing",
    "folders": "listing",
}


def retried(method: Callable[..., T]) -> Callable[..., T]:
    """An ObjectStore method made to ride out outages, under its store's ``retries``, and to
    say while it waits long what it waits on (storage/waiting.py): its first argument is the
    key (or prefix) of the object it works on."""
    doing = _DOING.get(method.__name__, method.__name__.strip("_"))

    @functools.wraps(method)
    def call(self: ObjectStore, *args: Any, **kwargs: Any) -> T:
        where = f"{self.url}/{args[0]}" if args and args[0] else self.url
        with waiting_on(self.url, f"{doing} of {where}"):
            return self.retries.call(
                lambda: method(self, *args, **kwargs), self.interrupt, store=self.url
            )

    return call


def again_if_damaged(method: Callable[..., T]) -> Callable[..., T]:
    """An ObjectStore read of a small whole object (a manifest, a lease) made again when its
    bytes arrive failing the store's checksum, up to DAMAGED_TRIES times in all. (Chunk
    downloads are checked, and made again, by their callers: storage/chunkdownload.py.)"""

    @functools.wraps(method)
    def call(self: ObjectStore, *args: Any, **kwargs: Any) -> T:
        for tries in range(1, DAMAGED_TRIES):
            try:
                return method(self, *args, **kwargs)
            except _ArrivedDamaged as exc:
                log.warning("%s: reading it again (%d of %d)", exc, tries, DAMAGED_TRIES)
        return method(self, *args, **kwargs)

    return call


class RangeSink(Protocol):
    """Where a ranged read writes the bytes it receives (``ObjectStore.read_range_into``)."""

    def seek(self, offset: int, whence: int = 0, /) -> int:
        """Back to the range's start (``seek(0)``): a try of the read begins."""
        ...

    def write(self, data: bytes, /) -> int:
        """The next bytes of the range."""
        ...


class ObjectStore(ABC):
    """One bucket and prefix of a remote object store.

    It travels to other processes (the tasks of a parallel build) by making its client again
    there: ``remake`` is (a picklable function returning a new client, the constructor's other
    arguments); it is None for a ready client the user passed, which cannot travel.

    Its operations are ``@retried`` under ``retries``; ``interrupt``, when set, ends the waits
    between tries early (see ``retrying``).
    """

    url: str  # "s3://bucket/prefix", for messages
    remake: tuple[Callable[[], Any], tuple[Any, ...]] | None = None
    retries: Retries = Retries()
    interrupt: threading.Event | None = None

    @classmethod
    def made(cls: type[S], client: Any, make_client: Callable[[], Any] | None, *args: Any) -> S:
        """``cls(client, *args)``, which travels to other processes by making its client
        there with ``make_client`` (None: ``client`` is a ready one the user passed)."""
        store = cls(client, *args)  # type: ignore[call-arg]
        if make_client is not None:
            store.remake = (make_client, args)
        return store

    def retrying(self, retries: Retries, interrupt: threading.Event | None = None) -> ObjectStore:
        """This store (the same client) with other retry settings, e.g. a build lease's,
        which retries no longer than the lease lasts and stops waiting when released."""
        view = object.__new__(type(self))  # not copy.copy: that would pickle (remake) it
        view.__dict__.update(vars(self))
        view.retries = retries
        view.interrupt = interrupt
        return view

    @contextlib.contextmanager
    def _errors(self, what: str, key: str = "", **context: Any) -> Iterator[None]:
        """The client's failures as StorageError naming the URL and what to check (see
        ``_failure``); those worth another try (see ``retried``) as TransientStorageError."""
        where = f"{self.url}/{key}" if key else self.url
        try:
            yield
        except YogaError:
            raise
        except Exception as exc:  # anything from the client, named by its URL
            raise self._failure(exc, what, where, **context) from exc

    @abstractmethod
    def _failure(self, exc: Exception, what: str, where: str, **context: Any) -> YogaError:
        """The StorageError (TransientStorageError when worth another try) for a client's
        failure during ``what`` on ``where``; CacheCorrupted for bytes that failed the
        client's own checksum (``arrived_damaged``)."""

    @staticmethod
    def arrived_damaged(where: str, exc: Exception) -> CacheCorrupted:
        """A download whose bytes do not match the checksum the store sent with them: read
        again a few times (``again_if_damaged``, chunkdownload.py), not for ``retry_timeout``:
        an object damaged in the bucket gives the same bytes every time."""
        detail = " ".join(str(exc).split())
        return _ArrivedDamaged(
            f"{where}: the bytes that arrived fail the store's checksum: {detail}"
        )

    @staticmethod
    def _cut_off_or_failed(
        exc: Exception, what: str, where: str, cut_off: tuple[type[BaseException], ...]
    ) -> StorageError:
        """The last word of ``_failure``: a call whose connection was cut off (the client's
        ``cut_off`` errors, or Python's own) is worth another try; anything else is a
        StorageError naming the error."""
        if isinstance(exc, (*cut_off, ConnectionError, TimeoutError)):
            return TransientStorageError(f"{where}: {what} was cut off: {exc}")
        return StorageError(f"{where}: {what} failed: {type(exc).__name__}: {exc}")

    def gone(self, key: str) -> StorageError:
        """The error for object ``key``, which vanished under a download."""
        return StorageError(
            f"{self.url}/{key}: the object is gone (was the version replaced or deleted while "
            "it was pulled?)"
        )

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
    def read_range_into(self, key: str, start: int, stop: int, out: RangeSink) -> None:
        """Bytes ``start`` to ``stop`` (exclusive) of object ``key`` written into ``out`` as
        they arrive, in pieces, fewer where the object is shorter (none past its end); each try
        begins with ``out.seek(0)``, so that one cut off midway is written over by the next.
        StorageError if the object is gone."""

    @abstractmethod
    def keys(self, prefix: str) -> list[tuple[str, float]]:
        """(key, last modified as a POSIX time on the server's clock) of every key under
        ``prefix``, recursively (a listing cut off midway is tried again from its start)."""

    @abstractmethod
    def folders(self, prefix: str) -> list[str]:
        """The names of the "folders" directly under ``prefix`` (which ends with '/')."""

    @abstractmethod
    def check(self) -> None:
        """Raise StorageError naming the URL and what to check if the bucket cannot be used."""


def _remade(
    cls: type[ObjectStore], make_client: Callable[[], Any], args: tuple[Any, ...]
) -> ObjectStore:
    return cls.made(make_client(), make_client, *args)
