"""make_dataloader over a stream with a predicate or skip=: the stream's own batches (filled,
none empty, the same records in the same order as iterating the stream and as its lineage),
with or without worker processes, and resumed exactly from a state_dict mid-epoch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus import predicates  # noqa: E402

# Records of about 1.2 KiB: a worker then reads 512 positions at a time, so an epoch is a few
# groups and batches are filled across them.
N = 1200


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("torch-filtered"))
    records = (
        {
            "i": np.int64(i),
            "x": np.full(300, i, np.float32),
            "v": np.arange(i % 4, dtype=np.int32),
            "s": f"r{i}",
        }
        for i in range(N)
    )
    return ydl.cache_dataset(records, "f", "v", storage, progress=False, chunk_bytes=200_000)


def batch_ids(batches) -> list[list[int]]:
    return [[int(i) for i in batch["i"]] for batch in batches]


def kept_below(limit):
    return predicates.in_lambda(["i"], lambda i: i < limit)


def residues(modulus, kept):
    return predicates.in_lambda(["i"], lambda i: i % modulus in kept)


filters = st.one_of(
    st.integers(2, 7).flatmap(
        lambda m: st.builds(residues, st.just(m), st.sets(st.integers(0, m - 1), min_size=1))
    ),
    # Long runs with nothing passing: whole groups of a worker hand over no record.
    st.builds(kept_below, st.integers(1, 40)),
    st.builds(lambda lo: predicates.in_lambda(["i"], lambda i: i >= lo), st.integers(600, N - 1)),
)
skips = st.lists(st.integers(0, N - 1), max_size=300).map(lambda s: np.array(sorted(set(s))))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::yogadl_plus.NothingPassedWarning")  # (some drawn filters)
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch_size=st.integers(1, 90),
    predicate=st.none() | filters,
    skip=st.none() | skips,
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    workers=st.sampled_from([0, 2]),
    data=st.data(),
)
def test_filtered_batches_are_the_streams_and_resume_exactly(
    ref, batch_size, predicate, skip, drop_last, shuffle, workers, data
):
    if predicate is None and skip is None:
        skip = np.arange(0, N, 3)
    args = dict(
        batch_size=batch_size,
        predicate=predicate,
        skip=skip,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_seed=11,
        fields=["i", "v", "s"],
    )
    expected = batch_ids(ref.stream(**args))
    loader = ydl.torch.make_dataloader(ref.stream(**args), num_workers=workers)
    got = []
    for batch in loader:
        got.append([int(i) for i in batch["i"]])
        assert isinstance(batch["i"], torch.Tensor) and batch["s"] == [f"r{i}" for i in got[-1]]
        assert [v.tolist() for v in batch["v"]] == [list(range(i % 4)) for i in got[-1]]
    assert got == expected
    assert all(len(b) == batch_size for b in got[:-1]) and all(got), "filled, none empty"
    if got:  # (lineage of an epoch that hands out nothing is another matter)
        lineage = ref.stream(**args).lineage(len(got))
        assert [list(map(int, item)) for item in lineage] == got

    k = data.draw(st.integers(0, len(got)), label="batches before the checkpoint")
    first = ydl.torch.make_dataloader(ref.stream(**args))
    it = iter(first)
    for _ in range(k):
        next(it)
    state = first.state_dict()
    resumed = ydl.torch.make_dataloader(ref.stream(**args), num_workers=workers)
    resumed.load_state_dict(state)
    assert batch_ids(resumed) == expected[k:]


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, True), (2, False)])
def test_a_state_mid_epoch_resumes_a_filtered_loader_exactly(ref, workers, persistent):
    args = dict(
        batch_size=32,
        predicate=residues(3, {0, 1}),
        skip=np.arange(500, 700),
        shuffle=True,
        shuffle_seed=4,
        fields=["i"],
    )
    whole = batch_ids(ref.stream(**args)) + batch_ids(ref.stream(**args, start_offset=N))

    def make():
        return ydl.torch.make_dataloader(
            ref.stream(**args), num_workers=workers, persistent_workers=persistent
        )

    loader = make()
    it = iter(loader)
    consumed = [[int(i) for i in next(it)["i"]] for _ in range(13)]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    rest = batch_ids(resumed) + batch_ids(resumed)
    assert consumed + rest == whole


def test_a_collate_fn_gets_each_filled_batch(ref):
    def collate(batch):
        return {"n": len(batch["i"]), "i": batch["i"]}

    stream = ref.stream(batch_size=50, predicate=kept_below(120), fields=["i"])
    loader = ydl.torch.make_dataloader(stream, num_workers=2, collate_fn=collate)
    got = list(loader)
    assert [b["n"] for b in got] == [50, 50, 20]
    assert isinstance(got[0]["i"], np.ndarray), "a collate_fn gets the stream's batch as it is"


def test_ddp_refuses_a_filtered_loader_unless_told(ref, monkeypatch):
    # Ranks fill their batches from the records of their own that pass: their numbers of
    # batches differ, and the rank with more waits for ever in its last all-reduce.
    from yogadl_plus.adapters import torch_ddp

    monkeypatch.setattr(torch_ddp, "distributed", lambda: True)
    stream = ref.stream(batch_size=8, predicate=kept_below(100), num_shards=2, shard_rank=0)
    with pytest.raises(ValueError, match="allow_uneven_shards=True"):
        ydl.torch.make_dataloader(stream)
    assert len(list(ydl.torch.make_dataloader(stream, allow_uneven_shards=True))) == 7


def fails_on_56(record):
    if record["i"] == 56:
        raise RuntimeError("bad record")
    return record


def test_a_transform_error_comes_after_the_full_batches_before_it(ref):
    stream = ref.stream(batch_size=10, predicate=residues(2, {0}), transform=fails_on_56)
    got = []
    with pytest.raises(ydl.TransformError, match="record 56"):
        for batch in ydl.torch.make_dataloader(stream, num_workers=2):
            got.append([int(i) for i in batch["i"]])
    assert got == [list(range(0, 20, 2)), list(range(20, 40, 2))]
