"""``ydl.keras.BackupAndRestore``: Keras's fault-tolerance callback, exact about the data.

Keras's ``BackupAndRestore`` saves the weights and the epoch; started again, ``fit`` begins that
epoch over with whatever data comes. This one also saves the stream's position, in the same
backup, and restores it before any data is read: the interrupted epoch finishes where it
stopped and every later epoch is whole.

A backup is switched in by two renames (the weights, then ``training_metadata.json``, which
carries the stream's position and the weights' digest), each prepared in full beside its
target first. A crash between the renames leaves new weights and the prepared metadata: the
next start finishes the switch. A crash before them leaves the old backup whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from typing import TYPE_CHECKING, Any, cast

import keras

from yogadl_plus.errors import CacheCorrupted
from yogadl_plus.files import file_sha256, fsync_dir
from yogadl_plus.stream.state import ADDED_ORDER_SETTINGS

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream

__all__ = ["BackupAndRestore"]

# Keras's own file names in backup_dir (keras.callbacks.BackupAndRestore).
WEIGHTS = "latest.weights.h5"
METADATA = "training_metadata.json"
PREVIOUS = ".bkp"  # Keras's suffix for double_checkpoint's previous backup
# Where the next backup is prepared before it is switched in (Keras wants ".weights.h5").
PENDING_WEIGHTS = "pending.weights.h5"
PENDING_METADATA = METADATA + ".pending"
# Our part of training_metadata.json.
KEY = "yogadl_plus"
# Keras's warning when an epoch's data ends before its cardinality: a resumed epoch, or one
# thinned by a predicate, ends early on purpose.
_RAN_OUT = r"Your input ran out of data"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore(backup_dir, **keras_kwargs)`` that also backs up the
    stream's position, atomically with Keras's files, and restores it before any data is read.

    Run the same script again after a crash anywhere: every record of every epoch is trained
    on exactly once (the interrupted epoch finishes, later epochs are whole), with
    ``model.fit(ydl.tensorflow.make_tf_dataset(stream), ...)`` or
    ``model.fit(ydl.keras.StreamSequence(stream, ...), ...)``. The stream must batch (one
    Keras step is one of its items) and ``steps_per_epoch`` must be left unset (each Keras
    epoch is then one epoch of the stream); make the stream the same way each run.

    Keras's arguments (``save_freq``: ``"epoch"`` or every ``n`` batches, ``double_checkpoint``,
    ``delete_checkpoint``) mean what they mean there, and ``backup_dir`` holds Keras's files
    (``latest.weights.h5``, ``training_metadata.json``, whose extra ``"yogadl_plus"`` entry
    holds the stream's offset). ``backup_dir`` is a local (or mounted) folder: the backup is
    switched in by renames. A backup made for another dataset, order or batch size is refused
    with a ``ValueError``; one whose weights are not the ones its metadata names raises
    ``CacheCorrupted``.

    After a restore, Keras's step counters, ``optimizer.iterations`` and every variable the
    model updates per call (a layer's, a metric's) move once per step trained, as in a run never
    interrupted: no part of a step runs past the end of an epoch's data
    (``on_train_batch_begin``).
    """

    def __init__(self, backup_dir: str, stream: Stream, **keras_kwargs: Any) -> None:
        super().__init__(backup_dir, **keras_kwargs)
        if "://" in str(backup_dir):
            raise ValueError(
                f"backup_dir must be a local or mounted folder (a backup is switched in by "
                f"renames), got {backup_dir!r}"
            )
        if stream.plan().boundary.batch_size is None:
            raise ValueError(
                "BackupAndRestore counts Keras steps as the stream's items: make the stream "
                "batch (dataref.stream(batch_size=...)) instead of batching records in tf.data"
            )
        self.stream = stream
        self._folder = os.fspath(backup_dir)
        self._keras_epoch = 0  # Keras's running epoch
        self._epoch = 0  # the stream's epoch it iterates
        self._steps = 0  # batches trained in it
        self._since_backup = 0  # batches trained since the last backup (save_freq=int)
        self._length: int | None = None  # the batches of the running epoch (None: unknown)
        self._resumed = False  # whether it begins mid-way
        self._quiet: tuple[Any, ...] | None = None

    # --- Keras's hooks ---

    def on_train_begin(self, logs: Any = None) -> None:
        self._finish_switch()
        super().on_train_begin(logs)  # Keras loads the weights and its epoch
        metadata = self._read(os.path.join(self._folder, METADATA))
        if metadata is not None:
            self._check(metadata)
            self.stream.seek(int(metadata[KEY]["offset"]))
        # Epochs end early on purpose here (see _RAN_OUT): Keras's warning would mislead.
        warnings.filterwarnings("ignore", message=_RAN_OUT, category=UserWarning)
        self._quiet = warnings.filters[0]

    def on_train_end(self, logs: Any = None) -> None:
        if self._quiet in warnings.filters:
            cast(list, warnings.filters).remove(self._quiet)  # a list, typed as a Sequence
        self._quiet = None
        super().on_train_end(logs)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._keras_epoch = epoch
        self._epoch, start = self.stream.next_epoch_position
        self._steps = 0
        plan = self.stream.plan()
        self._length = None if plan.boundary.filtered else plan.items_from(self._epoch, start)
        self._resumed = start > 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        # An epoch shorter than Keras's count of its steps (the rest of a resumed one, one
        # thinned by a predicate) ends when Keras's train function finds no data; with
        # TensorFlow that call still runs the parts of the step that do not wait for the data
        # (a layer's count of its calls, a metric's, the optimizer's step). So a call that may
        # find none takes its batch before the step runs.
        if _runs_the_step_without_data(self.model) and self._may_have_ended(batch):
            _take_the_batch_first(self.model)

    def _may_have_ended(self, batch: int) -> bool:
        """Whether the running epoch may have no batch ``batch`` (its 0-based step) for Keras."""
        if self._length is not None:  # known before the epoch ran
            return batch >= self._length
        # A predicate's epoch, known as it is read. Before its first step the stream has not
        # begun it: the rest of a resumed epoch may pass nothing, a whole epoch passes nothing
        # only if the predicate keeps none of its records (the stream warns). Then, a batch
        # the stream has handed out is on its way to Keras.
        if batch == 0:
            return self._resumed
        return self.stream.handed_out(self._epoch) <= batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        done = batch + 1
        if self._length is not None:
            # Keras numbers a call's last step as if it ran all its steps_per_execution; at an
            # epoch's end it ran those left. (A predicate's epoch has ended by then: the stream
            # takes a count past its end as the whole epoch.)
            done = min(done, self._length)
        if not self._steps and not self.stream.handed_out(self._epoch):
            raise ValueError(
                "BackupAndRestore: Keras trained a step, but the stream it backs up has handed "
                "out nothing of its epoch, so fit reads the data from elsewhere (a torch "
                "DataLoader of make_dataloader keeps a place of its own): its backups would "
                "resume at the wrong records. Give fit ydl.tensorflow.make_tf_dataset(stream) "
                "or ydl.keras.StreamSequence(stream), or with a torch loader save its "
                "state_dict() with your checkpoints instead"
            )
        self._since_backup += done - self._steps
        self._steps = done
        if self.save_freq != "epoch" and self.save_freq and self._since_backup >= self.save_freq:
            self._back_up(self._keras_epoch, finished=False)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.save_freq == "epoch":
            self._back_up(epoch, finished=True)

    # --- backing up ---

    def _back_up(self, keras_epoch: int, finished: bool) -> None:
        self._since_backup = 0
        end = self.stream.offset_after(self._epoch)
        offset = end if finished else self.stream.offset_after(self._epoch, self._steps)
        metadata: dict[str, Any]
        if offset == end:  # the stream's epoch is done: the backup is of the next one's start
            metadata = {"epoch": keras_epoch + 1, "batch": 0}
        else:
            metadata = {"epoch": keras_epoch, "batch": self._steps - 1}
        os.makedirs(self._folder, exist_ok=True)
        pending_weights = os.path.join(self._folder, PENDING_WEIGHTS)
        self.model.save_weights(pending_weights, overwrite=True)
        _sync_file(pending_weights)
        metadata[KEY] = {
            "offset": offset,
            "stream": _identity(self.stream),
            # A mixture's stages: checked as far as the backup read (StreamPlan.check_state).
            "schedule": self.stream.state().schedule,
            "weights_sha256": file_sha256(pending_weights),
        }
        pending_metadata = os.path.join(self._folder, PENDING_METADATA)
        with open(pending_metadata, "w") as f:
            json.dump(metadata, f)
            f.flush()
            os.fsync(f.fileno())
        weights = os.path.join(self._folder, WEIGHTS)
        current = os.path.join(self._folder, METADATA)
        if self.double_checkpoint and os.path.exists(current):
            shutil.copyfile(weights, weights + PREVIOUS)
            shutil.copyfile(current, current + PREVIOUS)
        os.replace(pending_weights, weights)
        os.replace(pending_metadata, current)
        fsync_dir(self._folder)

    def _finish_switch(self) -> None:
        """Finish a backup that a crash cut between its two renames; drop one cut before."""
        pending = os.path.join(self._folder, PENDING_METADATA)
        metadata = self._read(pending)
        weights = os.path.join(self._folder, WEIGHTS)
        if metadata is not None and _digest_or_none(weights) == metadata[KEY]["weights_sha256"]:
            os.replace(pending, os.path.join(self._folder, METADATA))
            fsync_dir(self._folder)
        for name in (PENDING_METADATA, PENDING_WEIGHTS):
            path = os.path.join(self._folder, name)
            if os.path.exists(path):
                os.remove(path)

    # --- restoring ---

    def _read(self, path: str) -> dict[str, Any] | None:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        try:
            metadata = json.loads(text)
            position = metadata[KEY]
            int(position["offset"])
            str(position["weights_sha256"])
            dict(position["stream"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CacheCorrupted(
                f"{path} is not a backup of ydl.keras.BackupAndRestore ({type(exc).__name__}: "
                f"{exc}): it holds no stream position (a backup of keras.callbacks."
                "BackupAndRestore, or a damaged file); move backup_dir aside to start over"
            ) from None
        return metadata

    def _check(self, metadata: dict[str, Any]) -> None:
        position = metadata[KEY]
        saved = position["stream"]
        if "fingerprint" not in saved:
            raise ValueError(
                f"the backup in {self._folder} was made by an earlier release of yogadl_plus, "
                "whose backups do not say which build they read: move backup_dir aside to start "
                "over "
                "(or resume from its 'offset' with dataref.stream(start_offset=...))"
            )
        now = _identity(self.stream, saved.get("order"))
        differ = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        if differ:
            what = "; ".join(f"{k}: backed up {a!r}, now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(
                f"the backup in {self._folder} was made for another stream ({what}): make the "
                "stream as the run that backed up did, or use another backup_dir"
            )
        backed_up = dataclasses.replace(
            self.stream.state(), offset=int(position["offset"]), schedule=position.get("schedule")
        )
        try:
            self.stream.plan().check_state(backed_up)
        except ValueError as exc:
            raise ValueError(f"the backup in {self._folder}: {exc}") from None
        weights = os.path.join(self._folder, WEIGHTS)
        if _digest_or_none(weights) != position["weights_sha256"]:
            raise CacheCorrupted(
                f"{weights} is not the file that {METADATA} beside it was saved with (its "
                "SHA-256 differs): the backup cannot be trusted; move backup_dir aside to start "
                "over"
            )


def _identity(stream: Stream, saved_order: Any = None) -> dict[str, Any]:
    """What must be the same for an offset to mean the same records (the stream's state but
    its offset), and for Keras's step counts to mean the same batches. Against a backup's
    ``saved_order``: without the order settings added since, where they hold the value it
    implies."""
    identity = stream.state().identity()
    order = identity["order"]
    if isinstance(saved_order, str):
        named = {part.split("=", 1)[0] for part in saved_order.split(", ")}
        for name, value in ADDED_ORDER_SETTINGS.items():
            if name not in named and order.get(name) == value:
                order = {k: v for k, v in order.items() if k != name}
    # The order as one line of settings, so a message names the one that differs
    # ("shuffle_seed=4").
    identity["order"] = ", ".join(f"{k}={v!r}" for k, v in order.items())
    plan = stream.plan()
    return {
        **identity,
        "batch_size": plan.boundary.batch_size,
        "drop_last": plan.boundary.drop_last,
    }


def _runs_the_step_without_data(model: Any) -> bool:
    """Whether Keras's call of its train function that finds no data runs a part of the step:
    with TensorFlow, one step per call (``steps_per_execution=1``) is run on the data's
    iterator's next batch, and a step's operations that do not wait for it run all the same.
    (Several steps per call run only on batches they have; the other backends take the batch
    before the call, and make no call without one.)"""
    return keras.backend.backend() == "tensorflow" and model.steps_per_execution == 1


def _take_the_batch_first(model: Any) -> None:
    """Make Keras's next call of ``model.train_function`` take its batch from the iterator
    before any of the step runs (see _BatchFirst)."""
    if not isinstance(model.train_function, _BatchFirst):  # (one left by a fit that raised)
        model.train_function = _BatchFirst(model, model.train_function)


class _BatchFirst:
    """Keras's train function (TensorFlow's, which takes the data's iterator) for one call that
    takes its batch before any of the step runs: without one, it ends the epoch as Keras's own
    function does when the data has ended (``StopIteration``); with one, the step is trained
    on it. Then the model's function is Keras's own again."""

    def __init__(self, model: Any, train: Any) -> None:
        self.model = model
        self.train = train

    def __call__(self, iterator: Any) -> Any:
        self.model.train_function = self.train
        batch = iterator.get_next_as_optional()
        if not batch.has_value():
            raise StopIteration
        return self.train(iter([batch.get_value()]))  # (as Keras's train_on_batch calls it)


def _digest_or_none(path: str) -> str | None:
    try:
        return file_sha256(path)
    except FileNotFoundError:
        return None


def _sync_file(path: str) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
