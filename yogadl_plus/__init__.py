"""yogadl_plus: make any deep-learning dataset random-access.

Cache a source once into a versioned LMDB cache, then read record ``i`` in O(1) (``DataRef``)
and stream it with a true per-epoch shuffle, disjoint shards and free mid-epoch resume
(``Stream``). No deep-learning framework is imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yogadl_plus import codecs, deprecation, predicates, sources, vision
from yogadl_plus._version import __version__
from yogadl_plus.augment import random_map
from yogadl_plus.building import cache_dataset
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import (
    CacheCorrupted,
    CacheLimitWarning,
    DatasetNotFound,
    MissingExtra,
    NGramError,
    NothingPassedWarning,
    SchemaError,
    SourceChangedWarning,
    StorageError,
    TransformError,
    WorkerDied,
    YogaError,
    missing_extra,
)
from yogadl_plus.mixture import Mixture, mix
from yogadl_plus.ngram import NGram
from yogadl_plus.schema import Field, Schema
from yogadl_plus.storage import (
    GCSStorage,
    LocalStorage,
    S3Storage,
    Storage,
    default_storage,
    open_storage,
)
from yogadl_plus.stream import Stream, StreamStats
from yogadl_plus.tokenblocks import TokenBlocks, token_blocks

deprecation.install()  # the import paths of the last release, with a DeprecationWarning

if TYPE_CHECKING:
    from yogadl_plus import grain as grain
    from yogadl_plus import keras as keras
    from yogadl_plus import tensorflow as tensorflow
    from yogadl_plus import torch as torch


def __dir__() -> list[str]:
    """What ``dir(ydl)`` lists: the public names, the framework faces among them."""
    from yogadl_plus.adapters import FACES

    return sorted({*__all__, *FACES})


def __getattr__(name: str) -> Any:
    """``ydl.tensorflow``, ``ydl.torch``, ``ydl.keras``, ``ydl.grain``: framework faces, imported
    (with their framework) only when first used, so ``import yogadl_plus`` imports no framework.
    ``import yogadl_plus.torch`` (and the others) gives the same module."""
    import importlib

    from yogadl_plus.adapters import FACES, face

    if name in FACES:
        face(name, f"ydl.{name}")  # its framework missing: a MissingExtra naming ydl.<name>
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'yogadl_plus' has no attribute {name!r}")


__all__ = [
    "CacheCorrupted",
    "CacheLimitWarning",
    "DataRef",
    "DatasetNotFound",
    "MissingExtra",
    "Field",
    "GCSStorage",
    "LocalStorage",
    "Mixture",
    "NGram",
    "NGramError",
    "NothingPassedWarning",
    "S3Storage",
    "Schema",
    "SchemaError",
    "SourceChangedWarning",
    "StorageError",
    "Storage",
    "Stream",
    "StreamStats",
    "TokenBlocks",
    "TransformError",
    "WorkerDied",
    "YogaError",
    "__version__",
    "cache_dataset",
    "codecs",
    "default_storage",
    "missing_extra",
    "mix",
    "open_storage",
    "predicates",
    "random_map",
    "sources",
    "token_blocks",
    "vision",
]
