"""``ydl.keras``: a batching Stream as a ``keras.utils.PyDataset`` for ``model.fit``."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from yogadl_plus.boundary import collate

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream

__all__ = ["StreamSequence"]


class StreamSequence(keras.utils.PyDataset):
    """Batch ``i`` of the stream's current epoch as ``(x, y)`` (or ``x`` alone when ``y`` is
    None), for ``model.fit``, ``evaluate`` and ``predict``.

    ``x`` is a field name (the batch array) or a list of names (a dict name -> array, for
    models with named inputs); None means every field but ``y`` (one array when that is a single
    field). ``y`` is a field name or None. A stream whose transform returns tuples gives those
    tuples, column-stacked, when ``x`` and ``y`` are None. ``pydataset_kwargs`` (``workers``,
    ``use_multiprocessing``, ``max_queue_size``) go to ``PyDataset``.

    Epochs: ``on_epoch_end()`` moves to the stream's next epoch. Keras' ``fit`` and
    ``evaluate`` also call it once before their first epoch, to reset the dataset; that call is
    recognized (no ``on_epoch_begin`` came before it, and one comes right after it) and does
    not skip an epoch.

    Batch ``i`` is read by index, as the stream would read it (the order is a pure function
    of epoch and position): any order costs the same, so Keras' batch-order shuffle, worker
    threads (``workers=``) and processes (``use_multiprocessing=True``) all work. The
    stream's own ``num_workers`` pool is not used, and ``stream.offset`` does not move.

    ``len()`` is the number of batches left in the current epoch: ``len(stream)``, except in
    the first epoch of a stream resumed mid-epoch (``start_offset``), which is shorter. Keras
    reads the length once per ``fit``, so finish such an epoch with its own ``fit(...,
    epochs=1)`` call. Streams with a predicate are refused (Keras needs the exact number of
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
        super().__init__(**pydataset_kwargs)
        if stream.batch_size is None:
            raise ValueError(
                "StreamSequence needs a batching stream: make it with "
                "dataref.stream(batch_size=...)"
            )
        if stream.predicate is not None:
            raise ValueError(
                "a stream with a predicate has an unknown number of batches per epoch (len() is "
                "an upper bound) and Keras needs the exact number; use "
                "ydl.tensorflow.make_tf_dataset(stream) instead"
            )
        if stream.ngram is not None and stream.transform is None:
            raise ValueError(
                "n-gram batches are {offset: {field: ...}}: add a transform that turns a window "
                "into a dict of field -> value, or use ydl.tensorflow.make_tf_dataset"
            )
        if stream.transform is None:
            names = [f.name for f in stream.fields]
            wanted = ([x] if isinstance(x, str) else list(x or [])) + ([y] if y else [])
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise ValueError(f"no field(s) {unknown} in the stream; it has {names}")
        self.stream = stream
        self.x = x
        self.y = y
        self._lock = threading.Lock()
        self._epoch, self._start = stream.next_epoch_position  # where the first batch starts
        self._begun = False
        self._pending_end: tuple[int, int] | None = None  # (thread id, unpaired ends)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StreamSequence({self.stream!r}, x={self.x!r}, y={self.y!r})"

    # --- epochs ---

    def __len__(self) -> int:
        with self._lock:
            self._settle()
            return self._length()

    def _length(self) -> int:
        positions = max(self.stream.order.epoch_shard_length(self._epoch) - self._start, 0)
        size = self.stream.batch_size
        assert size is not None
        return positions // size if self.stream.drop_last else -(-positions // size)

    def on_epoch_begin(self) -> None:
        with self._lock:
            self._pending_end = None  # an end right before a begin was Keras resetting
            self._begun = True

    def on_epoch_end(self) -> None:
        with self._lock:
            if self._begun:
                self._begun = False
                self._next_epoch()
            else:
                ends = self._pending_end[1] if self._pending_end else 0
                self._pending_end = (threading.get_ident(), ends + 1)

    def _settle(self) -> None:
        """Apply the on_epoch_end calls this thread made without on_epoch_begin: a user ending
        epochs by hand (Keras' own reset call is followed by on_epoch_begin, which drops it;
        its worker threads asking for batches meanwhile still get the current epoch)."""
        pending = self._pending_end
        if pending is not None and pending[0] == threading.get_ident():
            self._pending_end = None
            for _ in range(pending[1]):
                self._next_epoch()

    def _next_epoch(self) -> None:
        self._epoch += 1
        self._start = 0

    # --- batches ---

    def __getitem__(self, index: int) -> Any:
        with self._lock:
            self._settle()
            epoch, start, count = self._epoch, self._start, self._length()
        i = int(index) + count if int(index) < 0 else int(index)
        if not 0 <= i < count:
            raise IndexError(f"batch index {index} is out of range [0, {count})")
        size = self.stream.batch_size
        assert size is not None
        first = start + i * size
        stop = min(first + size, self.stream.order.epoch_shard_length(epoch))
        block = self.stream.reader((first, self.stream.order.indices(epoch, first, stop)))
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
