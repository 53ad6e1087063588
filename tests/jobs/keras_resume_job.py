"""A training job for test_keras_resume.py: model.fit with ydl.keras.BackupAndRestore, killed
on request, run again by the test until it finishes.

    python tests/jobs/keras_resume_job.py ROOT FACE SAVE_FREQ PREDICATE KILL

FACE is "tf" (make_tf_dataset) or "seq" (StreamSequence); SAVE_FREQ "epoch" or an int;
PREDICATE "0" or "1"; KILL is "none", "step:N" (SIGKILL inside the N-th training step of this
run), "backup:N" (right after this run's N-th backup), "before-replace:N" / "after-replace:N"
(around the N-th rename of this run).

The model counts what it trained on in its own weights (records and the sum of their ids), so
a restored backup says exactly which steps it holds. ROOT/trained.log gets, per run, "R count
sum" as restored, then the ids of each step as it runs, and "F count sum" when fit returns.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import yogadl_plus as ydl

RECORDS, BATCH, EPOCHS, SEED = 500, 32, 3, 7


def predicate() -> ydl.predicates.Predicate:
    return ydl.predicates.in_lambda(["id"], lambda i: i % 3 != 0)


def stream_of(ref: ydl.DataRef, with_predicate: bool) -> ydl.Stream:
    return ref.stream(
        shuffle=True,
        shuffle_seed=SEED,
        batch_size=BATCH,
        predicate=predicate() if with_predicate else None,
    )


def dataset(storage: ydl.LocalStorage) -> ydl.DataRef:
    try:
        return storage.fetch("job", "v1")
    except ydl.DatasetNotFound:
        x = np.random.default_rng(0).normal(size=(RECORDS, 4)).astype(np.float32)
        records = (
            {"id": np.int64(i), "x": x[i], "y": np.int64(x[i].sum() > 0)} for i in range(RECORDS)
        )
        return ydl.cache_dataset(records, "job", "v1", storage, progress=False)


def kill() -> None:
    os.kill(os.getpid(), 9)


def main(root: str, face: str, save_freq_arg: str, with_predicate: str, kill_spec: str) -> None:
    save_freq: str | int = "epoch" if save_freq_arg == "epoch" else int(save_freq_arg)
    mode, _, count = kill_spec.partition(":")
    kill_at = int(count or 0)
    log = open(os.path.join(root, "trained.log"), "a")  # noqa: SIM115 (open for the whole job)
    ref = dataset(ydl.LocalStorage(os.path.join(root, "store")))
    stream = stream_of(ref, with_predicate == "1")
    steps = [0]

    if mode in ("before-replace", "after-replace"):
        replace = os.replace
        renames = [0]

        def replace_then_maybe_die(src: str, dst: str) -> None:
            renames[0] += 1
            if mode == "before-replace" and renames[0] == kill_at:
                kill()
            replace(src, dst)
            if mode == "after-replace" and renames[0] == kill_at:
                kill()

        os.replace = replace_then_maybe_die  # type: ignore[assignment]

    class Counted(keras.layers.Layer):
        """Passes x through; counts the records and sums the ids it trains on."""

        def build(self, shapes: object) -> None:
            self.seen = self.add_weight(
                shape=(), initializer="zeros", dtype="int64", trainable=False, name="seen"
            )
            self.id_sum = self.add_weight(
                shape=(), initializer="zeros", dtype="int64", trainable=False, name="id_sum"
            )

        def call(self, inputs: tuple[tf.Tensor, tf.Tensor], training: bool = False) -> tf.Tensor:
            x, ids = inputs
            if not training:
                return x

            def note(ids: tf.Tensor) -> tf.Tensor:
                log.write(" ".join(map(str, ids.numpy().tolist())) + "\n")
                log.flush()
                steps[0] += 1
                if mode == "step" and steps[0] == kill_at:
                    kill()
                return ids

            ids = tf.py_function(note, [ids], tf.int64)
            self.seen.assign_add(tf.cast(tf.size(ids), "int64"))
            self.id_sum.assign_add(tf.reduce_sum(ids))
            with tf.control_dependencies([ids]):
                return tf.identity(x)

    x_in = keras.Input((4,), name="x")
    id_in = keras.Input((), dtype="int64", name="id")
    counted = Counted()
    out = keras.layers.Dense(1, activation="sigmoid")(counted((x_in, id_in)))
    model = keras.Model({"x": x_in, "id": id_in}, out)
    model.compile("adam", "binary_crossentropy")

    if face == "tf":
        data = ydl.tensorflow.make_tf_dataset(stream).map(
            lambda b: ({"x": b["x"], "id": b["id"]}, b["y"])
        )
    else:
        data = ydl.keras.StreamSequence(stream, x=["x", "id"], y="y")

    metadata = os.path.join(root, "backup", "training_metadata.json")

    class Watch(keras.callbacks.Callback):
        """Writes what the restored weights hold, and kills right after a backup."""

        backups = 0
        stamp: tuple[int, int] | None = None

        def on_train_begin(self, logs: object = None) -> None:
            self.stamp = _stamp(metadata)
            log.write(f"R {int(counted.seen.numpy())} {int(counted.id_sum.numpy())}\n")
            log.flush()

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            self._backed_up()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self._backed_up()

        def on_train_end(self, logs: object = None) -> None:
            log.write(f"F {int(counted.seen.numpy())} {int(counted.id_sum.numpy())}\n")
            log.flush()

        def _backed_up(self) -> None:
            stamp = _stamp(metadata)
            if stamp != self.stamp:
                self.stamp = stamp
                self.backups += 1
                if mode == "backup" and self.backups == kill_at:
                    kill()

    backup = ydl.keras.BackupAndRestore(os.path.join(root, "backup"), stream, save_freq=save_freq)
    model.fit(data, epochs=EPOCHS, callbacks=[backup, Watch()], verbose=0)


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns  # each backup renames a new file in


if __name__ == "__main__":
    main(*sys.argv[1:6])
