"""Whether Keras is reading batches only to build the model, which it then drops, and what to
hand it then.

Keras builds a model (its variables, its metrics' and loss's) on the shapes of a real batch, and
reads that batch from an iteration of the data of its own, before the epochs:

- ``fit`` and ``evaluate`` with the torch and JAX backends, and any backend's for a model not
  built yet (``Trainer._symbolic_build``);
- every ``fit`` and ``evaluate`` with TensorFlow under a distribution strategy
  (``_maybe_symbolic_build``);
- ``predict`` with JAX, for a model not built yet (inline in its ``predict``).

With the TensorFlow backend, Keras also reads the first batches of a torch DataLoader to learn
their signature, from an iteration of its own, at every ``fit``, ``evaluate`` and ``predict``
(``TorchDataLoaderAdapter.get_tf_dataset``). And at the end of each epoch, Keras makes the
data's iterator for the next one, which it drops unread and makes again as that epoch begins
(``makes_an_iterator_to_drop``).

A face whose every iteration is the stream's next epoch would spend an epoch on those batches.
The faces ask here, and hand them over without moving the stream (``unmoved``). Keras's
functions are known by name and module (``keras.*``), so a Keras that renames them is missed:
the tests run fit, evaluate and predict on each backend against the stream's epochs.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from types import FrameType

    from yogadl_plus.stream import Stream

__all__ = [
    "a_thread_builds_the_model",
    "builds_the_model",
    "makes_an_iterator_to_drop",
    "unmoved",
    "until_an_empty_epoch",
]

T = TypeVar("T")

# Keras's functions that read a batch only to build the model (see the module).
_BUILDERS = ("_symbolic_build", "_maybe_symbolic_build")
_JAX_TRAINER = "keras.src.backend.jax.trainer"
# Where the TensorFlow backend reads a torch DataLoader's first batches for their signature.
_TORCH_TO_TF = ("keras.src.trainers.data_adapters.torch_data_loader_adapter", "get_tf_dataset")
# Where Keras makes the data's iterator for each epoch, and for the next at an epoch's end.
_EPOCH_ITERATOR = ("keras.src.trainers.epoch_iterator", "_enumerate_iterator")


def builds_the_model(frame: FrameType | None) -> bool:
    """Whether the call stack from ``frame`` outwards is Keras reading a batch only to build
    the model (or to learn the batches' signature)."""
    return any(map(_reads_to_build, _outwards(frame)))


def a_thread_builds_the_model() -> bool:
    """Whether a thread of this process is in Keras reading a batch only to build the model
    (or to learn the batches' signature).

    For tf.data, whose generators run in TensorFlow's threads, not in the one that waits for the
    batch: while Keras waits for the first batch of its build's iteration, that iteration's
    generator is called (a torch DataLoader's too, which Keras's TensorFlow backend iterates in
    a tf.data generator)."""
    return any(builds_the_model(frame) for frame in sys._current_frames().values())


def makes_an_iterator_to_drop(frame: FrameType | None) -> bool:
    """Whether the call stack from ``frame`` outwards is Keras making, at an epoch's end, the
    data's iterator for the next epoch, which it drops unread and makes again as that epoch
    begins (``EpochIterator._enumerate_iterator``, where ``steps_per_epoch`` is not given).

    Only an iterator that reads as it is made notices: a torch DataLoader's with workers asks
    its sampler for the indices of its first batches right away."""
    for outer in _outwards(frame):
        if (outer.f_globals.get("__name__"), outer.f_code.co_name) == _EPOCH_ITERATOR:
            # (The epoch's own iterator is made before its loop over the steps binds ``step``.)
            epoch_iterator = outer.f_locals.get("self")
            given = getattr(epoch_iterator, "steps_per_epoch", None) is not None
            return not given and "step" in outer.f_locals
    return False


def _outwards(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _reads_to_build(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__")
    if not isinstance(module, str) or not module.startswith("keras."):
        return False
    name = frame.f_code.co_name
    if name in _BUILDERS or (module, name) == _TORCH_TO_TF:
        return True
    # JAX's predict reads its batch for a model not built yet in predict itself, before
    # predicting; once the batch has built it, the model is built.
    if name == "predict" and module == _JAX_TRAINER:
        return not getattr(frame.f_locals.get("self"), "built", True)
    return False


def unmoved(
    stream: Stream, offset: int, epoch: Callable[[Stream], Iterable[T]] = iter
) -> Iterator[T]:
    """For an iteration Keras makes only to build the model: what ``stream`` hands out from
    ``offset`` on (its ``start_offset``), ``epoch(copy)`` after ``epoch(copy)``, read by a copy
    of it, so that the stream does not move and its ledger and stats hold nothing of it.

    Keras drops the iteration once it has its batches, so it need not end, and must not where
    a face's end of an iteration would begin the next (tf.data's ``repeat()``). Epoch after
    epoch, the batches are those training begins with, also where the next epoch to read has
    nothing left (a state saved after an epoch's last batch). Only an epoch with nothing to
    hand out ends it."""
    copy = stream.replace(num_workers=0)  # (reads inline: no worker pool of its own)
    copy.seek(offset)
    return until_an_empty_epoch(epoch(copy) for _ in itertools.count())


def until_an_empty_epoch(epochs: Iterable[Iterable[T]]) -> Iterator[T]:
    """The elements of ``epochs``, one epoch after the other, up to the first that has none."""
    for elements in epochs:
        handed = False
        for element in elements:
            handed = True
            yield element
        if not handed:
            return
