"""A version's manifest read from the bucket once per machine when its ranks start together.

Eight ranks of a node that call ``storage.fetch`` at the same moment would each read the
manifest (megabytes for a version of 10^4 chunks), and a thousand ranks of a hundred nodes would
hit the bucket with the same request together. Instead the processes of a machine take turns
under a lock of the local cache: the first reads the manifest and leaves its bytes there, with
its process id and the time; another process that comes within ``SHARED_S`` seconds takes those
bytes instead of reading them again. A process never takes its own record (a second ``fetch`` in
one process always asks the bucket, as it did), and nothing older than ``SHARED_S`` is taken, so
a version rebuilt in the bucket is seen as before, at most that much later by a rank that starts
right after another.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from yogadl_plus.files import write_durably
from yogadl_plus.storage.cachefiles import holding

__all__ = ["SHARED_S", "read_once_per_machine"]

#: How long after one process read a manifest the others of its machine take that read.
SHARED_S = 10.0
# Where the records are, under the local cache's root ('+': no dataset is named so).
_FOLDER = "+manifests"


def read_once_per_machine(
    root: str, dataset_id: str, version: str, read: Callable[[], bytes], wait_s: float
) -> bytes:
    """``read()`` (the bytes of the version's manifest in the bucket), or what another process
    of this machine read less than SHARED_S seconds ago. Waits at most ``wait_s`` for a process
    reading it now."""
    folder = os.path.join(root, _FOLDER, dataset_id)
    record = os.path.join(folder, version)
    with contextlib.ExitStack() as held:
        try:
            os.makedirs(folder, exist_ok=True)
            held.enter_context(holding(record + ".lock", wait_s, _stuck(record, wait_s)))
        except OSError:  # (also a StorageError: one stuck holding the lock for wait_s)
            return read()  # a cache this process may only read (mounted read-only), or stuck
        shared = _shared(record)
        if shared is not None:
            return shared
        data = read()
        with contextlib.suppress(OSError):  # (the others read it themselves, then)
            write_durably(record, f"{os.getpid()} {time.time()!r}\n".encode() + data)
        return data


def _stuck(record: str, wait_s: float) -> str:
    return (
        f"{record}: another process has been reading this version's manifest from the bucket "
        f"for {wait_s:.0f} s; is it stopped? try again"
    )


def _shared(record: str) -> bytes | None:
    """The bytes another process recorded less than SHARED_S seconds ago, if any."""
    try:
        with open(record, "rb") as f:
            header, data = f.read().split(b"\n", 1)
        pid, at = header.split()
        if int(pid) != os.getpid() and 0 <= time.time() - float(at) < SHARED_S:
            return data
    except (OSError, ValueError):  # none yet, or one cut short: read the bucket
        pass
    return None
