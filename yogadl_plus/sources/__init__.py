"""Turning the things users have (iterables, Parquet, image folders, WebDataset shards, files
through a function, and more) into records plus a schema."""

from __future__ import annotations

import os
from typing import Any

from yogadl_plus.schema import Schema
from yogadl_plus.sources.base import Source
from yogadl_plus.sources.columnar import columns_source, is_columns
from yogadl_plus.sources.files import Files
from yogadl_plus.sources.huggingface import HuggingFaceSource
from yogadl_plus.sources.imagefolder import ImageFolder
from yogadl_plus.sources.iterable import IterableSource
from yogadl_plus.sources.parquet import ParquetSource
from yogadl_plus.sources.petastorm import PetastormSource
from yogadl_plus.sources.spark import SparkDataFrameSource
from yogadl_plus.sources.webdataset import WebDataset

__all__ = [
    "Files",
    "HuggingFaceSource",
    "ImageFolder",
    "IterableSource",
    "ParquetSource",
    "PetastormSource",
    "Source",
    "SparkDataFrameSource",
    "WebDataset",
    "as_source",
]


def _is_path_list(obj: Any) -> bool:
    return (
        isinstance(obj, (list, tuple))
        and bool(obj)
        and all(isinstance(p, (str, os.PathLike)) for p in obj)
    )


def _framework_of(obj: Any) -> str:
    """'tensorflow', 'torch', 'keras', 'ray', 'pyspark', 'datasets' (Hugging Face) or '' for
    the framework an object's class comes from, found without importing any framework."""
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".")[0]
        if root in ("tensorflow", "torch", "keras", "ray", "pyspark", "datasets"):
            return root
    return ""


def as_source(obj: Any, schema: Schema | None = None) -> Source:
    """The Source for what the user passed to cache_dataset (with ``schema``, if given: columns
    in memory then take their fields from it instead of from their types)."""
    if isinstance(obj, Source):
        return obj
    if isinstance(obj, (str, os.PathLike)) or _is_path_list(obj):
        from yogadl_plus.sources.petastorm import parquet_source

        return parquet_source(obj)  # a Petastorm dataset is Parquet with a schema of its own
    framework = _framework_of(obj)
    if not framework and is_columns(obj):  # (a framework's mapping is no dict of columns)
        return columns_source(obj, schema)
    if framework == "tensorflow" and hasattr(obj, "element_spec"):
        from yogadl_plus.sources.tensorflow import TFDatasetSource

        return TFDatasetSource(obj)
    if framework == "torch" and (hasattr(obj, "__getitem__") or hasattr(obj, "__iter__")):
        from yogadl_plus.sources.torch import TorchDatasetSource

        return TorchDatasetSource(obj)
    if framework == "keras" or (framework == "tensorflow" and hasattr(obj, "on_epoch_end")):
        from yogadl_plus.sources.keras import KerasSequenceSource

        return KerasSequenceSource(obj)
    if framework == "ray" and hasattr(obj, "to_arrow_refs"):
        from yogadl_plus.sources.ray import RayDatasetSource

        return RayDatasetSource(obj)
    if framework == "pyspark" and hasattr(obj, "mapInArrow"):
        return SparkDataFrameSource(obj)
    if framework == "datasets":
        return HuggingFaceSource(obj)  # a DatasetDict, or other, is refused naming a split
    if callable(obj) or hasattr(obj, "__iter__"):
        return IterableSource(obj)
    raise TypeError(
        f"cannot cache a {type(obj).__name__}: pass columns (a dict of arrays, a pandas or "
        "polars DataFrame, a pyarrow Table), an iterable of dicts, a zero-argument callable "
        "returning one, or Parquet path(s)"
    )
