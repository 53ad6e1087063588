"""ydl.torch: RecordDataset in DataLoader workers, StreamSampler's order, and a DataLoader whose
state_dict resumes at the next item exactly with any number of workers."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus import predicates  # noqa: E402

N = 300


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("torch"))
    records = (
        {
            "i": np.int64(i),
            "x": np.full(4, i, np.float32),
            "h": np.float16(i / 2),
            "s": f"r{i}",
            "flag": bool(i % 2),
        }
        for i in range(N)
    )
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=5000)


def ids(items) -> list[int]:
    out = []
    for item in items:
        out.extend(int(v) for v in torch.as_tensor(item["i"]).reshape(-1))
    return out


def test_record_dataset_items_and_batched_fetch(ref):
    ds = ydl.torch.RecordDataset(ref, fields=["i", "x", "s"])
    assert len(ds) == N and ds[-1]["i"] == N - 1 and ds[5]["s"] == "r5"
    assert [r["i"] for r in ds.__getitems__([7, 3])] == [7, 3]
    copy = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(copy[9]["x"], np.full(4, 9, np.float32))


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_record_dataset_in_dataloader_workers(ref, context):
    ds = ydl.torch.RecordDataset(ref, fields=["i", "x", "h", "flag"])
    loader = torch.utils.data.DataLoader(
        ds, batch_size=32, num_workers=2, multiprocessing_context=context
    )
    batches = list(loader)
    assert ids(batches) == list(range(N))
    assert batches[0]["x"].dtype == torch.float32 and batches[0]["h"].dtype == torch.float16
    assert batches[0]["flag"].dtype == torch.bool and batches[0]["x"].shape == (32, 4)


@pytest.mark.parametrize("window", [None, 2])
def test_stream_sampler_has_the_streams_order(ref, window):
    assert len(ref.manifest.chunks) > 2
    args = dict(shuffle=True, shuffle_seed=3, num_shards=3, shard_rank=1, shuffle_window=window)
    sampler = ydl.torch.StreamSampler(ref, **args)
    stream = ref.stream(**args)
    assert list(sampler) == ids(stream) and list(sampler) == ids(stream), "epochs 0 and 1"
    sampler.set_epoch(0)
    assert list(sampler) == ids(ref.stream(**args))
    loader = torch.utils.data.DataLoader(
        ydl.torch.RecordDataset(ref), sampler=sampler, batch_size=10
    )
    sampler.set_epoch(4)
    assert ids(loader) == ids(ref.stream(start_offset=4 * len(stream), **args))
    assert len(sampler) == len(stream)


def test_stream_sampler_takes_a_streams_order_whole(ref):
    stream = ref.stream(shuffle=True, num_shards=2, shard_rank=1, shuffle_seed=5, start_offset=9)
    sampler = ydl.torch.StreamSampler(ref, order=stream.plan().order.settings)
    assert list(sampler) == ids(stream)
    with pytest.raises(TypeError, match=r"not both \(got order= and \['shuffle'\]\)"):
        ydl.torch.StreamSampler(ref, shuffle=True, order=stream.plan().order.settings)
    with pytest.raises(TypeError, match="order= takes an OrderSettings"):
        ydl.torch.StreamSampler(ref, order={"shuffle": True})


def test_stream_sampler_start_offset(ref):
    sampler = ydl.torch.StreamSampler(ref, shuffle=True, shuffle_seed=1, start_offset=N + 7)
    assert list(sampler) == ids(ref.stream(shuffle=True, shuffle_seed=1, start_offset=N + 7))


@pytest.mark.parametrize("workers, persistent", [(0, False), (1, False), (2, False), (2, True)])
def test_dataloader_gives_the_streams_batches_as_tensors(ref, workers, persistent):
    stream = ref.stream(shuffle=True, shuffle_seed=2, batch_size=16, fields=["i", "x", "s"])
    loader = ydl.torch.make_dataloader(stream, num_workers=workers, persistent_workers=persistent)
    got = list(loader)
    expected = list(ref.stream(shuffle=True, shuffle_seed=2, batch_size=16, fields=["i", "x", "s"]))
    assert len(loader) == len(got) == len(expected)
    assert ids(got) == ids(expected)
    assert isinstance(got[0]["x"], torch.Tensor) and got[0]["x"].dtype == torch.float32
    assert got[0]["s"] == expected[0]["s"], "strings stay lists"
    assert ids(loader) == ids(
        ref.stream(
            shuffle=True,
            shuffle_seed=2,
            batch_size=16,
            start_offset=len(stream.plan().indices(0, 0, N)),
        )
    )


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("k", [0, 1, 7, 18])
def test_state_dict_after_k_items_resumes_at_item_k_plus_1(ref, workers, persistent, k):
    def make():
        stream = ref.stream(
            shuffle=True,
            shuffle_seed=5,
            num_shards=2,
            shard_rank=1,
            batch_size=8,
            transform=lambda r: {**r, "twice": int(r["i"]) * 2},
        )
        return ydl.torch.make_dataloader(stream, num_workers=workers, persistent_workers=persistent)

    loader = make()
    reference = [ids([b]) for b in itertools.chain(make(), make_epoch_two(make))]
    it = iter(loader)
    consumed = [ids([next(it)]) for _ in range(k)]
    state = loader.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest = [ids([b]) for b in again]
    assert consumed + rest == reference[: len(consumed) + len(rest)]
    assert len(consumed) + len(rest) == len(loader)


def make_epoch_two(make):
    loader = make()
    list(loader)
    return loader


def test_each_iter_is_the_next_epoch_also_after_an_unfinished_one(ref):
    stream = ref.stream(shuffle=True, shuffle_seed=7, batch_size=50)
    loader = ydl.torch.make_dataloader(stream)
    first = next(iter(loader))
    assert ids([first]) == ids(
        [next(iter(ref.stream(shuffle=True, shuffle_seed=7, batch_size=50)))]
    )
    epoch1 = ids(loader)
    assert epoch1 == ids(ref.stream(shuffle=True, shuffle_seed=7, batch_size=50, start_offset=N))
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["offset"] == 2 * N


def test_batch_size_sets_the_streams_batch_size(ref):
    loader = ydl.torch.make_dataloader(ref.stream(fields=["i"]), batch_size=64)
    sizes = [len(b["i"]) for b in loader]
    assert sizes == [64, 64, 64, 64, 44]
    with pytest.raises(ValueError, match="batches by 10"):
        ydl.torch.make_dataloader(ref.stream(batch_size=10), batch_size=64)
    with pytest.raises(ValueError, match="sampler"):
        ydl.torch.make_dataloader(ref.stream(batch_size=10), sampler=[1, 2])


def test_records_and_predicates(ref):
    loader = ydl.torch.make_dataloader(ref.stream(fields=["i", "s"]))
    items = list(itertools.islice(iter(loader), 3))
    assert [int(r["i"]) for r in items] == [0, 1, 2] and items[0]["s"] == "r0"
    with pytest.raises(ValueError, match="must batch"):
        ydl.torch.make_dataloader(ref.stream(predicate=predicates.in_set("i", [1])))
    odd = ydl.torch.make_dataloader(
        ref.stream(predicate=predicates.in_set("flag", [True]), batch_size=10), num_workers=2
    )
    got = ids(odd)
    assert got == list(range(1, N, 2)) and len(list(odd)) == N // 20, "batches are filled"


def test_state_from_another_seed_is_refused(ref):
    a = ydl.torch.make_dataloader(ref.stream(shuffle=True, shuffle_seed=1, batch_size=10))
    b = ydl.torch.make_dataloader(ref.stream(shuffle=True, shuffle_seed=2, batch_size=10))
    with pytest.raises(ValueError, match="shuffle_seed=2"):
        b.load_state_dict(a.state_dict())


@pytest.mark.slow
def test_a_stream_with_its_own_workers_goes_into_a_dataloader(ref):
    stream = ref.stream(
        shuffle=True, shuffle_seed=4, batch_size=25, num_workers=2, worker_type="process"
    )
    loader = ydl.torch.make_dataloader(stream, num_workers=2, multiprocessing_context="spawn")
    assert ids(loader) == ids(ref.stream(shuffle=True, shuffle_seed=4, batch_size=25))
    stream.close()


def test_worker_processes_persist_across_epochs_unless_told_not_to(ref):
    # Each iteration is the stream's next epoch: starting the workers again for each one cost
    # a fork per worker per epoch (two workers slower than none on short epochs).
    stream = ref.stream(batch_size=8)
    assert ydl.torch.make_dataloader(stream, num_workers=2).persistent_workers is True
    ended = ydl.torch.make_dataloader(stream, num_workers=2, persistent_workers=False)
    assert ended.persistent_workers is False
    assert ydl.torch.make_dataloader(stream).persistent_workers is False  # no workers to keep


@pytest.fixture(scope="module")
def ragged(tmp_path_factory):
    """Variable-size arrays (big enough that batches cross in the workers' rings), nullable
    fields with some values None, strings and bytes."""
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("ragged"))
    records = (
        {
            "i": np.int64(i),
            "v": np.full((i % 5 + 1) * 2000, i, np.float32),
            "n": None if i % 3 == 0 else np.float32(i),
            "m": None if i % 4 == 1 else np.arange(i % 3, dtype=np.int16),
            "s": f"r{i}",
            "b": bytes([i]) * (i % 3 + 1),
        }
        for i in range(40)
    )
    return ydl.cache_dataset(records, "ragged", "v1", storage, progress=False)


def check_ragged(ids_: list[int], values: dict) -> None:
    """``values`` (a batch's fields, or a record's as one-item lists) as the records made them."""
    v, n, m = values["v"], values["n"], values["m"]
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in v)
    assert [x.shape[0] for x in v] == [(i % 5 + 1) * 2000 for i in ids_]
    assert [None if x is None else float(x) for x in n] == [
        None if i % 3 == 0 else float(i) for i in ids_
    ]
    assert all(x is None or isinstance(x, torch.Tensor) for x in n + m)
    assert [None if x is None else x.tolist() for x in m] == [
        None if i % 4 == 1 else list(range(i % 3)) for i in ids_
    ]
    assert values["s"] == [f"r{i}" for i in ids_], "strings stay as they are"
    assert values["b"] == [bytes([i]) * (i % 3 + 1) for i in ids_], "bytes stay as they are"


def keep(record):
    return record


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [None, keep])
def test_variable_size_arrays_come_as_lists_of_tensors(ragged, workers, transform):
    stream = ragged.stream(batch_size=8, shuffle=True, shuffle_seed=1, transform=transform)
    batches = list(ydl.torch.make_dataloader(stream, num_workers=workers))
    assert len(batches) == 5
    for batch in batches:
        check_ragged(batch["i"].tolist(), batch)
    records = ydl.torch.make_dataloader(ragged.stream(), num_workers=workers)
    for record in itertools.islice(records, 6):
        check_ragged([int(record["i"])], {k: [v] for k, v in record.items()})


@pytest.fixture
def pinning(monkeypatch):
    """``is_pinned(tensor)``. Without an accelerator (where DataLoader pins nothing), one is
    made up: pinning a tensor then gives a copy of it that ``is_pinned`` knows."""
    if torch.accelerator.is_available():
        return lambda tensor: tensor.is_pinned()
    pinned: list = []  # (kept alive: an id is not reused meanwhile)

    def pin_memory(tensor, device=None):
        copy = tensor.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: None)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return lambda tensor: any(tensor is p for p in pinned)


@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_pins_every_tensor(ragged, workers, pinning):
    # Before, the arrays the workers handed over became tensors after DataLoader's pinning
    # step: pin_memory=True pinned none of them.
    filtered = ragged.stream(batch_size=8, predicate=predicates.in_lambda("i", lambda i: i > 3))
    # (A stream with workers of its own reads for a loader without any.)
    reading = ragged.stream(batch_size=8, num_workers=2)
    for stream in (ragged.stream(batch_size=8), ragged.stream(), filtered, reading):
        items = list(ydl.torch.make_dataloader(stream, num_workers=workers, pin_memory=True))
        assert items
        for item in items:
            tensors = [
                x
                for value in item.values()
                for x in (value if isinstance(value, list) else [value])
                if isinstance(x, torch.Tensor)
            ]
            assert tensors and all(pinning(t) for t in tensors)


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, True), (2, False)])
@pytest.mark.parametrize("predicate", [None, predicates.in_lambda("i", lambda i: i < 250)])
def test_a_state_at_an_epochs_end_resumes_as_torchdatas_loader_does(
    ref, workers, persistent, predicate
):
    # As torchdata's StatefulDataLoader (its TestEndOfEpochBehavior): a state taken in the loop
    # after the epoch's last batch resumes that epoch, with nothing left in it (so a loop over
    # epochs ends the epoch, and does its end-of-epoch work, once); a state taken once the loop
    # ended resumes at the next epoch. Never a batch twice or left out.
    args = dict(shuffle=True, shuffle_seed=6, batch_size=64, predicate=predicate)

    def make():
        return ydl.torch.make_dataloader(
            ref.stream(**args), num_workers=workers, persistent_workers=persistent
        )

    epoch1 = [ids([b]) for b in ref.stream(**args, start_offset=N)]
    loader = make()
    for _ in loader:
        inside = loader.state_dict()
    after = loader.state_dict()
    assert (inside["epoch"], after["epoch"], after["position"]) == (0, 1, 0)
    resumed = make()
    resumed.load_state_dict(inside)
    assert list(resumed) == [] and [ids([b]) for b in resumed] == epoch1
    resumed = make()
    resumed.load_state_dict(after)
    assert [ids([b]) for b in resumed] == epoch1


@pytest.mark.parametrize("predicate", [None, predicates.in_lambda("i", lambda i: i < 250)])
def test_a_streams_state_after_a_whole_epoch_resumes_at_the_next(ref, predicate):
    args = dict(shuffle=True, shuffle_seed=6, batch_size=64, predicate=predicate)
    stream = ref.stream(**args)
    list(stream)
    resumed = ref.stream(**args)
    resumed.load_state(stream.state())
    assert resumed.next_epoch_position == (1, 0)
    assert ids(resumed) == ids(ref.stream(**args, start_offset=N))
