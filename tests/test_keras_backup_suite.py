"""Keras's own tests of ``keras.callbacks.BackupAndRestore`` (its
``callbacks/backup_and_restore_test.py``), ported to ``ydl.keras.BackupAndRestore`` over a stream
and run through both faces: ``make_tf_dataset(stream)`` and ``StreamSequence(stream, ...)``.

The data and model are Keras's: 10 records in batches of 4 (3 steps an epoch: 4, 4 and 2
records), and a ``CanaryLayer`` that counts its own calls. Where Keras restarts an interrupted
epoch from its first batch, ydl finishes it from the next untrained one, so the expected counts
differ: interrupted after 2 steps with ``save_freq=1``, ``fit(epochs=5)`` ends at exactly
2 + 1 + 4 * 3 = 15 calls, where Keras's own test expects 17. Beside the canary, every test
counts, exactly, the optimizer's steps, a metric that counts its updates (reset each epoch),
and which records each epoch trained on.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import yogadl_plus as ydl  # noqa: E402

RECORDS, BATCH, STEPS = 10, 4, 3  # STEPS: an epoch's batches
FACES = ["tf", "sequence"]

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # (Keras's, on numpy 2)
    pytest.mark.filterwarnings("ignore:`shuffle=True` was passed"),  # (tf.data: not shuffled)
]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    ids = np.arange(RECORDS, dtype=np.float32)
    x = np.stack([ids, ids % 3, np.ones(RECORDS, np.float32)], axis=1)
    records = ({"x": x[i], "y": np.float32(i % 2)} for i in range(RECORDS))
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("keras-backup"))
    return ydl.cache_dataset(records, "canary", "v1", storage, progress=False)


def stream_of(ref, **kwargs):
    return ref.stream(shuffle=True, shuffle_seed=5, batch_size=BATCH, **kwargs)


def data_of(stream, face):
    if face == "tf":
        return ydl.tensorflow.make_tf_dataset(stream).map(lambda b: (b["x"], b["y"]))
    return ydl.keras.StreamSequence(stream, x="x", y="y")


def epochs_ids(ref, first, stop, **kwargs):
    """The record ids of the stream's epochs ``first`` to ``stop - 1``, batch by batch, as an
    uninterrupted run has them."""
    return [
        batch["x"][:, 0].astype(int).tolist()
        for epoch in range(first, stop)
        for batch in stream_of(ref, start_offset=epoch * RECORDS, **kwargs)
    ]


# --- Keras's test helpers, as they are there ---


class InterruptingCallback(keras.callbacks.Callback):
    """A callback to intentionally interrupt training."""

    def __init__(self, steps_int, epoch_int):
        super().__init__()
        self.batch_count = 0
        self.epoch_count = 0
        self.steps_int = steps_int
        self.epoch_int = epoch_int

    def on_epoch_end(self, epoch, log=None):
        self.epoch_count += 1
        if self.epoch_int is not None and self.epoch_count == self.epoch_int:
            raise RuntimeError("EpochInterruption")

    def on_batch_end(self, batch, logs=None):
        self.batch_count += 1
        if self.steps_int is not None and self.batch_count == self.steps_int:
            raise RuntimeError("StepsInterruption")


class CanaryLayer(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.counter = self.add_weight(
            shape=(), initializer="zeros", dtype="float32", trainable=False
        )

    def call(self, x):
        self.counter.assign_add(1)
        return x


# --- what the port adds: the records trained on, a metric's count, per-epoch counts ---


class TrainedIds(keras.layers.Layer):
    """Passes x through; in training, appends its batch's record ids (x[:, 0]) to ``log``."""

    def __init__(self, log):
        super().__init__()
        # (A list set as a layer's attribute would be copied into one Keras tracks.)
        self.note = lambda ids: log.append(ids.numpy().astype(int).tolist()) or ids

    def call(self, x, training=False):
        if not training:
            return x
        ids = tf.py_function(self.note, [x[:, 0]], tf.float32)
        with tf.control_dependencies([ids]):
            return tf.identity(x)


class Updates(keras.metrics.Metric):
    """How many times the metric was updated in the epoch (Keras resets it at each epoch)."""

    def __init__(self):
        super().__init__(name="updates")
        self.updates = self.add_variable(shape=(), initializer="zeros", name="updates")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.updates.assign_add(1.0)

    def result(self):
        return self.updates


