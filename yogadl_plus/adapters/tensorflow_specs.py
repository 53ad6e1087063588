"""What ``make_tf_dataset`` hands tf.data: the signature of a stream's items, and its values
shaped to fit it.

Without a transform the signature comes from the schema (``field_spec``) and each field's values
are converted to it (``field_converter``: str as tf.string, datetimes as int64 counts,
variable shapes as ``tf.RaggedTensor``), nested back into the structure the field names say
(``template_of``, ``fill``). With a transform the signature is inferred from its output
(``spec_of``) or given, and outputs are shaped to fit it (``to_signature``). Record streams
hand tf.data blocks of records, variable shapes as flat values and shapes (``batched_spec``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from yogadl_plus.columns import collate

if TYPE_CHECKING:
    from yogadl_plus.schema import Field
    from yogadl_plus.stream import StreamPlan

__all__ = [
    "Template",
    "batched_spec",
    "check_fields",
    "field_converter",
    "field_spec",
    "fields_of",
    "fill",
    "flat_converter",
    "ragged",
    "schema_converter",
    "spec_of",
    "template_of",
    "to_batch_signature",
    "to_signature",
]

# Sources whose fields "0", "1", ... were a tuple and whose field "value" was a single tensor.
_TUPLE_SOURCES = ("tensorflow", "torch")

# A template of the output structure: a field name, or a dict / tuple of templates.
Template = Any


def batched_spec(spec: Any) -> Any:
    """The spec of a batch of values of the record spec ``spec``: (flat values as ragged rows,
    shapes) where shapes vary."""
    if not isinstance(spec, tf.TensorSpec):
        raise ValueError(
            f"a record stream's output_signature must be of tf.TensorSpec, got {spec!r}"
        )
    shape = tuple(spec.shape.as_list())
    if None in shape:
        return (
            tf.RaggedTensorSpec((None, None), spec.dtype, ragged_rank=1, row_splits_dtype=tf.int64),
            tf.TensorSpec((None, len(shape)), tf.int64),
        )
    return tf.TensorSpec((None, *shape), spec.dtype)


def _flat_and_shapes(arrays: Sequence[Any], dtype: np.dtype) -> tuple[tf.RaggedTensor, Any]:
    arrays = [np.asarray(a) for a in arrays]
    shapes = np.array([a.shape for a in arrays], dtype=np.int64)
    return ragged([a.reshape(-1) for a in arrays], 1, (), dtype), shapes


def flat_converter(f: Field) -> Callable[[Any], Any]:
    """For a record stream's block: a column of ``f``'s variable-shape values as their flat
    values (ragged rows) and their shapes, so each record comes back with its own shape."""
    dtype = np.dtype(np.int64) if f.dtype.kind in "mM" else f.dtype
    return lambda column: _flat_and_shapes(column, dtype)


def to_batch_signature(value: Any, spec: Any) -> Any:
    """A batch of transform outputs shaped for the read_ahead batch signature of ``spec``."""
    if isinstance(spec, Mapping):
        if isinstance(value, list):
            value = collate(value)
        return {k: to_batch_signature(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tuple):
        if isinstance(value, list):
            value = tuple(collate(list(column)) for column in zip(*value))
        return tuple(to_batch_signature(v, s) for v, s in zip(value, spec))
    if isinstance(spec, tf.TensorSpec) and None in spec.shape.as_list():
        return _flat_and_shapes(list(value), np.dtype(spec.dtype.as_numpy_dtype))
    return to_signature(value, batched_spec(spec))


# --- the structure ---


def fields_of(plan: StreamPlan) -> dict[str, Field]:
    """The fields items hold, by output name ("<offset>/<field>" for n-grams)."""
    if plan.boundary.ngram is None:
        return {f.name: f for f in plan.fields}
    groups = plan.boundary.ngram.resolve(plan.source.schema)
    return {f"{offset}/{f.name}": f for offset, fields in groups.items() for f in fields}


def template_of(plan: StreamPlan, nested: bool) -> Template:
    """The structure of the plan's items, its leaves the names ``fields_of`` gives: nested at
    '/' (``nested``), tuples for tf.data and PyTorch sources, per offset for n-grams."""
    collapse = all(kind in _TUPLE_SOURCES for kind in plan.source.source_kinds)
    if plan.boundary.ngram is None:
        return _template([f.name for f in plan.fields], nested, collapse)
    groups = plan.boundary.ngram.resolve(plan.source.schema)
    return {
        # (An offset not named yields an empty dict, as the stream's windows hold.)
        offset: _template([f.name for f in fields], nested, collapse, prefix=f"{offset}/")
        if fields
        else {}
        for offset, fields in groups.items()
    }


def _template(names: Sequence[str], nested: bool, collapse: bool, prefix: str = "") -> Template:
    """Field names as a nested structure of dicts (split at '/') and tuples, leaves being the
    full names (with ``prefix``)."""
    root: dict[str, Any] = {}
    for name in names:
        parts = name.split("/") if nested else [name]
        node = root
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                return {n: prefix + n for n in names}  # "a" and "a/b" both exist: keep flat
            node = child
        if parts[-1] in node:
            return {n: prefix + n for n in names}
        node[parts[-1]] = prefix + name
    if not collapse:
        return root

    def collapsed(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        node = {k: collapsed(v) for k, v in node.items()}
        if set(node) == {str(i) for i in range(len(node))}:
            return tuple(node[str(i)] for i in range(len(node)))
        return node

    out = collapsed(root)
    if isinstance(out, dict) and list(out) == ["value"] and isinstance(out["value"], str):
        return out["value"]
    return out


def fill(template: Template, values: Mapping[str, Any]) -> Any:
    """``template`` with each field name replaced by its value in ``values``."""
    if isinstance(template, str):
        return values[template]
    if isinstance(template, tuple):
        return tuple(fill(t, values) for t in template)
    return {k: fill(t, values) for k, t in template.items()}


def schema_converter(
    template: Template, converters: dict[str, Callable[[Any], Any]], ngram: bool
) -> Callable[[Any], Any]:
    """A function item -> the structure of ``template``, each field through its converter
    (``ngram``: the items are windows ``{offset: {field: value}}``)."""
    if ngram:

        def convert_window(item: Any) -> Any:
            flat = {
                f"{offset}/{name}": value
                for offset, group in item.items()
                for name, value in group.items()
            }
            return fill(template, {k: converters[k](v) for k, v in flat.items()})

        return convert_window

    def convert(item: Any) -> Any:
        # (The converters' fields: a mixture's record may hold more, those of its source.)
        return fill(template, {k: to_tf(item[k]) for k, to_tf in converters.items()})

    return convert


# --- fields: spec and value conversion ---


def check_fields(fields: Mapping[str, Field]) -> None:
    """ValueError naming the first nullable field: tf.data has no None."""
    for name, f in fields.items():
        if f.nullable:
            raise ValueError(
                f"field {name!r} is nullable and tf.data has no None: leave it out with "
                "fields=, or replace None in a transform and pass output_signature="
            )


def _tf_dtype(f: Field) -> tf.DType:
    if f.kind != "numeric":
        return tf.string
    if f.dtype.kind in "mM":
        return tf.int64
    return tf.as_dtype(f.dtype)


def _ragged_rank(shape: Sequence[int | None]) -> int:
    """The ragged rank of a batch of values of ``shape``: up to its last variable dim."""
    return max(i for i, d in enumerate(shape) if d is None) + 1


def field_spec(f: Field, batched: bool) -> tf.TypeSpec:
    """The tf spec of ``f``'s values (``batched``: of a batch of them, ragged where shapes
    vary)."""
    dtype = _tf_dtype(f)
    if not batched:
        return tf.TensorSpec(f.shape, dtype)
    if None in f.shape:
        return tf.RaggedTensorSpec(
            (None, *f.shape), dtype, ragged_rank=_ragged_rank(f.shape), row_splits_dtype=tf.int64
        )
    return tf.TensorSpec((None, *f.shape), dtype)


def field_converter(f: Field, batched: bool) -> Callable[[Any], Any]:
    """A function that shapes one of ``f``'s values (``batched``: a column of them) to
    ``field_spec``: datetimes as int64 counts, variable shapes batched as ragged tensors."""
    if f.kind != "numeric":
        if batched:
            return lambda column: np.array(column, dtype=object)
        return _identity
    as_int = f.dtype.kind in "mM"
    if not batched:
        return (lambda value: np.asarray(value).view(np.int64)) if as_int else _identity
    if None in f.shape:
        rank = _ragged_rank(f.shape)
        inner = tuple(int(d) for d in f.shape[rank:])  # type: ignore[arg-type]
        dtype = np.dtype(np.int64) if as_int else f.dtype
        return lambda column: ragged(column, rank, inner, dtype)

    def dense(column: Any) -> np.ndarray:
        # Fixed shapes with a variable-size codec (Compressed, Image) come as lists.
        array = column if isinstance(column, np.ndarray) else np.stack(column)
        return array.view(np.int64) if as_int else array

    return dense


def _identity(value: Any) -> Any:
    return value


def ragged(
    arrays: Sequence[np.ndarray], ragged_rank: int, inner: tuple[int, ...], dtype: np.dtype
) -> tf.RaggedTensor:
    """A batch of arrays of equal rank and varying shape as one ``tf.RaggedTensor``, built from
    the concatenated values and per-level row lengths (no Python loop over elements)."""
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(len(arrays), -1)
    lengths = []
    for level in range(ragged_rank):
        rows = np.prod(shapes[:, :level], axis=1, dtype=np.int64)  # rows of this level per item
        lengths.append(np.repeat(shapes[:, level], rows))
    parts = [np.asarray(a).reshape((-1, *inner)) for a in arrays]
    values = np.concatenate(parts) if parts else np.zeros((0, *inner), dtype)
    if values.dtype != dtype:
        values = values.view(dtype) if values.dtype.kind in "mM" else values.astype(dtype)
    return tf.RaggedTensor.from_nested_row_lengths(values, lengths, validate=False)


# --- transforms: inferred or given signatures ---


def spec_of(value: Any, batched: bool) -> Any:
    """The signature of a transform's output for one record."""
    if isinstance(value, Mapping):
        return {k: spec_of(v, batched) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(spec_of(v, batched) for v in value)
    lead = (None,) if batched else ()
    if isinstance(value, (str, bytes, np.str_, np.bytes_)):
        return tf.TensorSpec(lead, tf.string)
    if value is None:
        raise ValueError("the transform returned None for a value; pass output_signature=")
    if isinstance(value, (tf.Tensor, tf.RaggedTensor)):
        spec = tf.type_spec_from_value(value)
        if not batched:
            return spec
        if isinstance(spec, tf.RaggedTensorSpec):
            raise ValueError("the transform returned a ragged tensor; pass output_signature=")
        return tf.TensorSpec((None, *spec.shape), spec.dtype)
    array = np.asarray(value)
    if array.dtype.kind in "US":
        return tf.TensorSpec((*lead, *array.shape), tf.string)
    if array.dtype.kind not in "biufc":
        raise ValueError(
            f"cannot infer a tf spec for a transform output of dtype {array.dtype}; pass "
            "output_signature="
        )
    return tf.TensorSpec((*lead, *array.shape), tf.as_dtype(array.dtype))


def to_signature(value: Any, spec: Any) -> Any:
    """``value`` shaped for ``spec``: tuples of lists transposed, lists stacked or made ragged."""
    if isinstance(spec, Mapping):
        if isinstance(value, list):  # a batch of non-dict items the stream could not collate
            value = collate(value)
        return {k: to_signature(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tuple):
        if isinstance(value, list):  # a batch of tuples: one column per tuple position
            value = tuple(collate(list(column)) for column in zip(*value))
        return tuple(to_signature(v, s) for v, s in zip(value, spec))
    if isinstance(spec, tf.RaggedTensorSpec) and isinstance(value, (list, np.ndarray)):
        arrays = [np.asarray(v) for v in value]
        inner = arrays[0].shape[spec.ragged_rank :] if arrays else ()
        return ragged(arrays, spec.ragged_rank, inner, np.dtype(spec.dtype.as_numpy_dtype))
    if isinstance(spec, tf.TensorSpec) and isinstance(value, list):
        if spec.dtype == tf.string:
            return np.array(value, dtype=object)
        return np.stack([np.asarray(v) for v in value])
    return value
