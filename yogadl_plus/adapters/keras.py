"""``ydl.keras``: a batching Stream as a ``keras.utils.PyDataset`` for ``model.fit``, and
Keras's ``BackupAndRestore`` that also backs up and restores the stream's position."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from yogadl_plus.adapters.keras_backup import BackupAndRestore
from yogadl_plus.adapters.keras_build import builds_the_model
from yogadl_plus.columns import collate

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream

__all__ = ["BackupAndRestore", "StreamSequence"]

_ENDED = object()  # what next() gives for an epoch's iteration that has ended


class StreamSequence(keras.utils.PyDataset):
    """The stream's batches as ``(x, y)`` (or ``x`` alone when ``y`` is None), for
    ``model.fit``, ``evaluate`` and ``predict``.

    ``x`` is a field name (the batch array) or a list of names (a dict name -> array, for
    models with named inputs); None means every field but ``y`` (one array when that is a single
    field). ``y`` is a field name or None. A stream whose transform returns tuples gives those
    tuples, column-stacked, when ``x`` and ``y`` are None. ``max_queue_size`` goes to
    ``PyDataset``.

    Each Keras epoch is one iteration of the stream (its next epoch), with every backend
    (the batch Keras reads to build the model is read as outside an epoch), handed over in the
    stream's order: inside an epoch (between Keras's ``on_epoch_begin`` and ``on_epoch_end``),
    the n-th batch Keras asks for is the stream's n-th, whatever index it asks with. So
    Keras's batch shuffle (``fit(shuffle=True)``, its default) has no effect: the stream
    already shuffles, record by record, which is the better shuffle. Keras's own worker threads
    and processes would ask out of order and are refused; read ahead with the stream's
    ``num_workers``. Outside an epoch (and once an epoch's batches are all handed out: a fit
    that raised leaves its epoch open), ``sequence[i]`` is the ``i``-th batch the stream will
    hand out from where it stands (past the rest of a resumed epoch, the next epoch's), read
    without moving anything.

    The stream's ledger records what each epoch handed out, so ``stream.offset_after(epoch,
    batches trained)`` resumes exactly; ``ydl.keras.BackupAndRestore`` does that for
    ``model.fit``. ``len()`` is ``len(stream)``, a whole epoch's batches, which Keras reads
    before training as every epoch's number of steps; inside the first epoch of a stream
    resumed mid-epoch it is that epoch's fewer batches, and Keras ends the epoch when they run
    out. Streams with a predicate are refused (Keras needs the exact number of
    batches), and n-gram streams without a transform (their batches are not field -> column):
    use ``ydl.tensorflow.make_tf_dataset`` for those.
    """

    def __init__(
        self,
        stream: Stream,
        x: str | Sequence[str] | None = None,
        y: str | None = None,
        **pydataset_kwargs: Any,
    ) -> None:
        if pydataset_kwargs.get("workers", 1) > 1 or pydataset_kwargs.get("use_multiprocessing"):
            raise ValueError(
                "StreamSequence hands batches over in the stream's order, and Keras's worker "
                "threads or processes would ask for them out of order: leave workers= and "
                "use_multiprocessing= out, and read ahead with dataref.stream(num_workers=...)"
            )
        super().__init__(**pydataset_kwargs)
        plan = stream.plan()
        if plan.boundary.batch_size is None:
            raise ValueError(
                "StreamSequence needs a batching stream: make it with "
                "dataref.stream(batch_size=...)"
            )
        if plan.boundary.filtered:
            raise ValueError(
                "a stream with a predicate or skip= has an unknown number of batches per epoch "
                "(len() is an upper bound) and Keras needs the exact number; use "
                "ydl.tensorflow.make_tf_dataset(stream) instead"
            )
        if plan.boundary.ngram is not None and plan.boundary.transform is None:
            raise ValueError(
                "n-gram batches are {offset: {field: ...}}: add a transform that turns a window "
                "into a dict of field -> value, or use ydl.tensorflow.make_tf_dataset"
            )
        if plan.boundary.transform is None:
            names = [f.name for f in plan.fields]
            wanted = ([x] if isinstance(x, str) else list(x or [])) + ([y] if y else [])
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise ValueError(f"no field(s) {unknown} in the stream; it has {names}")
        self.stream = stream
        self.plan = plan
        self.x = x
        self.y = y
        self._lock = threading.Lock()
        # The running epoch: the stream's iteration and its number of batches.
        self._batches: Iterator[Any] | None = None
        self._length = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_batches"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StreamSequence({self.stream!r}, x={self.x!r}, y={self.y!r})"

    # --- epochs ---

    def __len__(self) -> int:
        with self._lock:
            if self._batches is not None:
                return self._length
        # Outside an epoch, Keras asks once, before training, and takes the answer as every
        # epoch's number of steps: the whole epoch's (a resumed one ends when it runs out).
        return self.plan.items_per_epoch

    def on_epoch_begin(self) -> None:
        if builds_the_model(inspect.currentframe()):
            return  # (its batch is read as outside an epoch: nothing of the stream moves)
        with self._lock:
            self._length = self.plan.items_from(*self.stream.next_epoch_position)
            self._batches = iter(self.stream)  # the stream's next epoch

    def on_epoch_end(self) -> None:
        # Keras also calls this before its first epoch, to reset the dataset: nothing runs then.
        with self._lock:
            self._batches = None

    # --- batches ---

    def __getitem__(self, index: int) -> Any:
        with self._lock:
            if self._batches is not None:  # in an epoch: the next batch, whatever the index
                batch = next(self._batches, _ENDED)
                if batch is not _ENDED:
                    return self._item(batch)
                # Keras asks for no more than len() batches in an epoch, so this epoch was left
                # unfinished by a fit that raised (it never got on_epoch_end), and a new fit
                # samples batches for its signature before it resets the dataset: it gets
                # them as outside an epoch.
                self._batches = None
            epoch, start = self.stream.next_epoch_position
        count = self.plan.items_per_epoch
        i = int(index) + count if int(index) < 0 else int(index)
        if not 0 <= i < count:
            raise IndexError(f"batch index {index} is out of range [0, {count})")
        left = self.plan.items_from(epoch, start)
        if i >= left:  # (a resumed epoch has fewer: the next epoch's batches follow)
            epoch, start, i = epoch + 1, 0, i - left
        size = self.plan.boundary.batch_size
        assert size is not None
        first = start + i * size
        stop = min(first + size, self.plan.epoch_length(epoch))
        block = self.plan.read(epoch, first, stop)
        batch = block.columns if block.columns is not None else collate(block.items or [])
        return self._item(batch)

    def _item(self, batch: Any) -> Any:
        tuples = isinstance(batch, list) and bool(batch) and isinstance(batch[0], tuple)
        if tuples and self.x is None and self.y is None:  # a transform returning tuples
            return tuple(_array(collate(list(c)), str(j)) for j, c in enumerate(zip(*batch)))
        if not isinstance(batch, dict):
            raise TypeError(
                f"StreamSequence needs batches that are dicts of field -> column, got "
                f"{type(batch).__name__}; make the transform return a dict"
            )
        x: Any
        if self.x is None:
            names = [n for n in batch if n != self.y]
            if len(names) == 1:
                x = _array(batch[names[0]], names[0])
            else:
                x = {n: _array(batch[n], n) for n in names}
        elif isinstance(self.x, str):
            x = _array(batch[self.x], self.x)
        else:
            x = {n: _array(batch[n], n) for n in self.x}
        if self.y is None:
            return x
        return x, _array(batch[self.y], self.y)


def _array(column: Any, name: str) -> np.ndarray:
    """A batch column as one array for Keras (lists of equal-shape values are stacked)."""
    if isinstance(column, np.ndarray):
        return column
    if any(v is None for v in column):
        raise ValueError(f"field {name!r} holds None values, which Keras cannot take")
    if isinstance(column[0], (str, bytes)):
        return np.asarray(column)
    shapes = {np.shape(v) for v in column}
    if len(shapes) > 1:
        raise ValueError(
            f"field {name!r} has values of different shapes {sorted(shapes)[:3]} in one batch; "
            "pad them in a transform, or use ydl.tensorflow.make_tf_dataset (ragged tensors)"
        )
    return np.stack(column)
