"""``ydl.tensorflow``: a Stream as a ``tf.data.Dataset``.

``make_tf_dataset(stream)`` wraps the stream in ``tf.data.Dataset.from_generator`` with an
``output_signature`` built from the cached schema, so every iteration of the dataset is an
epoch of the stream: ``.repeat()`` gives the next epochs, in the stream's order. Records are
read in blocks and unbatched inside tf.data, and tf.data may prefetch: a consumer resumes
exactly with ``stream.offset_after(epoch, items consumed)``, which the stream answers from what
it handed out (``ydl.keras.BackupAndRestore`` does this by itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from yogadl_plus.adapters.keras_build import a_thread_builds_the_model, unmoved
from yogadl_plus.adapters.tensorflow_specs import (
    batched_spec,
    check_fields,
    field_converter,
    field_spec,
    fields_of,
    fill,
    flat_converter,
    schema_converter,
    spec_of,
    template_of,
    to_batch_signature,
    to_signature,
)

# (``yogadl_plus.adapters.tensorflow.ragged``, where it was before the specs had a module.)
from yogadl_plus.adapters.tensorflow_specs import ragged as ragged
from yogadl_plus.columns import collate

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream, StreamPlan

__all__ = ["make_tf_dataset"]

# Positions tried for one item when the signature of a transform's output is inferred.
_SAMPLE_POSITIONS = 4096
# Dense batches handed over per Python call (tf.data unbatches them): tf.data's per-call cost
# is then paid once per group; groups stay small enough to copy without notice.
_GROUP_BATCHES = 8
_GROUP_BYTES = 16 << 20


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
        template = template_of(plan, nested)
        fields = fields_of(plan)
        check_fields(fields)
        signature = fill(template, {name: field_spec(f, batched) for name, f in fields.items()})
        converters = {name: field_converter(f, batched) for name, f in fields.items()}
        to_tf = schema_converter(template, converters, plan.boundary.ngram is not None)
    else:
        if output_signature is None:
            output_signature = spec_of(_sample(stream), batched)
        signature = output_signature

        def to_tf(item: Any) -> Any:
            return to_signature(item, signature)

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
        template = template_of(plan, nested)
        fields = fields_of(plan)
        check_fields(fields)
        specs = {name: field_spec(f, False) for name, f in fields.items()}
        signature = fill(template, specs)
        converters = {
            name: flat_converter(f) if None in f.shape else field_converter(f, True)
            for name, f in fields.items()
        }
        to_tf = schema_converter(template, converters, plan.boundary.ngram is not None)

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
            signature = spec_of(_sample(stream), False)

        def block_to_tf(block: Any) -> Any:
            return to_batch_signature(block.items, signature)

    if _empty_values(signature):
        return _items_dataset(stream, output_signature, nested, read_ahead=True)
    block_signature = tf.nest.map_structure(batched_spec, signature)

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


# --- transforms: a sample to infer the signature from ---


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
