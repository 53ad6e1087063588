"""Skip lists (``stream(..., skip=...)``): the records named are never handed out, and still
count as positions, so offsets, shards, resume and elastic rescale keep their meaning; a state
saved without a skip list loads into a stream with one (a run drops bad records and goes on)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl

N = 1000
SKIP = [0, 3, 17, 500, 501, 502, 998, 999]


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("skips"))
    columns = {"i": np.arange(N), "x": np.arange(N * 4, dtype=np.float32).reshape(N, 4)}
    return ydl.cache_dataset(columns, "d", "v", storage, progress=False, chunk_bytes=8_000)


def ids(stream: ydl.Stream) -> list[int]:
    out: list[int] = []
    for item in stream:
        out.extend(np.atleast_1d(item["i"]).tolist())
    return out


@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("shuffle", [False, True])
def test_skipped_records_are_never_handed_out_and_the_rest_keep_their_order(
    ref: ydl.DataRef, batch_size: int | None, shuffle: bool
) -> None:
    args = dict(shuffle=shuffle, shuffle_seed=4, batch_size=batch_size)
    plain = ids(ref.stream(**args))
    stream = ref.stream(skip=SKIP, **args)
    assert ids(stream) == [i for i in plain if i not in SKIP]
    assert stream.offset == N  # every position was passed, the skipped ones too
    if batch_size:
        assert all(len(b["i"]) == 7 for b in list(ref.stream(skip=SKIP, **args))[:-1])


def test_shards_stay_disjoint_and_cover_what_is_not_skipped(ref: ydl.DataRef) -> None:
    seen = []
    for rank in range(3):
        stream = ref.stream(shuffle=True, shuffle_seed=1, num_shards=3, shard_rank=rank, skip=SKIP)
        seen += ids(stream)
    assert sorted(seen) == [i for i in range(N) if i not in SKIP]


def test_a_state_saved_without_a_skip_list_resumes_with_one(ref: ydl.DataRef) -> None:
    # A loss spike at step 40: drop the records found bad, resume where the run was.
    args = dict(shuffle=True, shuffle_seed=9, batch_size=10)
    run = ref.stream(**args)
    epoch = iter(run)
    for _ in range(40):
        next(epoch)
    state = run.state()
    rest_without = [i for b in epoch for i in b["i"].tolist()]
    bad = rest_without[5:25:3]
    resumed = ref.stream(skip=bad, **args)
    resumed.load_state(state)
    assert ids(resumed) == [i for i in rest_without if i not in bad]
    # ... and back: a state saved with a skip list loads without one.
    unskipped = ref.stream(**args)
    unskipped.load_state(resumed.state())
    assert unskipped.offset == resumed.offset


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_hand_out_what_reading_inline_does(ref: ydl.DataRef, worker_type: str) -> None:
    args = dict(shuffle=True, shuffle_seed=2, batch_size=16, skip=np.arange(0, N, 3))
    inline = ids(ref.stream(**args))
    assert ids(ref.stream(num_workers=2, worker_type=worker_type, **args)) == inline


def test_a_predicate_and_a_skip_list_both_leave_records_out(ref: ydl.DataRef) -> None:
    even = ydl.predicates.in_lambda("i", lambda i: i % 2 == 0)
    got = ids(ref.stream(predicate=even, skip=SKIP, batch_size=5))
    assert got == [i for i in range(N) if i % 2 == 0 and i not in SKIP]


@pytest.mark.slow
def test_a_million_skipped_ids(tmp_path) -> None:
    storage = ydl.LocalStorage(tmp_path)
    n = 1_000_300
    ref = ydl.cache_dataset(
        {"i": np.arange(n, dtype=np.int32)}, "big", "v", storage, progress=False
    )
    skip = np.setdiff1d(np.arange(n), np.arange(0, n, 3334))  # all but 301 records
    kept = ids(ref.stream(shuffle=True, shuffle_seed=0, batch_size=64, skip=skip))
    assert sorted(kept) == list(range(0, n, 3334))


def test_a_mixture_skips_by_source(tmp_path) -> None:
    storage = ydl.LocalStorage(tmp_path)
    a = ydl.cache_dataset({"i": np.arange(100)}, "a", "v", storage, progress=False)
    b = ydl.cache_dataset({"i": np.arange(1000, 1050)}, "b", "v", storage, progress=False)
    mix = ydl.mix({"a": a, "b": b})
    got = ids(mix.stream(shuffle=True, shuffle_seed=3, skip={"b": [0, 49]}, batch_size=10))
    assert sorted(got) == [*range(100), *range(1001, 1049)]
    with pytest.raises(ValueError, match=r"names \['c'\], which are not sources"):
        mix.stream(skip={"c": [1]})
    with pytest.raises(ValueError, match="skip= of a mixture is a mapping"):
        mix.stream(skip=[1])
    with pytest.raises(ValueError, match="for one dataset give the indices themselves"):
        a.stream(skip={"a": [1]})
    with pytest.raises(ValueError, match="record 50 of source 'b', out of range"):
        mix.stream(skip={"b": [50]})
    # A mask per source, as long as that source.
    in_b = np.zeros(50, bool)
    in_b[[0, 49]] = True
    masked = ids(mix.stream(shuffle=True, shuffle_seed=3, skip={"b": in_b}, batch_size=10))
    assert masked == got
    with pytest.raises(ValueError, match="skip of source 'b' is a bool mask of 100 values, but "):
        mix.stream(skip={"b": np.zeros(100, bool)})


@pytest.mark.parametrize(
    ("skip", "error", "match"),
    [
        ([N], ValueError, rf"record {N}, out of range"),
        ([-1], ValueError, "record indices are >= 0"),
        (["a"], ValueError, "must be record indices"),
        ("12", ValueError, "must be record indices"),
        ([1.5], ValueError, "must be record indices"),
        ([[1, 2], [3, 4]], ValueError, r"skip must be .* one flat list: .* shape \(2, 2\)"),
        ([[1, 2], [3]], ValueError, r"skip must be .* one flat list: it holds \[1, 2\]"),
        ([1, [2]], ValueError, r"it holds \[2\] \(not flat\)"),
        (np.array([1.0, 2.0]), ValueError, r"skip must be record indices .* holds 1\.0"),
        ([3, 2**64], ValueError, f"skip holds record {2**64}, out of range"),
        (np.array([3, 2**63 + 5], np.uint64), ValueError, f"skip holds record {2**63 + 5}, "),
        ([True, 2, [3]], ValueError, r"it holds True \(a bool among indices\)"),
        (
            np.zeros(N + 1, bool),
            ValueError,
            f"skip is a bool mask of {N + 1} values, but the source has {N} records",
        ),
    ],
)
def test_bad_skip_lists_are_refused_naming_the_index(ref, skip, error, match) -> None:
    with pytest.raises(error, match=match):
        ref.stream(skip=skip)


def test_a_bool_mask_skips_the_records_it_marks(ref: ydl.DataRef) -> None:
    mask = np.zeros(N, bool)
    mask[SKIP] = True
    args = dict(shuffle=True, shuffle_seed=4, batch_size=7)
    assert ids(ref.stream(skip=mask, **args)) == ids(ref.stream(skip=SKIP, **args))
    assert ids(ref.stream(skip=mask.tolist(), **args)) == ids(ref.stream(skip=SKIP, **args))
    # A mask that skips nothing is still checked against the source.
    assert ids(ref.stream(skip=np.zeros(N, bool))) == list(range(N))
    with pytest.raises(ValueError, match=f"mask of 3 values, but the source has {N} records"):
        ref.stream(skip=[False, False, False])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    chosen=st.lists(st.integers(0, N - 1), max_size=40),
    form=st.sampled_from(["list", "int32", "uint64", "mask", "tuple"]),
)
def test_any_form_of_a_skip_list_skips_exactly_its_records(ref, chosen, form) -> None:
    given = {
        "list": chosen,
        "tuple": tuple(chosen),
        "int32": np.array(chosen, np.int32),
        "uint64": np.array(chosen, np.uint64),
        "mask": np.isin(np.arange(N), chosen),
    }[form]
    got = ids(ref.stream(shuffle=True, shuffle_seed=6, batch_size=9, skip=given))
    plain = ids(ref.stream(shuffle=True, shuffle_seed=6, batch_size=9))
    assert got == [i for i in plain if i not in set(chosen)]


def test_what_needs_whole_batches_or_windows_refuses_a_skip_list(ref: ydl.DataRef) -> None:
    with pytest.raises(ValueError, match="iter_blocks"):
        ref.stream(skip=SKIP, batch_size=4).iter_blocks()
    with pytest.raises(ValueError, match="skip= and ngram= cannot be combined"):
        ref.stream(skip=SKIP, ngram=ydl.NGram({0: ["i"], 1: ["i"]}, 5, "i"))
    assert ref.stream(skip=[]).plan().boundary.skip is None  # skips nothing: as without
