"""What Keras trains, evaluates and predicts on, with one backend, for test_keras.py.

    python keras_backend_job.py BACKEND ROOT

BACKEND is "torch" or "jax". Prints one JSON object: for each check, a pair [what Keras was
handed (record ids, or where the stream stands), what the stream's epochs hold, in order].
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

BACKEND = sys.argv[1]
os.environ["KERAS_BACKEND"] = BACKEND
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import yogadl_plus as ydl  # noqa: E402

RECORDS, BATCH, EPOCHS = 20, 4, 3  # 5 steps per epoch
CRASH_AT = 7  # the second step of epoch 1


def stream_of(ref: ydl.DataRef, start_offset: int = 0) -> ydl.Stream:
    return ref.stream(shuffle=True, shuffle_seed=5, batch_size=BATCH, start_offset=start_offset)


def data(stream: ydl.Stream, face: str, labels: bool = True) -> object:
    if face == "seq":
        return ydl.keras.StreamSequence(stream, x="x", y="y" if labels else None)
    dataset = ydl.tensorflow.make_tf_dataset(stream)
    if labels:
        return dataset.map(lambda b: (b["x"], b["y"]))
    return dataset.map(lambda b: b["x"])


def model(seen: list[int], dense: bool = True) -> keras.Model:
    """A model not built yet (Keras builds it on a batch) that writes down the ids (x) of every
    batch it is called on; without ``dense``, it gives x back."""

    class Log(keras.layers.Layer):
        def call(self, x: object) -> object:
            try:
                ids = keras.ops.convert_to_numpy(x)
            except Exception:
                return x  # the symbolic values Keras builds the model with hold no data
            seen.extend(int(i) for i in ids[:, 0])
            return x

    unbuilt = keras.Sequential([Log(), keras.layers.Dense(1)] if dense else [Log()])
    unbuilt.compile("sgd", "mse", run_eagerly=True)
    return unbuilt


class Crash(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps == CRASH_AT:
            raise RuntimeError("crash")


def checks(ref: ydl.DataRef, face: str, root: str) -> dict[str, list[list[int]]]:
    def epochs(start_offset: int, count: int) -> list[int]:
        stream = stream_of(ref, start_offset)
        return [int(i) for _ in range(count) for batch in stream for i in batch["x"][:, 0]]

    out = {}
    stream, seen = stream_of(ref), []
    model(seen).fit(data(stream, face), epochs=EPOCHS, verbose=0)
    out["fit"] = [seen, epochs(0, EPOCHS)]
    out["fit: where the stream stands"] = [list(stream.next_epoch_position), [EPOCHS, 0]]

    # A stream resumed mid-epoch by start_offset: the rest of its epoch, then whole ones.
    seen = []
    model(seen).fit(data(stream_of(ref, 2 * BATCH), face), epochs=2, verbose=0)
    out["fit from start_offset"] = [seen, epochs(2 * BATCH, 2)]

    # Crashed mid-epoch, then started again (a new stream and model) with the same backup.
    backup = os.path.join(root, f"backup-{face}")
    seen = []
    for callbacks in ([Crash()], []):
        stream = stream_of(ref)
        saver = ydl.keras.BackupAndRestore(backup, stream, save_freq=1)
        with contextlib.suppress(RuntimeError):
            model(seen).fit(
                data(stream, face), epochs=EPOCHS, callbacks=[saver, *callbacks], verbose=0
            )
    out["fit crashed and resumed with BackupAndRestore"] = [seen, epochs(0, EPOCHS)]

    stream, seen = stream_of(ref), []
    model(seen).evaluate(data(stream, face), verbose=0)
    out["evaluate"] = [seen, epochs(0, 1)]
    out["evaluate: where the stream stands"] = [list(stream.next_epoch_position), [1, 0]]

    # (JAX's predict builds the model by calling it on the batch it read: the model's log holds
    # that batch twice, so what it predicted is compared.)
    stream = stream_of(ref)
    got = model([], dense=False).predict(data(stream, face, labels=False), verbose=0)
    out["predict"] = [[int(i) for i in got[:, 0]], epochs(0, 1)]
    out["predict: where the stream stands"] = [list(stream.next_epoch_position), [1, 0]]
    return out


def main(root: str) -> None:
    x = np.arange(RECORDS, dtype=np.float32)[:, None]
    storage = ydl.LocalStorage(os.path.join(root, "store"))
    ref = ydl.cache_dataset({"x": x, "y": x[:, 0]}, "ids", "v1", storage, progress=False)
    results = {
        f"{face}: {name}": pair
        for face in ("tf", "seq")
        for name, pair in checks(ref, face, root).items()
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[2])
