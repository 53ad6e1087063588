"""A mixture through the framework faces: a torch DataLoader that resumes exactly (and the
index-based faces refused), a tf.data.Dataset of the stream's items, and Keras's fit with a
BackupAndRestore that resumes at the same item.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import Pair, batch_pairs, epoch_pairs, with_twice

import yogadl_plus as ydl
from yogadl_plus.mixture import Mixture


def test_torch_dataloader_over_a_mixture_resumes_exactly(three: Mixture) -> None:
    torch = pytest.importorskip("torch")

    def make() -> Any:
        stream = three.stream(
            shuffle=True,
            shuffle_seed=5,
            num_shards=2,
            shard_rank=1,
            batch_size=4,
            transform=with_twice,
        )
        return ydl.torch.make_dataloader(stream, num_workers=2)

    def ids(batches: Iterable[dict[str, Any]]) -> list[Pair]:
        return [
            (int(s), int(i))
            for b in batches
            for s, i in zip(torch.as_tensor(b["src"]).tolist(), torch.as_tensor(b["i"]).tolist())
        ]

    reference_loader = make()
    reference = [ids([b]) for _ in range(2) for b in reference_loader]
    inline = three.stream(
        shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1, batch_size=4, transform=with_twice
    )
    assert reference == [batch_pairs([b]) for _ in range(2) for b in inline]
    for k in (0, 3, 7):
        loader = make()
        it = iter(loader)
        consumed = [ids([next(it)]) for _ in range(k)]
        state = loader.state_dict()
        del it
        again = make()
        again.load_state_dict(state)
        rest = [ids([b]) for b in again]
        assert consumed + rest == reference[: len(loader)]


def test_torch_refuses_index_based_faces_of_a_mixture(three: Mixture) -> None:
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match="make_dataloader"):
        ydl.torch.RecordDataset(three)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="make_dataloader"):
        ydl.torch.StreamSampler(three, shuffle=True, shuffle_seed=1)  # type: ignore[arg-type]


def test_tf_dataset_over_a_mixture_gives_the_streams_items(three: Mixture) -> None:
    pytest.importorskip("tensorflow")
    records = three.stream(shuffle=True, shuffle_seed=2)
    want = epoch_pairs(three.stream(shuffle=True, shuffle_seed=2))
    got = [
        (int(e["src"]), int(e["i"]))
        for e in ydl.tensorflow.make_tf_dataset(records).as_numpy_iterator()
    ]
    assert got == want
    batches = three.stream(shuffle=True, shuffle_seed=2, batch_size=16)
    dataset = ydl.tensorflow.make_tf_dataset(batches)
    assert batch_pairs(dataset.as_numpy_iterator()) == want
    assert batch_pairs(dataset.as_numpy_iterator()) == epoch_pairs(
        three.stream(shuffle=True, shuffle_seed=2, start_offset=70)
    ), "the next iteration is the next epoch"


def test_keras_fits_a_mixture_and_its_backup_resumes_at_the_same_item(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")
    storage = ydl.LocalStorage(tmp_path / "store")
    sources = {
        name: ydl.cache_dataset(
            ({"x": np.full(3, 100 * k + i, np.float32), "y": np.int64(k)} for i in range(n)),
            name,
            "v",
            storage,
            progress=False,
        )
        for k, (name, n) in enumerate({"web": 40, "books": 12}.items())
    }
    mix = ydl.mix(sources, {"web": 3, "books": 1}, epoch_size=48)

    def stream() -> ydl.Stream:
        return mix.stream(shuffle=True, shuffle_seed=4, batch_size=8)

    seq = ydl.keras.StreamSequence(stream(), x="x", y="y")
    assert len(seq) == 6
    epoch = [tuple(seq[b][0][:, 0].tolist()) for b in range(6)]
    assert sum(epoch, ()) == tuple(float(r) for b in stream() for r in b["x"][:, 0])

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = str(tmp_path / "backup")
    first = stream()
    callback = ydl.keras.BackupAndRestore(backup, first, save_freq=4, delete_checkpoint=False)
    model.fit(ydl.keras.StreamSequence(first, x="x", y="y"), epochs=1, callbacks=[callback],
              verbose=0)  # fmt: skip
    with open(os.path.join(backup, "training_metadata.json")) as f:
        saved = json.load(f)["yogadl_plus"]
    assert saved["stream"]["dataset"] == "mix(web=web:v*36, books=books:v*12)"
    assert saved["offset"] == 4 * 8  # the backup after the 4th batch of 6
    # Restored into a new stream over the same mixture, it resumes at that item.
    resumed = stream()
    restore = ydl.keras.BackupAndRestore(backup, resumed, delete_checkpoint=False)
    restore.set_model(model)
    restore.on_train_begin()
    assert resumed.offset == saved["offset"]
    rest = [float(r) for b in resumed for r in b["x"][:, 0]]
    assert rest == [float(v) for b in epoch[4:] for v in b]
    # A stream over another mixture of the same sources refuses the backup, naming why.
    other = ydl.mix(sources, {"web": 1, "books": 1}, epoch_size=48)
    refused = ydl.keras.BackupAndRestore(
        backup, other.stream(shuffle=True, shuffle_seed=4, batch_size=8), delete_checkpoint=False
    )
    refused.set_model(model)
    with pytest.raises(ValueError, match="dataset"):
        refused.on_train_begin()