class Counts(keras.callbacks.Callback):
    """At each epoch's end: (epoch, canary calls, optimizer steps, the metric's updates)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        canary = self.model.layers[0].counter
        steps = self.model.optimizer.iterations
        updates = logs.get("updates", 0)  # (an epoch of no steps has no metrics)
        self.seen.append((epoch, int(canary.value), int(steps), int(updates)))


def make_model(trained, steps_per_execution=1):
    model = keras.Sequential(
        [keras.Input((3,)), CanaryLayer(), TrainedIds(trained), keras.layers.Dense(1)]
    )
    model.compile(
        loss="mse",
        optimizer="sgd",
        metrics=["mse", Updates()],
        steps_per_execution=steps_per_execution,
    )
    return model


class Job:
    """One training script, run again in the same process: a stream made the same way, the
    face over it, Keras's model and ydl's BackupAndRestore(``backup``) in ``tmp_path/subdir``.
    ``trained`` lists the record ids of every batch trained, in order."""

    def __init__(self, ref, tmp_path, face, steps_per_execution=1, predicate=None, **backup):
        self.backup_dir = str(tmp_path / "subdir")
        self.stream = stream_of(ref, predicate=predicate)
        self.data = data_of(self.stream, face)
        self.trained = []
        self.model = make_model(self.trained, steps_per_execution)
        self.cbk = ydl.keras.BackupAndRestore(self.backup_dir, self.stream, **backup)

    def fit(self, epochs, *callbacks):
        return self.model.fit(self.data, callbacks=[self.cbk, *callbacks], epochs=epochs, verbose=0)

    def interrupted(self, epochs, steps_int=None, epoch_int=None):
        """A fit that Keras's InterruptingCallback stops."""
        with pytest.raises(RuntimeError, match="Interruption"):
            self.fit(epochs, InterruptingCallback(steps_int, epoch_int))

    def saved(self, suffix=""):
        """Keras's (epoch, batch) in the backup's training_metadata.json (or its ``.bkp``)."""
        with open(os.path.join(self.backup_dir, "training_metadata.json" + suffix)) as f:
            saved = json.load(f)
        return saved["epoch"], saved["batch"]

    @property
    def canary(self):
        return int(self.model.layers[0].counter.value)


def expected_counts(first_epoch, calls, steps_of_first):
    """Per epoch from ``first_epoch`` to 4: the counts at its end, from ``calls`` before it and
    ``steps_of_first`` steps in the first (the rest of an interrupted epoch)."""
    counts = []
    for epoch in range(first_epoch, 5):
        steps = steps_of_first if epoch == first_epoch else STEPS
        calls += steps
        counts.append((epoch, calls, calls, steps))
    return counts


# --- the tests of Keras's file ---


def test_save_freq_unknown_error(ref, tmp_path):
    with pytest.raises(ValueError, match="Invalid value"):
        ydl.keras.BackupAndRestore(str(tmp_path), stream_of(ref), save_freq="batch")
    with pytest.raises(ValueError, match="Invalid value"):
        ydl.keras.BackupAndRestore(str(tmp_path), stream_of(ref), save_freq=0.15)


@pytest.mark.parametrize("face", FACES)
def test_best_case_step(ref, tmp_path, face):
    job = Job(ref, tmp_path, face, save_freq=1)
    job.interrupted(epochs=2, steps_int=2)
    assert os.path.exists(job.backup_dir)
    assert job.saved() == (0, 1)  # Keras's cbk._current_epoch and cbk._last_batch_seen
    assert job.canary == 2

    counts = Counts()
    hist = job.fit(5, counts)
    assert hist.epoch == [0, 1, 2, 3, 4]
    assert counts.seen == expected_counts(0, calls=2, steps_of_first=1)
    assert job.canary == 15  # Keras's test expects 17 (it trains epoch 0 over)
    assert job.trained == epochs_ids(ref, 0, 5)  # every record of every epoch once, in order
    assert not os.path.exists(job.backup_dir)


@pytest.mark.parametrize("face", FACES)
def test_best_case_step_in_a_later_epoch(ref, tmp_path, face):
    # Not in Keras's file: its step test, with the backup inside the second epoch. Backups at
    # steps 2 and 4; interrupted after step 5, the restore is 1 step into epoch 1.
    job = Job(ref, tmp_path, face, save_freq=2)
    job.interrupted(epochs=3, steps_int=5)
    assert job.saved() == (1, 0)
    assert job.canary == 5

    del job.trained[4:]  # step 5 is not in the backup: it is trained again
    counts = Counts()
    assert job.fit(3, counts).epoch == [1, 2]
    assert counts.seen == [(1, 6, 6, 2), (2, 9, 9, 3)]
    assert (job.canary, int(job.model.optimizer.iterations)) == (9, 9)
    assert job.trained == epochs_ids(ref, 0, 3)


@pytest.mark.parametrize("face", FACES)
def test_best_case_epoch(ref, tmp_path, face):
    job = Job(ref, tmp_path, face, save_freq="epoch")
    assert job.canary == 0
    job.interrupted(epochs=6, epoch_int=2)
    assert job.saved()[0] == 2
    assert job.canary == 6

    counts = Counts()
    assert job.fit(5, counts).epoch == [2, 3, 4]
    assert job.canary == 5 * 3
    assert counts.seen == expected_counts(2, calls=6, steps_of_first=STEPS)
    assert job.trained == epochs_ids(ref, 0, 5)


