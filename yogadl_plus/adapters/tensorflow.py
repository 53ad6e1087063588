"""``ydl.tensorflow``: a Stream as a ``tf.data.Dataset``.

``make_tf_dataset(stream)`` wraps the stream in ``tf.data.Dataset.from_generator`` with an
``output_signature`` built from the cached schema, so every iteration of the dataset is an
epoch of the stream: ``.repeat()`` gives the next epochs, in the stream's order. Records are
read in blocks and unbatched inside tf.data, and tf.data may prefetch: a consumer resumes
exactly with ``stream.offset_after(epoch, items consumed)``, which the stream answers from what
it handed out (``ydl.keras.BackupAndRestore`` does this by itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from yogadl_plus.adapters.keras_build import a_thread_builds_the_model, unmoved
from yogadl_plus.columns import collate

if TYPE_CHECKING:
    from yogadl_plus.schema import Field
    from yogadl_plus.stream import Stream, StreamPlan

__all__ = ["make_tf_dataset"]

# Sources whose fields "0", "1", ... were a tuple and whose field "value" was a single tensor.
_TUPLE_SOURCES = ("tensorflow", "torch")
# Positions tried for one item when the signature of a transform's output is inferred.
_SAMPLE_POSITIONS = 4096
# Dense batches handed over per Python call (tf.data unbatches them): tf.data's per-call cost
# is then paid once per group; groups stay small enough to copy without notice.
_GROUP_BATCHES = 8
_GROUP_BYTES = 16 << 20

# A template of the output structure: a field name, or a dict / tuple of templates.
Template = Any


def make_tf_dataset(
    stream: Stream,
    *,
    output_signature: Any = None,
    nested: bool = True,
    read_ahead: bool = True,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the stream's items; each iteration of it (``.repeat()``
    included) is the stream's next epoch, except one Keras makes only to take a batch and build
    the model (with its JAX and torch backends, and TensorFlow's under a distribution
    strategy): that one reads what the stream will hand out next without moving it, so
    ``model.fit`` trains on the stream's next epoch first with every backend.

    Without a transform, the signature comes from the schema: ``tf.string`` for str and bytes
    fields (str values arrive UTF-8 encoded), fixed shapes as they are, ``None`` for variable
    dims, datetime64 / timedelta64 as int64 counts of their unit; nullable fields are refused.
    A batching stream gives each field with a leading ``None`` batch dim and variable-shape
    fields as ``tf.RaggedTensor``. A record stream gives one record per element, each with its
    own shape.

    Field names are nested back: ``"a/b"`` becomes ``{"a": {"b": ...}}``; for tf.data and
    PyTorch sources, fields ``"0"``, ``"1"``, ... become a tuple and a lone ``"value"`` a single
    tensor, so a cached tf.data dataset comes back with its own element structure. N-gram items
    are ``{offset: {field: ...}}``. ``nested=False`` keeps a flat dict of field names.

    With a transform, the items are whatever it returns: pass ``output_signature`` (a nest of
    ``tf.TensorSpec`` / ``tf.RaggedTensorSpec``), or it is inferred from the transform's output
    for the first record(s) of the dataset, with the shapes that output has (batched: a leading
    ``None``); pass it yourself when shapes vary. An explicit ``output_signature`` describes the
    stream's items as they are (without a transform: a flat dict of field name -> spec).

    Speed and resuming (``read_ahead=True``, the default): a batching stream hands over one
    whole batch per Python call; a record stream hands over a block of records per call, which
    tf.data unbatches, so Python runs once per block, not per record. tf.data may prefetch and
    parallelize maps, so the stream reads ahead of the consumer and ``stream.offset`` is where
    the *reading* stands. Resume from what was *consumed*: with ``epoch`` the stream's epoch
    (``stream.next_epoch_position[0]`` before the dataset's iteration) and ``k`` items of it
    consumed, ``stream.offset_after(epoch, k)`` is the exact ``start_offset``, with or without a
    predicate. ``ydl.keras.BackupAndRestore`` does this for ``model.fit``.

    ``read_ahead=False`` is the slow, plain path: one item per Python call, and tf.data's
    injected prefetch and automatic map parallelization turned off (options that carry on to
    the datasets made from this one), so that ``stream.offset`` after ``k`` items were taken
    resumes at item ``k + 1``; a ``.prefetch()`` you add reads ahead again.

    The cardinality is ``len(stream)``, the items in one whole epoch, so ``model.fit`` runs
    whole epochs without ``steps_per_epoch``. An iteration may end before it: the first epoch
    of a resumed stream, and epochs thinned by a predicate (``len(stream)`` is then an upper
    bound).
    """
    if not isinstance(read_ahead, bool):
        raise ValueError(
            f"read_ahead must be True or False, got {read_ahead!r}: records are read ahead in "
            "the stream's own blocks (the block size is no longer chosen here)"
        )
    if stream.plan().boundary.batch_size is None and read_ahead:
        return _record_blocks_dataset(stream, output_signature, nested)
    return _items_dataset(stream, output_signature, nested, read_ahead)


