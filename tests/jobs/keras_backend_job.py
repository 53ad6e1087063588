"""What Keras trains, evaluates and predicts on, with one backend, for test_keras.py.

    python tests/jobs/keras_backend_job.py BACKEND ROOT

BACKEND is "torch" or "jax". Prints one JSON object: for each check, a pair [what Keras was
handed (record ids, or where the stream stands), what the stream's epochs hold, in order].
The faces: make_tf_dataset, StreamSequence, torch DataLoaders (make_dataloader, and a plain
one over RecordDataset with StreamSampler), and with JAX a grain.DataLoader with
ydl.grain.sampler.
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
import torch  # noqa: E402

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus.columns import collate  # noqa: E402

RECORDS, BATCH, EPOCHS = 20, 4, 3  # 5 steps per epoch
CRASH_AT = 7  # the second step of epoch 1
RESUMED_AT = 2 * BATCH  # two batches into epoch 0


def stream_of(ref: ydl.DataRef, start_offset: int = 0) -> ydl.Stream:
    return ref.stream(shuffle=True, shuffle_seed=5, batch_size=BATCH, start_offset=start_offset)


def stream_epochs(ref: ydl.DataRef, start_offset: int, count: int) -> list[int]:
    """The record ids of ``count`` iterations of the stream made with ``start_offset``."""
    stream = stream_of(ref, start_offset)
    return [int(i) for _ in range(count) for batch in stream for i in batch["x"][:, 0]]


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
        return stream_epochs(ref, start_offset, count)

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


# --- torch DataLoaders: Keras takes them on every backend ---


def as_xy(batch: dict) -> tuple:
    """make_dataloader's collate_fn: the stream's batch as Keras's (x, y) of tensors."""
    return torch.as_tensor(batch["x"]), torch.as_tensor(batch["y"])


def as_x(batch: dict) -> tuple:
    return (torch.as_tensor(batch["x"]),)  # (Keras takes a torch batch as a tuple)


def records_as_xy(records: list[dict]) -> tuple:
    """A plain DataLoader's collate_fn over RecordDataset's records."""
    return as_xy(collate(records))


def records_as_x(records: list[dict]) -> tuple:
    return as_x(collate(records))


def torch_data(ref: ydl.DataRef, face: str, labels: bool = True, resumed: bool = False) -> object:
    """A DataLoader of the stream's batches: make_dataloader ("loader"), resumed by
    load_state_dict, or a plain one over RecordDataset with StreamSampler ("sampler"), resumed
    by its start_offset; "... 2 workers" with 2 workers."""
    workers = 2 if face.endswith("2 workers") else 0
    if face.startswith("sampler"):
        sampler = ydl.torch.StreamSampler(
            ref, shuffle=True, shuffle_seed=5, start_offset=RESUMED_AT if resumed else 0
        )
        return torch.utils.data.DataLoader(
            ydl.torch.RecordDataset(ref),
            sampler=sampler,
            batch_size=BATCH,
            num_workers=workers,
            collate_fn=records_as_xy if labels else records_as_x,
        )

    def loader() -> ydl.torch.ResumableDataLoader:
        collate = as_xy if labels else as_x
        return ydl.torch.make_dataloader(stream_of(ref), workers, collate_fn=collate)

    made = loader()
    if resumed:  # a state saved two batches into epoch 0, as a training loop saves it
        saving = loader()
        batches = iter(saving)
        for _ in range(RESUMED_AT // BATCH):
            next(batches)
        made.load_state_dict(saving.state_dict())
    return made


def torch_checks(ref: ydl.DataRef, face: str) -> dict[str, list[list[int]]]:
    def epochs(start_offset: int, count: int) -> list[int]:
        return stream_epochs(ref, start_offset, count)

    def next_batch(data: object) -> list[int]:
        return [int(i) for i in next(iter(data))[0][:, 0]]  # type: ignore[call-overload]

    out = {}
    data, seen = torch_data(ref, face), []
    model(seen).fit(data, epochs=EPOCHS, verbose=0)
    out["fit"] = [seen, epochs(0, EPOCHS)]
    out["fit: the batch the data hands out next"] = [
        next_batch(data),
        epochs(EPOCHS * RECORDS, 1)[:BATCH],
    ]

    seen = []
    model(seen).fit(torch_data(ref, face, resumed=True), epochs=2, verbose=0)
    out["fit resumed two batches into epoch 0"] = [seen, epochs(RESUMED_AT, 2)]

    data, seen = torch_data(ref, face), []
    model(seen).evaluate(data, verbose=0)
    out["evaluate"] = [seen, epochs(0, 1)]
    out["evaluate: the batch the data hands out next"] = [
        next_batch(data),
        epochs(RECORDS, 1)[:BATCH],
    ]

    got = model([], dense=False).predict(torch_data(ref, face, labels=False), verbose=0)
    out["predict"] = [[int(i) for i in got[:, 0]], epochs(0, 1)]
    return out


# --- Grain (with JAX): the sampler is a function of the index, nothing moves ---


def grain_checks(ref: ydl.DataRef) -> dict[str, list[list[int]]]:
    """Keras's epochs over a grain.DataLoader with ydl.grain.sampler, forever (num_epochs=None)
    and steps_per_epoch: the sampler's epochs 0, 1, ..."""
    import grain

    class AsXY(grain.transforms.Map):
        def map(self, batch: dict) -> tuple:
            return batch["x"], batch["y"]

    def sampler() -> ydl.grain.StreamSampler:
        return ydl.grain.sampler(ref, shuffle=True, shuffle_seed=5)

    loader = grain.DataLoader(
        data_source=ydl.grain.source(ref, ["x", "y"]),
        sampler=sampler(),
        operations=[grain.transforms.Batch(BATCH), AsXY()],
        worker_count=0,
    )
    seen: list[int] = []
    model(seen).fit(loader, epochs=2, steps_per_epoch=RECORDS // BATCH, verbose=0)
    return {"grain: fit": [seen, [sampler()[k].record_key for k in range(2 * RECORDS)]]}


def main(root: str) -> None:
    x = np.arange(RECORDS, dtype=np.float32)[:, None]
    storage = ydl.LocalStorage(os.path.join(root, "store"))
    ref = ydl.cache_dataset({"x": x, "y": x[:, 0]}, "ids", "v1", storage, progress=False)
    results = {
        f"{face}: {name}": pair
        for face in ("tf", "seq")
        for name, pair in checks(ref, face, root).items()
    }
    # (Workers matter with the torch backend only, which iterates the DataLoader itself.)
    workers = ("loader, 2 workers", "sampler, 2 workers") if BACKEND == "torch" else ()
    for face in ("loader", "sampler", *workers):
        results.update({f"{face}: {k}": pair for k, pair in torch_checks(ref, face).items()})
    if BACKEND == "jax":
        results.update(grain_checks(ref))
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[2])