@pytest.mark.parametrize("face", FACES)
def test_backup_corrupted(ref, tmp_path, face):
    job = Job(ref, tmp_path, face, save_freq="epoch", double_checkpoint=True)
    job.interrupted(epochs=6, epoch_int=2)
    weights = os.path.join(job.backup_dir, "latest.weights.h5")
    assert os.path.exists(weights) and os.path.exists(weights + ".bkp")
    assert (job.saved()[0], job.saved(".bkp")[0]) == (2, 1)
    assert job.canary == 6

    with open(weights, "w") as f:  # corrupt the weights: Keras falls back to the previous backup
        f.write("0")

    del job.trained[:]
    counts = Counts()
    assert job.fit(5, counts).epoch == [1, 2, 3, 4]
    assert job.canary == 5 * 3  # 3 restored with epoch 0's backup, then 4 epochs of 3
    assert counts.seen == expected_counts(1, calls=3, steps_of_first=STEPS)
    assert job.trained == epochs_ids(ref, 1, 5)  # epoch 1 again, as the backup restored says


@pytest.mark.parametrize("face", FACES)
def test_model_deleted_case_epoch(ref, tmp_path, face):
    job = Job(ref, tmp_path, face, save_freq="epoch")
    counts = Counts()
    job.fit(2, counts)
    assert not os.path.exists(job.backup_dir)
    assert counts.seen == [(0, 3, 3, 3), (1, 6, 6, 3)]
    assert job.trained == epochs_ids(ref, 0, 2)


def test_backup_dir_empty_error(ref):
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        ydl.keras.BackupAndRestore("", stream_of(ref), save_freq="epoch")


def test_backup_dir_none_error(ref):
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        ydl.keras.BackupAndRestore(None, stream_of(ref), save_freq="epoch")


# --- beyond Keras's file: where else Keras's steps and the stream's batches part ---


@pytest.mark.parametrize("face", FACES)
def test_several_steps_per_execution_resume_exactly(ref, tmp_path, face):
    # Keras numbers each call's last step as if it ran all its steps; at the end of an epoch of
    # 3 (or of the 1 left) it ran fewer. Before: the backup after it asked the stream for more
    # batches than it had handed out (ValueError).
    job = Job(ref, tmp_path, face, steps_per_execution=2, save_freq=1)
    job.interrupted(epochs=3, steps_int=1)
    assert job.canary == 2  # the first call ran steps 0 and 1

    counts = Counts()
    job.fit(3, counts)
    assert counts.seen == [(0, 3, 3, 1), (1, 6, 6, 3), (2, 9, 9, 3)]
    assert job.trained == epochs_ids(ref, 0, 3)


KEEP = ydl.predicates.in_lambda(["x"], lambda x: int(x[0]) % 3 != 0)  # 6 of the 10 records


# Interrupted after step 3, the restore is 1 step into epoch 1; after step 2, at the end of
# epoch 0's batches but not of its records: the rest of epoch 0 passes none, an epoch of no step.
@pytest.mark.parametrize(
    "stop, want",
    [
        (3, [(1, 4, 4, 1), (2, 6, 6, 2)]),
        (2, [(0, 2, 2, 0), (1, 4, 4, 2), (2, 6, 6, 2)]),
    ],
)
def test_a_predicates_epochs_end_without_a_step_past_their_data(ref, tmp_path, stop, want):
    # 2 batches an epoch, of the 3 that len(stream) (an upper bound) tells Keras. Before: each
    # epoch's end ran a part of a step more (the canary, the metric, the optimizer's step).
    job = Job(ref, tmp_path, "tf", predicate=KEEP, save_freq=1)
    job.interrupted(epochs=3, steps_int=stop)

    counts = Counts()
    job.fit(3, counts)
    assert counts.seen == want
    assert job.trained == epochs_ids(ref, 0, 3, predicate=KEEP)


class InterruptPastTheData(keras.callbacks.Callback):
    """Raises as Keras begins the call past the end of the first epoch of a fit (its step 1,
    the first epoch being the 1 step left of a resumed one)."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 1:
            raise RuntimeError("PastTheData")


@pytest.mark.parametrize("face", FACES)
def test_a_fit_interrupted_at_the_call_past_the_data_resumes_exactly(ref, tmp_path, face):
    job = Job(ref, tmp_path, face, save_freq=1)
    job.interrupted(epochs=5, steps_int=2)
    # The call that would find no data is left prepared: the next fit's first call is made to
    # take its batch before the step runs, and trains on it.
    with pytest.raises(RuntimeError, match="PastTheData"):
        job.fit(5, InterruptPastTheData())
    assert job.canary == 3

    counts = Counts()
    job.fit(5, counts)
    assert counts.seen == expected_counts(1, calls=3, steps_of_first=STEPS)
    assert job.trained == epochs_ids(ref, 0, 5)
