"""Opening a version's chunk files, each checked before it is opened, and checked again while open.

Nothing is served from a chunk that was not checked first (see docs/guarantees.md). Opening a
chunk checks its size, its contents (sha256 against the manifest, or a stamp of an earlier
check of this very file: cache/integrity.py), and its identity (the id, counts and schema digest
the chunk holds, against the manifest). While chunks are open, ``check_files`` compares each
file's state with the one it was checked in, and a chunk whose file changed is hashed again
before another record of it is served, or forgotten with a CacheCorrupted.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import lmdb

from yogadl_plus.cache.environments import ENVIRONMENTS, FileKey
from yogadl_plus.cache.held import Held
from yogadl_plus.cache.integrity import (
    DAMAGED,
    FileState,
    file_state,
    same_bytes,
    trusted,
    verify_and_stamp,
)
from yogadl_plus.cache.keys import IDENTITY_KEY, TOKEN_PARTS, record_key
from yogadl_plus.cache.manifest import MANIFEST_NAME, ChunkInfo, Manifest, schema_digest
from yogadl_plus.cache.pagemap import ValueMap, map_values
from yogadl_plus.cache.writer import chunk_identity
from yogadl_plus.errors import CacheCorrupted, unreadable

__all__ = ["MAPPED_CHUNKS_KEPT", "MAPPED_RECORDS_KEPT", "USES_TO_MAKE_AGAIN", "OpenChunks"]

#: The records whose value offsets a version's open chunks keep mapped at most (4 bytes each in
#: chunks under 4 GiB: 256 MiB, 64 chunks of a million small records); beyond, the maps made
#: longest ago are dropped and made again when used.
MAPPED_RECORDS_KEPT = 1 << 26
#: The chunks whose value maps a version keeps at most: each holds a file descriptor of its own.
MAPPED_CHUNKS_KEPT = 16
#: The reads a map must have served before it went for its chunk to be mapped again.
USES_TO_MAKE_AGAIN = 8

# What LMDB says when opening a chunk fails for the process's sake, not the file's.
_OS_REASONS = {
    os.strerror(code): code
    for code in (errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
}


class OpenChunks:
    """The chunk files of one version that this process has open, by chunk number: each one
    checked before it was opened, with the state of its file at that moment.

    ``lock`` is held while chunks are opened or let go. The environments come from the
    process's shared table (cache/environments.py); those this object holds are released on
    ``let_go_of_all()`` or when it is collected.
    """

    def __init__(self, directory: str, manifest: Manifest) -> None:
        self.directory = directory
        self.name = f"{manifest.dataset_id}:{manifest.version}"
        self.chunks: list[ChunkInfo] = list(manifest.chunks)
        self._schema = schema_digest(manifest.schema) if manifest.format_version >= 2 else ""
        self._build = manifest.build  # (format 3; "" before, when chunks did not record it)
        self._manifest = os.path.join(directory, MANIFEST_NAME)
        self.lock = threading.Lock()
        #: Each chunk's environment while it is open (None otherwise).
        self.envs: list[lmdb.Environment | None] = [None] * len(self.chunks)
        # The state each open chunk's file was checked in, and the open chunks' numbers.
        self._states: list[FileState | None] = [None] * len(self.chunks)
        # Each open chunk's ValueMap once made (False: it has none), dropped with the chunk,
        # and the records of those made, oldest first.
        self._maps: list[ValueMap | bool | None] = [None] * len(self.chunks)
        self._mapped: dict[int, list[int]] = {}  # number -> [records, reads since made]
        self._open_numbers: list[int] = []
        # Shared environments this object holds.
        self._held: list[FileKey] = []
        self._finalizer = weakref.finalize(self, ENVIRONMENTS.release_later, self._held)

    def where(self, number: int) -> str:
        """Chunk ``number`` as messages name it: its file, the version, the folder."""
        return f"{self.chunks[number].file} of {self.name} (in {self.directory})"

    def env(self, number: int) -> lmdb.Environment:
        """Chunk ``number``'s environment, opened (and so checked) if it is not open."""
        env = self.envs[number]
        if env is None:
            with self.lock:
                env = self.envs[number]
                if env is None:
                    env = self.open(number)[1]
        return env

    def value_maps(self, numbers: list[int]) -> list[ValueMap | None] | None:
        """Where the values of the records of chunks ``numbers`` lie in their files
        (cache/pagemap.py), each made on first use, the chunk opened (and so checked) first;
        None for a chunk without one (values of several sizes, pages laid out otherwise), and
        None for all where their records are more than the maps kept may hold (a batch over
        that many chunks would make maps only to drop them)."""
        records = sum(self.chunks[n].records for n in numbers)
        if records > MAPPED_RECORDS_KEPT or len(numbers) > MAPPED_CHUNKS_KEPT:
            return None
        return [self._value_map(number) for number in numbers]

    def _value_map(self, number: int) -> ValueMap | None:
        found = self._maps[number]
        if found is None:
            env, state = self.env(number), self._states[number]
            if state is None:  # (let go of by another thread just now)
                return None
            path = os.path.join(self.directory, self.chunks[number].file)
            try:
                with env.begin(buffers=False) as txn:
                    made = map_values(
                        path, state, self.chunks[number].records, lambda i: txn.get(record_key(i))
                    )
            except lmdb.Error:
                made = None  # (the chunk's gets say what is wrong with it)
            except OSError:
                return None  # (out of descriptors or memory: tried again next time)
            with self.lock:
                if self.envs[number] is not env or self._states[number] != state:
                    return None  # let go of, or changed, meanwhile: not this file's map
                found = self._maps[number] = made if made is not None else False
                if made is not None:
                    self._keep_maps_bounded(number)
        elif found:
            with self.lock:  # (used last: dropped last)
                kept = self._mapped.pop(number, None)
                if kept is not None:
                    kept[1] += 1
                    self._mapped[number] = kept
        return found if isinstance(found, ValueMap) else None

    def _keep_maps_bounded(self, newest: int) -> None:
        """The maps used longest ago go while those kept hold over MAPPED_RECORDS_KEPT records'
        offsets or MAPPED_CHUNKS_KEPT chunks: made again when used, unless they went before
        serving USES_TO_MAKE_AGAIN reads (readers taking turns over more chunks than are kept
        would make maps for every batch; those chunks are read by gets). Under ``self.lock``."""
        self._mapped[newest] = [self.chunks[newest].records, 0]
        total = sum(records for records, _ in self._mapped.values())
        for number in list(self._mapped):
            within = total <= MAPPED_RECORDS_KEPT and len(self._mapped) <= MAPPED_CHUNKS_KEPT
            if within or number == newest:
                break
            records, uses = self._mapped.pop(number)
            total -= records
            self._maps[number] = None if uses >= USES_TO_MAKE_AGAIN else False

    def open(self, number: int) -> tuple[FileKey, lmdb.Environment]:
        """Check chunk ``number`` (size, contents, identity) and open it: its file's key and
        environment. Under ``self.lock``."""
        info = self.chunks[number]
        path = os.path.join(self.directory, info.file)
        where = self.where(number)
        try:
            state = file_state(path)
        except FileNotFoundError:
            raise CacheCorrupted(f"chunk {where} is missing; {DAMAGED}") from None
        except OSError as exc:
            raise unreadable(path, exc) from None
        if state.size != info.bytes:
            raise CacheCorrupted(
                f"chunk {where} has {state.size} bytes, the manifest says {info.bytes}; {DAMAGED}"
            )
        if not trusted(path, state, info.sha256):
            state = verify_and_stamp(path, info, where)
        key, env = self._acquire(path, where)
        self._held.append(key)
        try:
            self._check_structure(number, env)
            now = file_state(path)
            if key != (state.device, state.inode) or not same_bytes(now, state):
                raise CacheCorrupted(f"chunk {where} changed while it was being opened; {DAMAGED}")
            state = now
        except BaseException:
            self._held.remove(key)
            ENVIRONMENTS.release([key])
            raise
        self.envs[number] = env
        self._states[number] = state
        self._open_numbers.append(number)
        return key, env

    def _acquire(self, path: str, where: str) -> tuple[FileKey, lmdb.Environment]:
        """The shared environment of the file at ``path``; LMDB's refusals said to be the
        file's damage, or the process's trouble (permissions, memory, descriptors)."""
        try:
            return ENVIRONMENTS.acquire(path)
        except lmdb.Error as exc:
            for text, code in _OS_REASONS.items():
                if text in str(exc):  # not the file's fault
                    raise unreadable(path, OSError(code, text)) from None
            raise CacheCorrupted(
                f"chunk {where} is not a readable LMDB file: {exc}; {DAMAGED}"
            ) from None
        except OSError as exc:
            raise unreadable(path, exc) from None

    def _check_structure(self, number: int, env: lmdb.Environment) -> None:
        """The chunk holds what its manifest entry says: entry counts, and (format 2) its id,
        counts and schema digest, (format 3) the manifest's build, so a chunk file of another
        build or version is refused, and (format 4) the tokens of its token columns."""
        info = self.chunks[number]
        where = self.where(number)
        identity = 1 if info.id else 0
        try:
            entries = env.stat()["entries"]
            with env.begin(buffers=False) as txn:
                stored = txn.get(IDENTITY_KEY) if identity else None
        except lmdb.Error as exc:
            raise CacheCorrupted(f"chunk {where}: LMDB cannot read it ({exc}); {DAMAGED}") from None
        token_parts = len(TOKEN_PARTS) * len(info.tokens)
        if entries != info.records + len(info.columns) + identity + token_parts:
            raise CacheCorrupted(
                f"chunk {where} holds {entries} entries, the manifest says {info.records} "
                f"records, {len(info.columns)} columns and {len(info.tokens)} token columns; "
                f"{DAMAGED}"
            )
        if not identity:
            return
        want = chunk_identity(info, self._schema, self._build)
        try:
            found = json.loads(bytes(stored)) if stored is not None else None
        except ValueError:
            found = None
        if found != want:
            raise CacheCorrupted(
                f"chunk {where} is not the chunk the manifest names{_differing(found, want)}: "
                f"it says it is {found}, "
                f"{self._manifest} expects {want} (a chunk file of another build or version, or "
                f"a manifest edited by hand); {DAMAGED}"
            )

    def check_files(self) -> None:
        """Raise CacheCorrupted if an open chunk's file changed since it was checked, unless
        it still hashes to the manifest's sha256 (then it is trusted in its new state). A
        chunk that fails is forgotten first."""
        for number in list(self._open_numbers):
            state = self._states[number]
            if state is None:
                continue
            path = os.path.join(self.directory, self.chunks[number].file)
            try:
                current: FileState | None = file_state(path)
            except OSError:
                current = None
            if current != state:
                self._changed(number, path, state, current)

    def _changed(self, number: int, path: str, state: FileState, current: FileState | None) -> None:
        where = self.where(number)
        if current is not None and current[:3] == state[:3]:
            # The same file, written to or touched: served only if its bytes are still right.
            try:
                self._states[number] = verify_and_stamp(path, self.chunks[number], where)
                self._maps[number] = None  # (made again from the file as it is now)
                return
            except CacheCorrupted:
                self.forget(number)
                raise
        self.forget(number)
        if current is None:
            what = "was removed"
        elif current[:2] == state[:2]:
            what = f"was cut to {current.size} bytes (the manifest says {state.size})"
        else:
            what = "was replaced by another file"
        raise CacheCorrupted(
            f"chunk {where} {what} while it was open: nothing more is read from it; open the "
            f"version again to read what is there now (it is checked then). {DAMAGED}"
        )

    def verify(self, number: int, pin: Callable[[int], Held] | None) -> bool:
        """Re-hash chunk ``number`` against the manifest (CacheCorrupted names it by its path).
        ``pin``: what keeps it on disk meanwhile (reading on demand: fetched first if it is not
        here). False if the chunk is open in another state: then it is forgotten (a good file,
        but not the one open: it is opened again)."""
        held = pin(number) if pin is not None else None
        try:
            info = self.chunks[number]
            state = verify_and_stamp(os.path.join(self.directory, info.file), info)
        finally:
            if held is not None:
                held.release()
        if self._states[number] is not None and self._states[number] != state:
            self.forget(number)
            return False
        return True

    def forget(self, number: int) -> None:
        """Stop handing out chunk ``number``: the next read opens (and checks) it again."""
        with self.lock:
            self.retire(number)

    def retire(self, number: int) -> None:
        """Chunk ``number`` is no longer handed out (its environment stays held until released
        by key). Under ``self.lock``."""
        self.envs[number] = None
        self._states[number] = None
        self._maps[number] = None
        self._mapped.pop(number, None)
        if number in self._open_numbers:
            self._open_numbers.remove(number)

    def release(self, key: FileKey) -> None:
        """Let go of a retired chunk's environment (its map goes with the last user in the
        process), unless ``let_go_of_all`` did already. Under ``self.lock``."""
        if key in self._held:
            self._held.remove(key)
            ENVIRONMENTS.release([key])

    def let_go_of_all(self) -> None:
        """Release every environment held; the next read opens chunks again. Under
        ``self.lock``."""
        ENVIRONMENTS.release(self._held)
        self._forget_all()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's handles are not ours (the shared table forgot them)."""
        self.lock = threading.Lock()
        self._held.clear()
        self._forget_all()

    def _forget_all(self) -> None:
        self.envs = [None] * len(self.chunks)
        self._states = [None] * len(self.chunks)
        self._maps = [None] * len(self.chunks)
        self._mapped = {}
        self._open_numbers = []


def _differing(found: object, want: dict[str, Any]) -> str:
    """What of a chunk's identity differs from its manifest entry's, as a message says it:
    " (its token count of field 'text', its records)"; "" for an identity that is no object."""
    if not isinstance(found, dict):
        return ""
    named: list[str] = []
    for key in sorted(found.keys() | want.keys()):
        mine, theirs = found.get(key), want.get(key)
        if key == "tokens" and isinstance(mine, dict) and isinstance(theirs, dict):
            fields = sorted(f for f in mine.keys() | theirs.keys() if mine.get(f) != theirs.get(f))
            named.extend(f"its token count of field {f!r}" for f in fields)
        elif mine != theirs:
            named.append(f"its {key}")
    return f" ({', '.join(named)})" if named else ""
