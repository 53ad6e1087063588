"""The build lease: one builder of a version across machines, through one object in the bucket.

Taking the lease is a conditional create (S3 ``If-None-Match: *``, GCS
``if_generation_match=0``); the holder rewrites it every ``ttl / 3`` seconds. A waiter watches
the lease's token with its own monotonic clock: a lease whose token has not changed for ``ttl``
seconds belongs to a dead (or cut off) holder, and the waiter takes it over with a conditional
replace on that token, so of several waiters exactly one wins. No clocks are compared between
machines.

Every call rides out outages (the store's retries): taking the lease for the store's whole
retry_timeout, each renewal for at most ``ttl`` (after that a waiter may have taken over; the
holder warns and tries again at the next beat), releasing it briefly (an unreleased lease
expires after ``ttl``). An outage shorter than ``ttl`` loses nothing.

The lease saves duplicate work; it is not what keeps a version whole. A holder that was cut off
and lost its lease may still finish: its chunks live under its own build folder, and the
manifest is published with a conditional write, so one build wins and nothing is mixed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
import time
import uuid
import warnings
from types import TracebackType

from yogadl_plus.errors import StorageError
from yogadl_plus.storage.objects import ObjectStore

__all__ = ["BuildLease"]


class BuildLease:
    """``with BuildLease(store, key, ttl):`` holds the lease ``key`` for the block."""

    def __init__(self, store: ObjectStore, key: str, ttl: float, poll: float | None = None) -> None:
        self.store = store
        self.key = key
        self.ttl = float(ttl)
        self.poll = poll if poll is not None else min(1.0, self.ttl / 10)
        self.holder = uuid.uuid4().hex
        self.lost = False
        self._token: str | None = None
        self._beat = 0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._token_lock = threading.Lock()

    def _body(self) -> bytes:
        self._beat += 1
        return json.dumps(
            {
                "holder": self.holder,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ttl_s": self.ttl,
                "beat": self._beat,
            }
        ).encode()

    def __enter__(self) -> BuildLease:
        seen: tuple[str, float] | None = None  # (token, when we first saw it)
        while True:
            token = self.store.create(self.key, self._body())
            if token is None:
                token = self._ours(self.store)  # our create landed but its reply was lost
            if token is None:
                current = self.store.token(self.key)
                now = time.monotonic()
                if current is None:
                    continue  # released between our two calls: try again at once
                if seen is None or seen[0] != current:
                    seen = (current, now)
                elif now - seen[1] > self.ttl:
                    # Silent for a whole ttl: its holder is gone. One taker wins the replace.
                    token = self.store.replace(self.key, self._body(), current)
                    seen = None
            if token is not None:
                self._token = token
                self._renewer = threading.Thread(
                    target=self._renew, name=f"yogadl_plus lease {self.key}", daemon=True
                )
                self._renewer.start()
                return self
            time.sleep(self.poll * (0.5 + random.random()))

    def _ours(self, store: ObjectStore) -> str | None:
        """The lease's token if the lease in the bucket is ours, else None."""
        found = store.read(self.key)
        if found is None:
            return None
        try:
            holder = json.loads(found[0]).get("holder")
        except (ValueError, AttributeError):
            return None
        return found[1] if holder == self.holder else None

    def _renew(self) -> None:
        # Retrying past ttl would not keep a waiter from taking over; released, stop waiting.
        store = self.store.retrying(self.store.retries.at_most(self.ttl), self._stop)
        while not self._stop.wait(self.ttl / 3):
            with self._token_lock:
                token = self._token
                if token is None:
                    return
                try:
                    new = store.replace(self.key, self._body(), token)
                    if new is None:
                        new = self._ours(store)  # our beat landed but its reply was lost
                except Exception as exc:  # keep trying: the next beat may get through
                    if self._stop.is_set():
                        return
                    warnings.warn(
                        f"could not renew the build lease {self.store.url}/{self.key}: {exc}; "
                        f"after lease_ttl ({self.ttl:g} s) another builder may take it over",
                        RuntimeWarning,
                        stacklevel=1,
                    )
                    continue
                if new is None:
                    self.lost = True  # taken over: the conditional manifest write decides
                    self._token = None
                    return
                self._token = new

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with self._token_lock:
            token, self._token = self._token, None
        if token is not None:
            # An undeleted lease expires after ttl: after the store failed the block, one try
            # is enough; never hide the block's own error.
            budget = 0.0 if isinstance(exc, StorageError) else self.ttl / 3
            store = self.store.retrying(self.store.retries.at_most(budget))
            with contextlib.suppress(Exception):
                store.delete(self.key, token)
