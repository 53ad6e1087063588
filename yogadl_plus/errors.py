"""The exceptions yogadl_plus raises, so callers can catch ours apart from everything else."""

from __future__ import annotations

import errno
import os


class YogaError(Exception):
    """Base of every error yogadl_plus raises on purpose."""


class DatasetNotFound(YogaError, LookupError):
    """The (dataset_id, version) asked for is not published in this storage."""


class SchemaError(YogaError, ValueError):
    """A record, a field or a schema does not fit: the message names what and where."""


class CacheCorrupted(YogaError):
    """A published cache failed a checksum or structure check: its data cannot be trusted."""


class SourceChangedWarning(UserWarning):
    """The source behind an existing cached version looks different from the one cached."""


class StorageError(YogaError, OSError):
    """A storage could not be used (a missing bucket or folder, denied access, an unreachable
    endpoint, a full disk): the message names the URL or path and what to check."""


class CacheLimitWarning(UserWarning):
    """The local cache could not be kept under its size limit: what it holds is in use."""


class NothingPassedWarning(UserWarning):
    """A stream's predicate kept none of the records of a whole epoch: its epochs are empty."""


class MissingExtra(YogaError, ImportError):
    """A face, storage or engine was used without the library it needs: the message names the
    ``pip install 'yogadl_plus[extra]'`` that brings it."""


class WorkerDied(YogaError):
    """A worker process ended without finishing its work (killed, or out of memory)."""


class TransformError(YogaError):
    """The user's transform raised; the message names the record (or window anchor)."""


class NGramError(YogaError, ValueError):
    """The records cannot form n-gram windows (timestamps out of order inside a window)."""


class InfiniteDatasetError(YogaError, ValueError):
    """The tf.data.Dataset never ends (``.repeat()`` without a count), so it cannot be cached."""


class TransientStorageError(StorageError):
    """A failure worth retrying: a dropped connection, a 5xx, throttling."""


class NoRoom(StorageError):
    """A strict ``room`` found the cache full of what is in use (a fetch ahead then waits)."""


# --- raised and caught inside yogadl_plus; never reach a user as they are ---


class PinGone(Exception):
    """The pinned thing was removed before the pin was taken (its folder is gone)."""


class UnexpectedLayout(Exception):
    """A chunk file is not laid out as the page map expects: no read-ahead for it."""


class RefusedCall(Exception):
    """A call a Petastorm pickle asked for that a Unischema never needs."""

    def __init__(self, call: str, why: str) -> None:
        super().__init__(call, why)
        self.call, self.why = call, why


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process (the cause of the error raised)."""

    def __str__(self) -> str:
        return str(self.args[0])


# Top-level module -> (its name for people, the extra of pyproject.toml that installs it).
_EXTRAS = {
    "torch": ("PyTorch", "torch"),
    "tensorflow": ("TensorFlow", "tf"),
    "keras": ("Keras (with TensorFlow)", "tf"),
    "boto3": ("boto3", "s3"),
    "botocore": ("boto3", "s3"),
    "google": ("google-cloud-storage", "gcs"),
    "ray": ("Ray", "ray"),
    "pyspark": ("PySpark", "spark"),
    "datasets": ("Hugging Face datasets", "hf"),
    "grain": ("Grain", "grain"),
    "matplotlib": ("matplotlib", "plot"),
    "jax": ("JAX", "grain"),
}


def missing_extra(exc: ModuleNotFoundError, needed_by: str) -> ImportError:
    """For ``raise missing_extra(exc, "S3Storage") from None`` where an import failed: a
    MissingExtra naming the pip install when the missing module is one an extra brings, else
    ``exc`` itself (something else is broken, and its own message says what)."""
    root = (exc.name or "").split(".")[0]
    if root not in _EXTRAS:
        return exc
    library, extra = _EXTRAS[root]
    return MissingExtra(f"{needed_by} needs {library}: pip install 'yogadl_plus[{extra}]'")


def unreadable(path: str, exc: OSError, what: str = "chunk") -> StorageError:
    """The error for a file that exists but cannot be read (permissions, I/O): not damage."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StorageError(
            f"{what} {path}: permission denied: this process (uid {os.getuid()}) cannot read it; "
            "check the file's owner and mode (and the folders above it)"
        )
    if exc.errno in (errno.ENOMEM, errno.EMFILE, errno.ENFILE):
        return StorageError(
            f"{what} {path} cannot be opened: {exc.strerror}: this process ran out of address "
            "space or file descriptors (see ulimit -v and ulimit -n), not a damaged file"
        )
    return StorageError(f"{what} {path} cannot be read: {exc.strerror or exc}")


def unwritable(path: str, exc: BaseException) -> StorageError:
    """The error for a write that failed (a full disk above all): names the path, the free
    space left there, and what to do."""
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    try:
        st = os.statvfs(folder)
        free = st.f_bavail * st.f_frsize
        space = f"{free:,} bytes free of {st.f_blocks * st.f_frsize:,} on its filesystem"
    except OSError:
        free, space = None, "free space unknown"
    code = getattr(exc, "errno", None)
    text = str(exc)
    if (
        code in (errno.ENOSPC, errno.EDQUOT)
        or "No space left" in text
        or (free is not None and free < (1 << 20))
    ):
        return StorageError(
            f"{path}: no space left on the device ({space}); nothing of this write was kept: "
            "free some space or point the storage at a larger disk"
        )
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StorageError(
            f"{path}: cannot write here ({os.strerror(code)}; uid {os.getuid()}): check the "
            "folder's owner and mode, or whether it is on a read-only filesystem"
        )
    return StorageError(f"{path}: write failed ({type(exc).__name__}: {text}; {space})")
