"""A ``tf.data.Dataset`` as a source: its ``element_spec`` gives the schema, batches give records.

Elements may be dicts (nested dicts too), tuples, or a single tensor. Their leaves become fields
named by their path: ``{"a": {"b": x}}`` gives field ``"a/b"``, ``(x, (y, z))`` gives ``"0"``,
``"1/0"``, ``"1/1"``, a single tensor gives ``"value"``. ``make_tf_dataset`` nests them back.

The dataset is read in batches of ``read_batch`` elements (``batch``, or ``ragged_batch`` when
some shapes vary), so that Python runs once per batch, never once per element inside TensorFlow;
a variable-shape leaf travels as its flat values plus its shape, so every record gets back its
own true shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from yogadl_plus.errors import InfiniteDatasetError, SchemaError
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.base import Source

__all__ = ["InfiniteDatasetError", "TFDatasetSource", "leaf_paths"]

_READ_BATCH = 1024

Path = tuple[Any, ...]


def _is_sequence(spec: Any) -> bool:
    return isinstance(spec, (tuple, list))


def leaf_paths(spec: Any) -> list[tuple[str, Path, Any]]:
    """(field name, path of keys and indices, leaf spec) of every leaf of an element structure,
    in the structure's own order."""
    if not isinstance(spec, Mapping) and not _is_sequence(spec):
        return [("value", (), spec)]
    out: list[tuple[str, Path, Any]] = []

    def walk(node: Any, path: Path, names: tuple[str, ...]) -> None:
        if isinstance(node, Mapping):
            items: Any = node.items()
        elif _is_sequence(node):
            items = enumerate(node)
        else:
            out.append(("/".join(names), path, node))
            return
        for key, child in items:
            walk(child, (*path, key), (*names, str(key)))

    walk(spec, (), ())
    names = [name for name, _, _ in out]
    if not names:
        raise SchemaError("the dataset's elements hold no tensors: nothing to cache")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SchemaError(
            f"the element structure gives field name(s) {twice} twice (nested keys are joined "
            "with '/'); rename the keys, e.g. with dataset.map"
        )
    return out


def _leaf_kind(name: str, spec: Any) -> tuple[tf.DType, tf.TensorShape]:
    """(dtype, shape) of a leaf the reader can turn into record values, or a clear error."""
    if isinstance(spec, tf.RaggedTensorSpec):
        if spec.ragged_rank > 0:
            raise SchemaError(
                f"field {name!r}: each element is itself a ragged tensor (ragged_rank="
                f"{spec.ragged_rank}); a record value must be one dense array: map it with "
                ".to_tensor(), or cache .flat_values and .row_lengths() as two fields"
            )
        return spec.dtype, spec.shape
    if isinstance(spec, tf.TensorSpec):
        if spec.dtype == tf.string and spec.shape.rank != 0:
            raise SchemaError(
                f"field {name!r}: string tensors of shape {spec.shape} are not supported, only "
                "scalar strings (bytes fields); split them into scalar fields or join them "
                "with tf.strings.reduce_join"
            )
        return spec.dtype, spec.shape
    raise SchemaError(
        f"field {name!r}: {type(spec).__name__} elements are not supported (dense and ragged "
        "tensors are); convert them first, e.g. tf.sparse.to_dense"
    )


def _field(name: str, dtype: tf.DType, shape: tf.TensorShape) -> Field:
    if dtype == tf.string:
        return Field(name, bytes)
    np_dtype = np.dtype(dtype.as_numpy_dtype)
    if np_dtype.kind not in "biufc":
        raise SchemaError(
            f"field {name!r}: dtype {dtype.name} has no plain numpy equivalent; cast it "
            "(e.g. tf.cast(x, tf.float32)) before caching"
        )
    if shape.rank is None:
        raise SchemaError(
            f"field {name!r}: its rank is unknown in the dataset's element_spec; give it one "
            "(e.g. dataset.map(lambda x: tf.ensure_shape(x, [None, 3]))) or pass schema= to "
            "cache_dataset"
        )
    return Field(name, np_dtype, tuple(shape.as_list()))


class TFDatasetSource(Source):
    """The elements of a finite ``tf.data.Dataset`` as records, read ``read_batch`` at a time."""

    kind = "tensorflow"

    def __init__(self, dataset: tf.data.Dataset, *, read_batch: int = _READ_BATCH) -> None:
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"expected a tf.data.Dataset, got {type(dataset).__name__}")
        if int(read_batch) < 1:
            raise ValueError(f"read_batch must be >= 1, got {read_batch}")
        cardinality = int(dataset.cardinality())
        if cardinality == int(tf.data.INFINITE_CARDINALITY):
            raise InfiniteDatasetError(
                "the tf.data.Dataset is infinite (cardinality INFINITE, e.g. after .repeat() "
                "with no count), so it can never be cached: remove .repeat() before caching, "
                "and repeat the stream instead (each iter(stream) is the next epoch)"
            )
        self.dataset = dataset
        self.read_batch = int(read_batch)
        self._length = cardinality if cardinality >= 0 else None
        self._leaves = leaf_paths(dataset.element_spec)
        self._kinds = [_leaf_kind(name, spec) for name, _, spec in self._leaves]
        # Leaves whose shape is not fully known travel as (flat values, shape).
        self._variable = [not shape.is_fully_defined() for _, shape in self._kinds]

    @property
    def schema(self) -> Schema:
        return Schema(
            _field(name, dtype, shape)
            for (name, _, _), (dtype, shape) in zip(self._leaves, self._kinds)
        )

    @property
    def length(self) -> int | None:
        return self._length

    def batched(self) -> tf.data.Dataset:
        """The dataset the records are read from: each element a flat tuple of batched leaves
        (a variable-shape leaf as ragged flat values, then its shapes)."""
        spec = self.dataset.element_spec
        unpacked = type(spec) is tuple  # tf.data passes the items of plain tuples as arguments
        paths = [path for _, path, _ in self._leaves]
        variable = self._variable

        def flatten(*args: Any) -> tuple[tf.Tensor, ...]:
            element: Any = args if unpacked else args[0]
            out = []
            for path, is_variable in zip(paths, variable):
                value = element
                for key in path:
                    value = value[key]
                if is_variable:
                    out.extend([tf.reshape(value, [-1]), tf.shape(value, out_type=tf.int64)])
                else:
                    out.append(value)
            return tuple(out)

        flat = self.dataset.map(flatten)
        batched = (
            flat.ragged_batch(self.read_batch) if any(variable) else flat.batch(self.read_batch)
        )
        # TensorFlow makes the next batches while Python splits and encodes this one.
        return batched.prefetch(2)

    def records(self) -> Iterator[dict[str, Any]]:
        names = [name for name, _, _ in self._leaves]
        variable = self._variable
        for batch in self.batched().as_numpy_iterator():
            columns: list[Any] = []
            i = 0
            for is_variable in variable:
                if is_variable:
                    values, shapes = batch[i], batch[i + 1]
                    columns.append(
                        [np.asarray(v).reshape(s) for v, s in zip(values, shapes.tolist())]
                    )
                    i += 2
                else:
                    columns.append(batch[i])
                    i += 1
            for row in zip(*columns):
                yield dict(zip(names, row))
