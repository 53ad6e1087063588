"""Train a Keras model on a cached tf.data pipeline, stop mid-epoch, and resume exactly there.

A synthetic classification set goes through tf.data into ``ydl.cache_dataset``; a shuffled,
batching stream feeds ``model.fit`` through ``ydl.tensorflow.make_tf_dataset``. Training stops
after some steps of the first epoch and saves ``stream.offset``; a new process would rebuild the
stream at that offset and finish the epoch. Every record id the model trained on is tracked, to
show that none was repeated or skipped.

Run: python examples/tf_fit_resume.py [STORAGE_DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import yogadl_plus as ydl

N, FEATURES, CLASSES = 6000, 16, 4
BATCH, SEED, STOP_AFTER = 64, 1234, 40


def make_dataset() -> tf.data.Dataset:
    """Gaussian blobs, one per class, as a tf.data pipeline of {"id", "x", "y"} elements."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, CLASSES, N)
    centers = rng.normal(0, 3, (CLASSES, FEATURES)).astype(np.float32)
    x = centers[y] + rng.normal(0, 1, (N, FEATURES)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices({"id": np.arange(N), "x": x, "y": y})


def training_data(ref: ydl.DataRef, start_offset: int, trained: list[int]):
    """The stream at ``start_offset`` and a tf.data pipeline over it for model.fit; ``trained``
    collects the ids of the batches as they are handed to the model."""
    stream = ref.stream(
        shuffle=True, shuffle_seed=SEED, batch_size=BATCH, start_offset=start_offset
    )

    def log_ids(ids: tf.Tensor) -> tf.Tensor:
        trained.extend(ids.numpy().tolist())
        return ids

    def to_xy(batch):
        ids = tf.py_function(log_ids, [batch["id"]], tf.int64)
        with tf.control_dependencies([ids]):
            return tf.identity(batch["x"]), batch["y"]

    return stream, ydl.tensorflow.make_tf_dataset(stream).map(to_xy)


def make_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(root: str) -> None:
    keras.utils.set_random_seed(0)
    storage = ydl.LocalStorage(root)
    ref = ydl.cache_dataset(make_dataset(), "blobs", "v1", storage, progress=False)
    steps_per_epoch = -(-len(ref) // BATCH)
    print(f"cached {ref}; {steps_per_epoch} batches of {BATCH} per epoch")

    # Run 1: train part of epoch 0, then "crash" after STOP_AFTER steps.
    trained_first: list[int] = []
    stream, data = training_data(ref, 0, trained_first)
    model = make_model()
    model.fit(data, epochs=1, steps_per_epoch=STOP_AFTER, verbose=0, shuffle=False)
    checkpoint = os.path.join(root, "resume.json")
    with open(checkpoint, "w") as f:
        json.dump({"offset": stream.offset, "shuffle_seed": SEED}, f)
    model.save(os.path.join(root, "model.keras"))  # weights and optimizer state
    print(f"stopped after {STOP_AFTER} steps: saved offset {stream.offset} to {checkpoint}")

    # Run 2, as a restarted process would do it: the saved model, a stream at the saved offset.
    with open(checkpoint) as f:
        offset = json.load(f)["offset"]
    trained_rest: list[int] = []
    _, data = training_data(ref, offset, trained_rest)
    model = keras.models.load_model(os.path.join(root, "model.keras"))
    left = steps_per_epoch - offset // BATCH
    history = model.fit(data, epochs=1, steps_per_epoch=left, verbose=0, shuffle=False)
    print(
        f"resumed at offset {offset}: trained {left} more steps, {len(trained_rest)} records, "
        f"accuracy {history.history['accuracy'][-1]:.3f}"
    )

    seen = trained_first + trained_rest
    repeated = len(seen) - len(set(seen))
    skipped = N - len(set(seen))
    epoch0 = [int(r["id"]) for r in ref.stream(shuffle=True, shuffle_seed=SEED)]
    same_order = seen == epoch0
    print(
        f"epoch 0: {len(seen)} records trained, {repeated} repeated, {skipped} skipped, "
        f"in the stream's shuffled order: {same_order}"
    )
    if repeated or skipped or not same_order:
        raise SystemExit("resume was not exact")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="yogadl_plus_"))