def _items_dataset(
    stream: Stream, output_signature: Any, nested: bool, read_ahead: bool
) -> tf.data.Dataset:
    """The stream's items one per Python call (batches: a few stacked per call with
    ``read_ahead``, unbatched in tf.data)."""
    plan = stream.plan()
    batched = plan.boundary.batch_size is not None
    if output_signature is None and plan.boundary.transform is None:
        template = _template_of(plan, nested)
        fields = _fields_of(plan)
        _check_fields(fields)
        signature = _fill(template, {name: _spec(f, batched) for name, f in fields.items()})
        converters = {name: _converter(f, batched) for name, f in fields.items()}
        to_tf = _schema_converter(template, converters, plan.boundary.ngram is not None)
    else:
        if output_signature is None:
            output_signature = _spec_of(_sample(stream), batched)
        signature = output_signature

        def to_tf(item: Any) -> Any:
            return _to_signature(item, signature)

    def items(of: Stream) -> Iterator[Any]:
        for item in iter(of):  # each iter() is the stream's next epoch
            yield to_tf(item)

    dense = all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(signature))
    if read_ahead and batched and dense and not _empty_values(signature):
        group_signature = tf.nest.map_structure(
            lambda spec: tf.TensorSpec((None, *spec.shape), spec.dtype), signature
        )
        if output_signature is None and _plain_batches(plan):
            # Blocks of whole batches as the stream reads them, reshaped to (batches, batch,
            # ...) without a copy: Python runs once per block, tf.data cuts the batches.
            def groups(of: Stream) -> Iterator[Any]:
                return _batch_groups(of, to_tf)
        else:

            def groups(of: Stream) -> Iterator[Any]:
                return _groups(items(of))

        dataset = _epochs(stream, groups, group_signature, lambda d: d.unbatch())
        return dataset.prefetch(tf.data.AUTOTUNE)
    dataset = _epochs(stream, items, signature)
    if read_ahead:
        return dataset.prefetch(tf.data.AUTOTUNE)
    # tf.data would otherwise add a prefetch, and run the maps a user adds in parallel, and so
    # read items ahead of the consumer (model.fit included), moving stream.offset past what
    # was taken. These options carry on to the datasets made from this one.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    return dataset.with_options(options)


def _epochs(
    stream: Stream,
    epoch: Callable[[Stream], Iterator[Any]],
    signature: Any,
    per_element: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
) -> tf.data.Dataset:
    """The dataset whose every iteration is ``epoch(stream)`` (with ``per_element``
    applied), with the cardinality ``len(stream)`` and no check that an iteration has that many
    elements; but an iteration Keras makes only to build the model reads without moving the
    stream (``keras_build.unmoved``).

    tf.data can only assert a cardinality (and fails an iteration that ends early: a resumed
    epoch, a predicate's epoch); ``take(n)`` of an infinite dataset states it without a check.
    So the generator is repeated forever, and when an epoch that yielded something ends,
    tf.data's ``repeat()`` asks it once more, in the same call, and gets an empty generator:
    that ends the repeat, and the iteration, right there (a first, empty pass of the input ends
    ``repeat()``). An empty epoch ends the repeat by itself.
    """
    ended = False  # the last epoch ran out: the next call is repeat()'s, to be ended

    def generate() -> Iterator[Any]:
        nonlocal ended
        if ended:
            ended = False
            return
        if a_thread_builds_the_model():
            # Epoch after epoch, ended by take(): Keras drops the iteration after one batch
            # while tf.data may still read ahead in it; an end here would have repeat() ask
            # for another epoch, maybe once Keras is no longer building: the stream's own.
            offset = stream.plan().offset_of(*stream.next_epoch_position)
            yield from unmoved(stream, offset, epoch)
            return
        handed = False
        for element in epoch(stream):
            handed = True
            yield element
        ended = handed

    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature).repeat()
    if per_element is not None:
        dataset = per_element(dataset)
    return dataset.take(len(stream))


def _empty_values(signature: Any) -> bool:
    """Whether some value of the signature has a dim of 0: tf.data's ``unbatch`` crashes the
    process on those (a segmentation fault in TensorFlow), so they are handed over whole."""
    return any(0 in spec.shape.as_list() for spec in tf.nest.flatten(signature))


def _plain_batches(plan: StreamPlan) -> bool:
    """Whether the stream's batches are plain runs of records (``stream.iter_blocks()`` gives
    them in blocks of whole batches)."""
    boundary = plan.boundary
    return not boundary.filtered and boundary.transform is None and boundary.ngram is None


