"""Whether a chunk file still holds the bytes its manifest describes, at the cost of one ``stat``.

A chunk is hashed in full (sha256, against the manifest) once: by the builder that wrote it, by
the pull that downloaded it, or by the first reader that finds no valid stamp. The result is
kept in a small *stamp* file beside the chunk (``<chunk>.verified``) naming the file's state at
that moment: device, inode, size, mtime and ctime (nanoseconds). A later reader trusts the chunk
without hashing it only if the file's state is still exactly that one. Any write to the file, a
truncation, a copy or a file moved into its place changes at least the inode or the ctime, which
no user can set, so the chunk is hashed again before a record of it is served.

A stamp is a cache of a verification, never a source of truth: a missing, torn or foreign one
costs a re-hash, nothing else. Stamps are written without fsync for that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import NamedTuple

from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.errors import CacheCorrupted, unreadable
from yogadl_plus.files import file_sha256

__all__ = [
    "DAMAGED",
    "STAMP_SUFFIX",
    "FileState",
    "check_chunk",
    "check_hashed",
    "file_state",
    "same_bytes",
    "stamp",
    "trusted",
    "verify_and_stamp",
]

STAMP_SUFFIX = ".verified"
# What to do about a damaged chunk, wherever it is found.
DAMAGED = (
    "the version is damaged: rebuild it (overwrite=True); a local copy of a bucket's version is "
    "pulled again by storage.verify()"
)


class FileState(NamedTuple):
    """What changes whenever a file's contents can have changed (ctime cannot be set by users)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def file_state(path: str) -> FileState:
    st = os.stat(path)
    return FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_chunk(
    path: str,
    info: ChunkInfo,
    where: str | None = None,
    damaged: str = DAMAGED,
    changed: str = "its bytes changed after it was written",
) -> None:
    """Raise CacheCorrupted unless the file at ``path`` has the size and sha256 of ``info``.

    The message names the chunk as ``where`` (default: ``path``), the place a user can act on,
    says what a wrong sha256 means (``changed``) and ends with ``damaged``: what to do about it.
    A file that cannot be read for another reason than damage (permissions) is a StorageError
    saying so.
    """
    where = where or path
    try:
        found = os.path.getsize(path)
        if found != info.bytes:
            check_hashed(found, "", info, where, damaged, changed)
        digest = file_sha256(path)
    except FileNotFoundError:
        raise CacheCorrupted(f"chunk {where} is missing; {damaged}") from None
    except IsADirectoryError:
        raise CacheCorrupted(f"chunk {where} is a directory, not a chunk file; {damaged}") from None
    except OSError as exc:
        raise unreadable(where, exc) from None
    check_hashed(found, digest, info, where, damaged, changed)


def check_hashed(
    size: int,
    sha256: str,
    info: ChunkInfo,
    where: str,
    damaged: str = DAMAGED,
    changed: str = "its bytes changed after it was written",
) -> None:
    """Raise CacheCorrupted, as ``check_chunk`` does, unless bytes of ``size`` and ``sha256``
    (hashed on their way into the file, not read back) are chunk ``info``'s."""
    if size != info.bytes:
        raise CacheCorrupted(
            f"chunk {where} has {size} bytes, the manifest says {info.bytes}; {damaged}"
        )
    if sha256 != info.sha256:
        raise CacheCorrupted(
            f"chunk {where} has sha256 {sha256}, the manifest says {info.sha256}: {changed}; "
            f"{damaged}"
        )


def verify_and_stamp(
    path: str, info: ChunkInfo, where: str | None = None, damaged: str = DAMAGED
) -> FileState:
    """Hash the file (check_chunk), then stamp it; its state, its bytes unchanged during the
    hash."""
    before = _state_or_none(path)
    check_chunk(path, info, where, damaged)
    state = _state_or_none(path)
    if state is None or before is None or not same_bytes(state, before):
        raise CacheCorrupted(
            f"chunk {where or path} changed while it was being verified; {damaged}"
        )
    _write_stamp(path, state, info.sha256)
    return state


def same_bytes(a: FileState, b: FileState) -> bool:
    """Whether two states of a file can differ only in metadata: a change of the ctime alone
    (chmod, a hard link, an extended attribute) leaves the bytes as they were."""
    return a[:4] == b[:4]


def _state_or_none(path: str) -> FileState | None:
    try:
        return file_state(path)
    except OSError:
        return None  # check_chunk says what is wrong with it


def stamp(path: str, sha256: str) -> FileState:
    """Record that the file at ``path`` (which the caller has just written or checked, and
    nobody else writes) has ``sha256``; its state."""
    state = file_state(path)
    _write_stamp(path, state, sha256)
    return state


def trusted(path: str, state: FileState, sha256: str) -> bool:
    """True if this process (or the one it was forked from) checked a file in exactly
    ``state`` to have ``sha256``, or a stamp beside ``path`` says one did."""
    if _VERIFIED.get(state) == sha256:
        return True
    if state in _stamped_states(path, sha256):
        _VERIFIED[state] = sha256
        return True
    return False


# The files this process checked, by state: kept across fork, so that the workers of a reader
# whose storage is read-only (no stamps) do not hash again what their parent checked.
_VERIFIED: dict[FileState, str] = {}
# A stamp keeps the states of this many checks, for hosts that see the same file on other
# devices (a network filesystem mounted on several machines).
_STATES_KEPT = 8


def _stamped_states(path: str, sha256: str) -> list[FileState]:
    try:
        with open(path + STAMP_SUFFIX, "rb") as f:
            body = json.loads(f.read(1 << 16))
        if body["sha256"] != sha256:
            return []
        return [FileState(*s) for s in body["states"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []  # no stamp, or not one of ours: hash the chunk


def _write_stamp(path: str, state: FileState, sha256: str) -> None:
    """Best effort: a read-only or full disk only costs the next reader a hash."""
    _VERIFIED[state] = sha256
    states = [s for s in _stamped_states(path, sha256) if s != state][-(_STATES_KEPT - 1) :]
    body = json.dumps({"sha256": sha256, "states": [*map(list, states), list(state)]}).encode()
    temp = f"{path}{STAMP_SUFFIX}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(temp, "wb") as f:
            f.write(body)
        os.replace(temp, path + STAMP_SUFFIX)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temp)
