"""Keras in and out: a PyDataset cached record by record (KerasSequenceSource), and
ydl.keras.StreamSequence (batches by index, epochs, model.fit)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import yogadl_plus as ydl  # noqa: E402

StreamSequence = ydl.keras.StreamSequence

_names = itertools.count()


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return ydl.LocalStorage(tmp_path_factory.mktemp("keras"))


def cache(source, storage):
    return ydl.cache_dataset(source, f"k{next(_names)}", "v1", storage, progress=False)


# --- KerasSequenceSource ---


class Batches(keras.utils.PyDataset):
    """10 records in batches of 4, 4, 2, as (x, y, w), ({"img", "meta": {"n"}}, y) or x."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.starts = [0, 4, 8, 10]

    def __len__(self):
        return 3

    def __getitem__(self, i):
        ids = np.arange(self.starts[i], self.starts[i + 1])
        x = np.stack([np.full((2, 3), k, np.float32) for k in ids])
        y = (ids % 3).astype(np.int64)
        if self.form == "xyw":
            return x, y, ids / 10.0
        if self.form == "dict":
            return {"img": x, "meta": {"n": ids.astype(np.int32)}}, y
        return x


@pytest.mark.parametrize(
    "form, names",
    [("xyw", ["x", "y", "sample_weight"]), ("dict", ["img", "meta/n", "y"]), ("x", ["x"])],
)
def test_keras_sequence_is_cached_record_by_record(form, names, storage):
    ref = cache(Batches(form), storage)
    assert ref.manifest.source_kind == "keras" and len(ref) == 10
    assert list(ref.schema.names) == names
    for k in range(10):
        record = ref[k]
        x = record["img" if form == "dict" else "x"]
        assert x.dtype == np.float32 and x.shape == (2, 3) and (x == k).all()
        if form != "x":
            assert record["y"] == k % 3 and record["y"].dtype == np.int64
    if form == "xyw":
        assert ref[7]["sample_weight"] == 0.7
    if form == "dict":
        assert ref[9]["meta/n"] == 9 and ref[9]["meta/n"].dtype == np.int32


