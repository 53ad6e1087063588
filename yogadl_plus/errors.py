"""The exceptions yogadl_plus raises, so callers can catch ours apart from everything else."""

from __future__ import annotations


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
    """A remote store could not be used (missing bucket, denied access, unreachable endpoint):
    the message names the URL and what to check."""


class CacheLimitWarning(UserWarning):
    """The local cache could not be kept under its size limit: what it holds is in use."""