def _batch_groups(stream: Stream, to_tf: Callable[[Any], Any]) -> Iterator[Any]:
    """The stream's next epoch as groups of batches: each block of whole batches (its columns
    through ``to_tf``) shaped ``(batches, batch_size, ...)``; a short last batch on its own."""
    size = stream.batch_size
    assert size is not None
    for block in stream.iter_blocks():
        columns = to_tf(block.columns)
        whole = len(block) - len(block) % size
        if whole:
            yield _grouped(columns, 0, whole, size)
        if whole < len(block):
            yield _grouped(columns, whole, len(block), len(block) - whole)


def _grouped(columns: Any, start: int, stop: int, size: int) -> Any:
    """Rows ``[start, stop)`` of every column, as arrays ``(batches, size, ...)``: views, no
    copy."""

    def cut(column: Any) -> np.ndarray:
        rows = np.asarray(column)[start:stop]
        return rows.reshape(len(rows) // size, size, *rows.shape[1:])

    return tf.nest.map_structure(cut, columns)


def _groups(batches: Iterator[Any]) -> Iterator[Any]:
    """Consecutive batches of equal size, stacked a few at a time (tf.data unbatches them)."""
    group: list[Any] = []
    limit = _GROUP_BATCHES
    for batch in batches:
        leaves = tf.nest.flatten(batch)
        if group and (len(group) == limit or len(leaves[0]) != len(tf.nest.flatten(group[0])[0])):
            yield _stacked(group)
            group = []
        if not group:
            size = sum(np.asarray(leaf).nbytes for leaf in leaves)
            limit = max(1, min(_GROUP_BATCHES, _GROUP_BYTES // max(size, 1)))
        group.append(batch)
    if group:
        yield _stacked(group)


def _stacked(group: list[Any]) -> Any:
    return tf.nest.map_structure(lambda *leaves: np.stack(leaves), *group)


# --- records: blocks read in Python, unbatched in tf.data ---


def _record_blocks_dataset(stream: Stream, output_signature: Any, nested: bool) -> tf.data.Dataset:
    # The record signature as record mode has it; a block carries a variable-shape value as its
    # flat values (ragged rows) and its shape, so that every record, empty ones included, comes
    # back with its own shape.
    plan = stream.plan()
    if output_signature is None and plan.boundary.transform is None:
        template = _template_of(plan, nested)
        fields = _fields_of(plan)
        _check_fields(fields)
        specs = {name: _spec(f, False) for name, f in fields.items()}
        signature = _fill(template, specs)
        converters = {
            name: _flat_converter(f) if None in f.shape else _converter(f, True)
            for name, f in fields.items()
        }
        to_tf = _schema_converter(template, converters, plan.boundary.ngram is not None)

        def block_to_tf(block: Any) -> Any:
            if block.columns is not None:
                columns = block.columns
            elif plan.boundary.ngram is None:
                # A mixture's records hold their own source's fields: the signature has those
                # all its sources share (plan.fields).
                columns = collate([{name: item[name] for name in fields} for item in block.items])
            else:
                columns = collate(block.items)
            return to_tf(columns)

    else:
        signature = output_signature
        if signature is None:
            signature = _spec_of(_sample(stream), False)

        def block_to_tf(block: Any) -> Any:
            return _to_batch_signature(block.items, signature)

    if _empty_values(signature):
        return _items_dataset(stream, output_signature, nested, read_ahead=True)
    block_signature = tf.nest.map_structure(_batched_spec, signature)

    def blocks(of: Stream) -> Iterator[Any]:
        for block in of.iter_blocks():  # each call is the stream's next epoch
            yield block_to_tf(block)

    def per_record(dataset: tf.data.Dataset) -> tf.data.Dataset:
        dataset = dataset.unbatch()
        if dataset.element_spec == signature:
            return dataset

        # Variable shapes: a map per record (it costs).
        def shaped(value: Any, spec: Any) -> Any:
            if isinstance(spec, Mapping):
                return {k: shaped(value[k], s) for k, s in spec.items()}
            if isinstance(spec, tuple):
                return tuple(shaped(v, s) for v, s in zip(value, spec))
            if isinstance(value, tuple):  # (flat values, shape) of a variable-shape value
                flat, shape = value
                value = tf.ensure_shape(tf.reshape(flat, shape), spec.shape)
            return value

        def record(*item: Any) -> Any:
            # tf.data passes a tuple element as separate arguments.
            value = item if isinstance(signature, tuple) else item[0]
            return shaped(value, signature)

        return dataset.map(record)

    dataset = _epochs(stream, blocks, block_signature, per_record)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _batched_spec(spec: Any) -> Any:
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


def _flat_converter(f: Field) -> Callable[[Any], Any]:
    dtype = np.dtype(np.int64) if f.dtype.kind in "mM" else f.dtype
    return lambda column: _flat_and_shapes(column, dtype)


def _to_batch_signature(value: Any, spec: Any) -> Any:
    """A batch of transform outputs shaped for the read_ahead batch signature of ``spec``."""
    if isinstance(spec, Mapping):
        if isinstance(value, list):
            value = collate(value)
        return {k: _to_batch_signature(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tuple):
        if isinstance(value, list):
            value = tuple(collate(list(column)) for column in zip(*value))
        return tuple(_to_batch_signature(v, s) for v, s in zip(value, spec))
    if isinstance(spec, tf.TensorSpec) and None in spec.shape.as_list():
        return _flat_and_shapes(list(value), np.dtype(spec.dtype.as_numpy_dtype))
    return _to_signature(value, _batched_spec(spec))


# --- the structure ---


def _fields_of(plan: StreamPlan) -> dict[str, Field]:
    """The fields items hold, by output name ("<offset>/<field>" for n-grams)."""
    if plan.boundary.ngram is None:
        return {f.name: f for f in plan.fields}
    groups = plan.boundary.ngram.resolve(plan.source.schema)
    return {f"{offset}/{f.name}": f for offset, fields in groups.items() for f in fields}


def _template_of(plan: StreamPlan, nested: bool) -> Template:
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


def _fill(template: Template, values: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        return values[template]
    if isinstance(template, tuple):
        return tuple(_fill(t, values) for t in template)
    return {k: _fill(t, values) for k, t in template.items()}


def _schema_converter(
    template: Template, converters: dict[str, Callable[[Any], Any]], ngram: bool
) -> Callable[[Any], Any]:
    if ngram:

        def convert_window(item: Any) -> Any:
            flat = {
                f"{offset}/{name}": value
                for offset, group in item.items()
                for name, value in group.items()
            }
            return _fill(template, {k: converters[k](v) for k, v in flat.items()})

        return convert_window

    def convert(item: Any) -> Any:
        # (The converters' fields: a mixture's record may hold more, those of its source.)
        return _fill(template, {k: to_tf(item[k]) for k, to_tf in converters.items()})

    return convert


# --- fields: spec and value conversion ---


def _check_fields(fields: Mapping[str, Field]) -> None:
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


def _spec(f: Field, batched: bool) -> tf.TypeSpec:
    dtype = _tf_dtype(f)
    if not batched:
        return tf.TensorSpec(f.shape, dtype)
    if None in f.shape:
        return tf.RaggedTensorSpec(
            (None, *f.shape), dtype, ragged_rank=_ragged_rank(f.shape), row_splits_dtype=tf.int64
        )
    return tf.TensorSpec((None, *f.shape), dtype)


def _converter(f: Field, batched: bool) -> Callable[[Any], Any]:
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


def _sample(stream: Stream) -> Any:
    """The transform's output for the first record(s) of the stream that pass its predicate."""
    now = stream.next_epoch_position
    plan = stream.plan()
    # The next epoch too: what is left of this one may be nothing (a resume at its very end).
    for epoch, first in (now, (now[0] + 1, 0)):
        stop = min(plan.epoch_length(epoch), first + _SAMPLE_POSITIONS)
        for start in range(first, stop, 64):
            block = plan.read(epoch, start, min(start + 64, stop))
            if block.items:
                return block.items[0]
    raise ValueError(
        "cannot infer the output signature of the transform: no record among the first "
        f"{_SAMPLE_POSITIONS} passes the predicate; pass output_signature="
    )


def _spec_of(value: Any, batched: bool) -> Any:
    """The signature of a transform's output for one record."""
    if isinstance(value, Mapping):
        return {k: _spec_of(v, batched) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_spec_of(v, batched) for v in value)
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


def _to_signature(value: Any, spec: Any) -> Any:
    """``value`` shaped for ``spec``: tuples of lists transposed, lists stacked or made ragged."""
    if isinstance(spec, Mapping):
        if isinstance(value, list):  # a batch of non-dict items the stream could not collate
            value = collate(value)
        return {k: _to_signature(value[k], s) for k, s in spec.items()}
    if isinstance(spec, tuple):
        if isinstance(value, list):  # a batch of tuples: one column per tuple position
            value = tuple(collate(list(column)) for column in zip(*value))
        return tuple(_to_signature(v, s) for v, s in zip(value, spec))
    if isinstance(spec, tf.RaggedTensorSpec) and isinstance(value, (list, np.ndarray)):
        arrays = [np.asarray(v) for v in value]
        inner = arrays[0].shape[spec.ragged_rank :] if arrays else ()
        return ragged(arrays, spec.ragged_rank, inner, np.dtype(spec.dtype.as_numpy_dtype))
    if isinstance(spec, tf.TensorSpec) and isinstance(value, list):
        if spec.dtype == tf.string:
            return np.array(value, dtype=object)
        return np.stack([np.asarray(v) for v in value])
    return value