def test_keras_sequence_with_uneven_parts_fails_naming_the_batch(storage):
    class Bad(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.zeros((4, 2)), np.zeros(4 if i == 0 else 3)

    with pytest.raises(ydl.SchemaError, match=r"batch 1: .*same size"):
        cache(Bad(), storage)


# --- StreamSequence ---

N = 50


@pytest.fixture(scope="module")
def ref(storage):
    records = (
        {
            "x": np.array([i, i % 7, 1.0], np.float32),
            "y": np.int64(i % 2),
            "name": f"n{i}",
            "seq": np.arange(i % 3),
        }
        for i in range(N)
    )
    return cache(records, storage)


def stream_of(ref, **kwargs):
    return ref.stream(shuffle=True, shuffle_seed=3, batch_size=8, **kwargs)


def epoch_ids(ref, epoch):
    return [b["x"][:, 0].tolist() for b in stream_of(ref, start_offset=epoch * N)]


def test_items_are_x_y_in_the_streams_order(ref):
    seq = StreamSequence(stream_of(ref), x="x", y="y")
    assert len(seq) == 7
    items = [seq[i] for i in range(len(seq))]
    want = list(stream_of(ref))
    for (x, y), batch in zip(items, want):
        np.testing.assert_array_equal(x, batch["x"])
        np.testing.assert_array_equal(y, batch["y"])
    with pytest.raises(IndexError):
        seq[7]


def test_x_as_list_gives_a_dict_and_strings_are_arrays(ref):
    seq = StreamSequence(stream_of(ref, fields=["x", "name"]), x=["x", "name"])
    batch = seq[0]
    assert set(batch) == {"x", "name"} and batch["name"].shape == (8,)
    assert batch["name"][0].startswith("n")
    only = StreamSequence(stream_of(ref, fields=["x", "y"]), y="y")
    x, y = only[0]
    assert x.shape == (8, 3) and y.shape == (8,)


def test_random_access_restarts_at_that_batch(ref):
    seq = StreamSequence(stream_of(ref), x="x", y="y")
    want = epoch_ids(ref, 0)
    for i in [5, 2, 3, 0, 6, 1]:
        assert seq[i][0][:, 0].tolist() == want[i]


def test_keras_workers_are_refused_for_the_streams_own(ref):
    for kwargs in ({"workers": 4}, {"workers": 1, "use_multiprocessing": True}):
        with pytest.raises(ValueError, match="num_workers"):
            StreamSequence(stream_of(ref), x="x", y="y", **kwargs)


def test_in_an_epoch_batches_come_in_the_streams_order_whatever_the_index(ref):
    seq = StreamSequence(stream_of(ref), x="x")
    seq[0], seq[1]  # Keras reads two batches for the signature, then resets
    seq.on_epoch_end()
    seq.on_epoch_begin()
    shuffled = [6, 1, 0, 3, 5, 2, 4]  # as Keras's fit(shuffle=True) asks
    assert [seq[i][:, 0].tolist() for i in shuffled] == epoch_ids(ref, 0)
    # All handed out: the epoch is over (Keras never asks for more; a new fit after one that
    # raised samples its signature here), so batches come by index, of the next epoch.
    assert seq[2][:, 0].tolist() == epoch_ids(ref, 1)[2]
    with pytest.raises(IndexError, match="out of range"):
        seq[7]
    seq.on_epoch_end()
    assert seq[3][:, 0].tolist() == epoch_ids(ref, 1)[3]  # outside: by index, next epoch
    seq.on_epoch_begin()
    assert seq[5][:, 0].tolist() == epoch_ids(ref, 1)[0]


@pytest.mark.parametrize("shuffle", [False, True])
def test_model_fit_trains_two_epochs_on_the_streams_epochs_0_and_1(ref, shuffle):
    stream = stream_of(ref, fields=["x", "y"])
    served = []

    class Logged(StreamSequence):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            served.append(x[:, 0].tolist())
            return x, y

    seq = Logged(stream, x="x", y="y")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(seq, epochs=2, verbose=0, shuffle=shuffle)
    assert len(history.history["loss"]) == 2
    # The first two were read for the signature; then epochs 0 and 1 in the stream's order,
    # Keras's shuffle=True notwithstanding.
    assert served[2:] == epoch_ids(ref, 0) + epoch_ids(ref, 1)
    assert stream.next_epoch_position == (2, 0)


def test_resumed_stream_has_a_shorter_first_epoch(ref):
    seq = StreamSequence(stream_of(ref, start_offset=3 * 8), x="x")
    assert len(seq) == 7  # what Keras takes for every epoch's steps, read before training
    # Outside an epoch, by index from where the stream stands: the rest, then the next epoch.
    expected = epoch_ids(ref, 0)[3:] + epoch_ids(ref, 1)[:3]
    assert [seq[i][:, 0].tolist() for i in range(7)] == expected
    seq.on_epoch_begin()
    assert len(seq) == 4 and [seq[0][:, 0].tolist() for _ in range(4)] == epoch_ids(ref, 0)[3:]
    seq.on_epoch_end()
    assert len(seq) == 7 and seq[6][:, 0].tolist() == epoch_ids(ref, 1)[6]


def test_transform_returning_tuples_gives_tuples(ref):
    stream = stream_of(ref, transform=lambda r: (r["x"] * 2, r["y"]))
    x, y = StreamSequence(stream)[0]
    assert x.shape == (8, 3) and y.shape == (8,)
    np.testing.assert_array_equal(x, next(iter(stream_of(ref)))["x"] * 2)


def test_what_keras_cannot_take_is_refused(ref):
    with pytest.raises(ValueError, match="batch_size"):
        StreamSequence(ref.stream(), x="x")
    with pytest.raises(ValueError, match="no field"):
        StreamSequence(stream_of(ref), x="nope")
    odd = ydl.predicates.in_lambda(["y"], lambda y: y == 1)
    with pytest.raises(ValueError, match="make_tf_dataset"):
        StreamSequence(stream_of(ref, predicate=odd), x="x")
    with pytest.raises(ValueError, match="different shapes"):
        StreamSequence(stream_of(ref), x="seq")[0]


def test_pickles_for_worker_processes(ref):
    seq = StreamSequence(stream_of(ref), x="x", y="y")
    seq[0]
    copy = pickle.loads(pickle.dumps(seq))
    assert copy[3][0][:, 0].tolist() == epoch_ids(ref, 0)[3]


# --- ydl.keras.BackupAndRestore (killed and restarted for real in test_keras_resume.py) ---


def _fit(stream, backup_dir, epochs=1, **kwargs):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = ydl.keras.BackupAndRestore(backup_dir, stream, **kwargs)
    data = StreamSequence(stream, x="x", y="y")
    model.fit(data, epochs=epochs, callbacks=[callback], verbose=0)
    return model


def test_backup_is_kerass_own_files_with_the_streams_position(ref, tmp_path):
    backup = str(tmp_path / "backup")
    stream = stream_of(ref, fields=["x", "y"])
    _fit(stream, backup, save_freq=3, delete_checkpoint=False)  # 7 batches: backups at 3, 6
    assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
    with open(os.path.join(backup, "training_metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["epoch"] == 0 and metadata["batch"] == 5
    assert metadata["yogadl_plus"]["offset"] == 6 * 8
    # Keras's own callback restores from it: the same files, the same meaning.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    restored = keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)
    restored.set_model(model)
    restored.on_train_begin()
    saved = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    saved.load_weights(os.path.join(backup, "latest.weights.h5"))
    for a, b in zip(model.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(a, b)
    _fit(stream_of(ref, fields=["x", "y"]), backup, epochs=2)  # finishes; then deletes
    assert not os.path.exists(backup)


def test_a_backup_of_another_stream_is_refused_naming_what_differs(ref, tmp_path):
    backup = str(tmp_path / "backup")
    _fit(stream_of(ref, fields=["x", "y"]), backup, save_freq=2, delete_checkpoint=False)
    other = ref.stream(shuffle=True, shuffle_seed=4, batch_size=8, fields=["x", "y"])
    with pytest.raises(ValueError, match="seed=4"):
        _fit(other, backup)
    resized = ref.stream(shuffle=True, shuffle_seed=3, batch_size=4, fields=["x", "y"])
    with pytest.raises(ValueError, match="batch_size: backed up 8, now 4"):
        _fit(resized, backup)


def test_a_backup_saved_before_an_order_setting_existed_still_restores(ref, tmp_path):
    backup = str(tmp_path / "backup")
    _fit(stream_of(ref, fields=["x", "y"]), backup, save_freq=2, delete_checkpoint=False)
    path = os.path.join(backup, "training_metadata.json")
    with open(path) as f:
        metadata = json.load(f)
    order = metadata["yogadl_plus"]["stream"]["order"]
    assert ", pad_shard_remainder=False" in order
    metadata["yogadl_plus"]["stream"]["order"] = order.replace(", pad_shard_remainder=False", "")
    with open(path, "w") as f:
        json.dump(metadata, f)
    _fit(stream_of(ref, fields=["x", "y"]), backup, delete_checkpoint=False)  # restored as before
    padded = stream_of(ref, fields=["x", "y"], pad_shard_remainder=True)
    with pytest.raises(ValueError, match="pad_shard_remainder=True"):
        _fit(padded, backup)


def test_a_backup_written_before_stream_states_is_refused(ref, tmp_path):
    backup = str(tmp_path / "backup")
    stream = stream_of(ref, fields=["x", "y"])
    _fit(stream, backup, save_freq=3, delete_checkpoint=False)
    path = os.path.join(backup, "training_metadata.json")
    with open(path) as f:
        metadata = json.load(f)
    # What BackupAndRestore wrote before the stream's identity came from stream.state(): it
    # named the order by a repr, and no build.
    metadata["yogadl_plus"]["stream"] = {
        "dataset": f"{ref.dataset_id}:{ref.version}",
        "records": len(ref),
        "order": "EpochOrder(num_records=40, shuffle=True, seed=3, ...)",
        "batch_size": 8,
        "drop_last": False,
    }
    with open(path, "w") as f:
        json.dump(metadata, f)
    resumed = stream_of(ref, fields=["x", "y"])
    callback = ydl.keras.BackupAndRestore(backup, resumed, delete_checkpoint=False)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback.set_model(model)
    with pytest.raises(ValueError, match=r"earlier release.*start_offset"):
        callback.on_train_begin()
    assert resumed.offset == 0  # nothing was restored


def test_damaged_or_foreign_backups_raise_cache_corrupted(ref, tmp_path):
    backup = str(tmp_path / "backup")
    _fit(stream_of(ref, fields=["x", "y"]), backup, save_freq=2, delete_checkpoint=False)
    weights = os.path.join(backup, "latest.weights.h5")
    with open(weights, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(ydl.CacheCorrupted, match="SHA-256"):
        _fit(stream_of(ref, fields=["x", "y"]), backup)
    metadata = os.path.join(backup, "training_metadata.json")
    with open(metadata, "w") as f:
        json.dump({"epoch": 1, "batch": 0}, f)  # what keras.callbacks.BackupAndRestore writes
    with pytest.raises(ydl.CacheCorrupted, match="no stream position"):
        _fit(stream_of(ref, fields=["x", "y"]), backup)


def test_backup_and_restore_refuses_record_streams_and_urls(ref, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        ydl.keras.BackupAndRestore(str(tmp_path), ref.stream())
    with pytest.raises(ValueError, match="local or mounted"):
        ydl.keras.BackupAndRestore("gs://bucket/backup", stream_of(ref))


# --- fit retried after an interruption: in the same process (Keras's own test pattern) ---


class Interrupt(keras.callbacks.Callback):
    """Raises RuntimeError at the end of the ``at``-th step of a fit."""

    def __init__(self, at):
        super().__init__()
        self.at, self.steps = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.at:
            raise RuntimeError("interrupted")


class Steps(keras.callbacks.Callback):
    """The optimizer's step count and learning rate after every step."""

    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.seen.append((int(optimizer.iterations), float(optimizer.learning_rate)))


def logged_model(trained):
    """A model that appends the first column of x (a record's id) of each batch it trains on
    to ``trained``, in graph mode too, and whose learning rate decays with every step."""
    import tensorflow as tf

    class Log(keras.layers.Layer):
        def call(self, x, training=False):
            if not training:
                return x

            def note(ids):
                trained.append(ids.numpy().astype(int).tolist())
                return ids

            ids = tf.py_function(note, [x[:, 0]], tf.float32)
            with tf.control_dependencies([ids]):
                return tf.identity(x)

    model = keras.Sequential([keras.Input((3,)), Log(), keras.layers.Dense(2)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model.compile(
        keras.optimizers.SGD(schedule),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, schedule


def fit_data(stream, face):
    """The stream as (x, y) batches for model.fit, by ``face``: "sequence" or "tf"."""
    if face == "sequence":
        return StreamSequence(stream, x="x", y="y")
    return ydl.tensorflow.make_tf_dataset(stream).map(lambda b: (b["x"], b["y"]))


@pytest.mark.parametrize("face", ["sequence", "tf"])
@pytest.mark.parametrize("at", [3, 7, 9])  # mid-epoch, an epoch's last step, 2 into the next
@pytest.mark.parametrize("same_model", [True, False])
def test_fit_retried_trains_each_batch_once_and_counts_steps_exactly(
    ref, tmp_path, face, at, same_model
):
    # Before: with StreamSequence, the retried fit raised "IndexError: the epoch has 7 batches,
    # all handed out already"; with tf.data, optimizer.iterations (and the learning rate) ran
    # one step ahead of the steps trained after the resumed epoch.
    stream = stream_of(ref, fields=["x", "y"])
    data = fit_data(stream, face)
    backup = ydl.keras.BackupAndRestore(str(tmp_path / "backup"), stream, save_freq=1)
    trained, steps = [], []
    model, schedule = logged_model(trained)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(data, epochs=3, callbacks=[backup, Steps(steps), Interrupt(at)], verbose=0)
    if not same_model:  # a new process: the model comes back from the backup alone
        model, schedule = logged_model(trained)
    model.fit(data, epochs=3, callbacks=[backup, Steps(steps)], verbose=0)

    expected = epoch_ids(ref, 0) + epoch_ids(ref, 1) + epoch_ids(ref, 2)
    assert trained == expected  # every batch once, in the stream's order
    assert [count for count, _ in steps] == list(range(1, len(expected) + 1))
    assert [rate for _, rate in steps] == pytest.approx(
        [float(schedule(count)) for count in range(1, len(expected) + 1)]
    )
    assert int(model.optimizer.iterations) == len(expected)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")  # (it does: resumed)
@pytest.mark.parametrize("face", ["sequence", "tf"])
def test_fit_on_a_stream_resumed_by_start_offset_trains_every_later_epoch_whole(ref, face):
    # Before: without BackupAndRestore, StreamSequence told Keras the resumed epoch's short
    # length before training, and Keras kept it for every epoch: epochs 1 and 2 trained 4 of
    # their 7 batches, silently.
    stream = stream_of(ref, fields=["x", "y"], start_offset=3 * 8)
    data = fit_data(stream, face)
    trained = []
    model, _ = logged_model(trained)
    model.fit(data, epochs=3, verbose=0)
    assert trained == epoch_ids(ref, 0)[3:] + epoch_ids(ref, 1) + epoch_ids(ref, 2)


# --- other backends, and TensorFlow under a distribution strategy ---

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "keras_backend_job.py")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_other_backends_fit_evaluate_and_predict_on_the_streams_epochs(backend, tmp_path):
    # Before: Keras's torch and JAX trainers read a batch to build the model from an iteration
    # of the data of their own. make_tf_dataset gave it the stream's epoch 0: fit trained
    # epochs 1, 2, ..., a stream resumed by start_offset lost the rest of its epoch, evaluate
    # ran on epoch 1. So did JAX's predict of a model not built yet, with StreamSequence too.
    # A torch DataLoader (make_dataloader's, or a plain one with StreamSampler) gave it its
    # next epoch likewise; with the torch backend and workers, a plain one's sampler also gave
    # an epoch to the iterator Keras makes at each epoch's end and drops (fit trained 1, 3, 5).
    pytest.importorskip(backend)
    pytest.importorskip("torch")  # (the job's DataLoaders)
    if backend == "jax":
        pytest.importorskip("grain")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, JOB, backend, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checks = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: got for name, (got, _) in checks.items()} == {
        name: want for name, (_, want) in checks.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("face", ["sequence", "tf"])
def test_under_a_distribution_strategy_fit_trains_the_streams_first_epochs(ref, face):
    # Before: Keras's TensorFlow trainer, under a strategy, reads a batch of its own to build
    # the model (in _maybe_symbolic_build) at every fit: that took the stream's epoch 0.
    import tensorflow as tf

    stream = stream_of(ref, fields=["x", "y"])
    data = fit_data(stream, face)
    trained = []
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model, _ = logged_model(trained)
    model.fit(data, epochs=2, verbose=0)
    assert trained == epoch_ids(ref, 0) + epoch_ids(ref, 1)
    assert stream.next_epoch_position == (2, 0)


def torch_fit_data(ref, face):
    """The stream's batches as (x, y) from a torch DataLoader: make_dataloader ("loader"), or a
    plain one over RecordDataset with StreamSampler ("sampler")."""
    torch = pytest.importorskip("torch")
    from yogadl_plus.columns import collate

    def as_xy(batch):
        return torch.as_tensor(batch["x"]), torch.as_tensor(batch["y"])

    if face == "loader":
        return ydl.torch.make_dataloader(stream_of(ref, fields=["x", "y"]), collate_fn=as_xy)
    return torch.utils.data.DataLoader(
        ydl.torch.RecordDataset(ref, fields=["x", "y"]),
        sampler=ydl.torch.StreamSampler(ref, shuffle=True, shuffle_seed=3),
        batch_size=8,
        collate_fn=lambda records: as_xy(collate(records)),
    )


@pytest.mark.parametrize(
    "face, strategy", [("loader", False), ("sampler", False), ("loader", True)]
)
def test_with_tensorflow_a_torch_dataloader_trains_the_streams_first_epochs(ref, face, strategy):
    # Before: Keras's TensorFlow backend reads a torch DataLoader's first batches to learn
    # their signature from an iteration of its own, at every fit, evaluate and predict (and
    # under a strategy another one to build the model): each took an epoch of the stream,
    # make_dataloader's or StreamSampler's.
    import tensorflow as tf

    data = torch_fit_data(ref, face)
    trained = []
    scope = tf.distribute.MirroredStrategy(["/cpu:0"]).scope() if strategy else None
    with scope or contextlib.nullcontext():
        model, _ = logged_model(trained)
    model.fit(data, epochs=2, verbose=0)
    model.evaluate(data, verbose=0)
    assert trained == epoch_ids(ref, 0) + epoch_ids(ref, 1)
    assert next(iter(data))[0][:, 0].tolist() == epoch_ids(ref, 3)[0]


def test_backup_and_restore_refuses_to_back_up_a_stream_that_fit_does_not_read(ref, tmp_path):
    # Before: with a torch loader of make_dataloader (it keeps its own place), the callback
    # backed up offsets the loader never reached and restored a stream the loader ignores:
    # a silently wrong resume.
    torch = pytest.importorskip("torch")
    stream = stream_of(ref, fields=["x", "y"])
    data = ydl.torch.make_dataloader(
        stream, collate_fn=lambda b: (torch.as_tensor(b["x"]), torch.as_tensor(b["y"]))
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = ydl.keras.BackupAndRestore(str(tmp_path / "backup"), stream, save_freq=1)
    with pytest.raises(ValueError, match=r"handed out nothing of its epoch.*make_tf_dataset"):
        model.fit(data, epochs=1, callbacks=[callback], verbose=0)
    assert not os.path.exists(tmp_path / "backup" / "training_metadata.json")
