"""Kill a Keras training job mid-epoch, run it again, and check that it trained on every record
of every epoch exactly once.

A synthetic classification set goes through tf.data into ``ydl.cache_dataset``. The job
(``train``) feeds ``model.fit(epochs=3)`` from a shuffled, batching stream through
``ydl.tensorflow.make_tf_dataset``, with ``ydl.keras.BackupAndRestore`` backing up every 10
steps. This script runs the job in a child process that SIGKILLs itself partway through the
second epoch, then runs the very same job again: the callback restores the weights *and* the
stream's position, so the interrupted epoch finishes where the backup left it and the third is
whole.

To check that, the model counts in its own (non-trainable) weights the records it trained on,
so a restored backup says how many of the killed run's records it holds; the job logs the ids
of each batch as it trains. The records a killed run trained after its last backup are lost
with the process (the restored weights never saw them) and are not counted.

Run: python examples/tf_fit_resume.py [WORK_DIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

import yogadl_plus as ydl

try:
    import keras
    import tensorflow as tf
except ModuleNotFoundError as missing:  # say which pip install brings it
    raise SystemExit(ydl.missing_extra(missing, "examples/tf_fit_resume.py")) from None

N, FEATURES, CLASSES = 6000, 16, 4
BATCH, SEED, EPOCHS, SAVE_EVERY = 64, 1234, 3, 10
KILL_AT_STEP = 94 + 40  # 94 steps per epoch: 40 steps into the second, 4 after a backup


def make_dataset() -> tf.data.Dataset:
    """Gaussian blobs, one per class, as a tf.data pipeline of {"id", "x", "y"} elements."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, N)
    centers = rng.normal(0, 3, (CLASSES, FEATURES)).astype(np.float32)
    x = centers[y] + rng.normal(0, 1, (N, FEATURES)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices({"id": np.arange(N), "x": x, "y": y})


def make_stream(ref: ydl.DataRef) -> ydl.Stream:
    return ref.stream(shuffle=True, shuffle_seed=SEED, batch_size=BATCH)


class Counted(keras.layers.Layer):
    """Passes ``x`` through; counts the records trained on and logs their ids."""

    def __init__(self, log_path: str, kill_at: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.log_path = log_path
        self.kill_at = kill_at
        self.steps = 0

    def build(self, shapes: object) -> None:
        self.seen = self.add_weight(
            shape=(), initializer="zeros", dtype="int64", trainable=False, name="seen"
        )

    def call(self, inputs: tuple[tf.Tensor, tf.Tensor], training: bool = False) -> tf.Tensor:
        x, ids = inputs
        if not training:
            return x
        ids = tf.py_function(self.log, [ids], tf.int64)
        self.seen.assign_add(tf.cast(tf.size(ids), "int64"))
        with tf.control_dependencies([ids]):
            return tf.identity(x)

    def log(self, ids: tf.Tensor) -> tf.Tensor:
        with open(self.log_path, "a") as f:
            f.write(" ".join(map(str, ids.numpy().tolist())) + "\n")
        self.steps += 1
        if self.steps == self.kill_at:
            os.kill(os.getpid(), 9)  # the crash: no clean-up, no final backup
        return ids


def train(root: str, kill_at: int) -> None:
    """The training job, as a user writes it: run it again after any crash."""
    keras.utils.set_random_seed(0)
    ref = ydl.LocalStorage(os.path.join(root, "cache")).fetch("blobs", "v1")
    stream = make_stream(ref)
    data = ydl.tensorflow.make_tf_dataset(stream).map(
        lambda b: ({"x": b["x"], "id": b["id"]}, b["y"])
    )
    x_in = keras.Input((FEATURES,), name="x")
    id_in = keras.Input((), dtype="int64", name="id")
    counted = Counted(os.path.join(root, "trained.log"), kill_at)
    hidden = keras.layers.Dense(32, activation="relu")(counted((x_in, id_in)))
    model = keras.Model({"x": x_in, "id": id_in}, keras.layers.Dense(CLASSES)(hidden))
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    backup = ydl.keras.BackupAndRestore(os.path.join(root, "backup"), stream, save_freq=SAVE_EVERY)

    class Report(keras.callbacks.Callback):
        def on_train_begin(self, logs: object = None) -> None:
            with open(os.path.join(root, "trained.log"), "a") as f:
                f.write(f"run restored {int(counted.seen.numpy())}\n")

    # shuffle=False: the stream shuffles (Keras cannot shuffle a tf.data.Dataset, and says so).
    history = model.fit(data, epochs=EPOCHS, shuffle=False, callbacks=[backup, Report()], verbose=0)
    print(f"training done: accuracy {history.history['accuracy'][-1]:.3f}")


def main(root: str) -> None:
    storage = ydl.LocalStorage(os.path.join(root, "cache"))
    ref = ydl.cache_dataset(make_dataset(), "blobs", "v1", storage, progress=False)
    print(f"cached {ref}; {-(-N // BATCH)} batches of {BATCH} per epoch")

    this = os.path.abspath(__file__)
    first = subprocess.run([sys.executable, this, "--train", root, str(KILL_AT_STEP)])
    print(f"first run: killed by signal {-first.returncode} after {KILL_AT_STEP} steps")
    subprocess.run([sys.executable, this, "--train", root, "0"], check=True)

    # Of each run, the records the next run's restored weights hold; of the last, all.
    runs: list[tuple[int, list[int]]] = []
    with open(os.path.join(root, "trained.log")) as f:
        for line in f:
            if line.startswith("run restored"):
                runs.append((int(line.split()[-1]), []))
            else:
                runs[-1][1].extend(int(i) for i in line.split())
    trained: list[int] = []
    for (restored, ids), after in zip(runs, [r for r, _ in runs[1:]] + [None]):
        trained += ids if after is None else ids[: after - restored]
    print(
        f"the first run trained {len(runs[0][1])} records; its last backup held "
        f"{runs[1][0]}, and the second run went on from there"
    )

    stream = make_stream(ref)  # each iter() is the next epoch
    want = [int(i) for _ in range(EPOCHS) for b in stream for i in b["id"]]
    for epoch in range(EPOCHS):
        part = trained[epoch * N : (epoch + 1) * N]
        print(f"epoch {epoch}: {len(part)} records trained, {len(set(part))} distinct")
    if trained != want:
        raise SystemExit("resume was not exact")
    print("every record of every epoch was trained on exactly once, in the stream's order")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--train":
        train(sys.argv[2], int(sys.argv[3]))
    else:
        if len(sys.argv) > 1:
            main(sys.argv[1])
        else:  # a temporary folder, removed at the end
            with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
                main(folder)
