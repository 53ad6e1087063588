"""Lineage (``stream.lineage(n, start_offset=None)``): the records each of the next items is made
of equals what the stream then hands out, across shuffle, shards, a predicate, batches, n-gram
windows, mixtures and skip lists; it reads nothing it need not, moves nothing, and works on a
fresh stream that loaded a saved state. A randomized test holds it against iterating the stream,
empty epochs and shards included; lineage ends where no later epoch can hand out an item, and
says so where it cannot tell."""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.cli import main

N = 500


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path_factory.mktemp("lineage"))


@pytest.fixture(scope="module")
def ref(storage: ydl.LocalStorage) -> ydl.DataRef:
    columns = {"i": np.arange(N), "ts": np.arange(N) * 10, "x": np.ones((N, 3), np.float32)}
    return ydl.cache_dataset(columns, "d", "v", storage, progress=False, chunk_bytes=4_000)


def handed(stream: ydl.Stream, items: int) -> list[list[int]]:
    """What the stream hands out next, ``items`` items over as many epochs as it takes."""
    out: list[list[int]] = []
    while len(out) < items:
        before = len(out)
        for item in stream:
            out.append(np.atleast_1d(np.asarray(item["i"])).ravel().tolist())
            if len(out) == items:
                break
        if len(out) == before:
            break
    return out


CASES = {
    "records": {},
    "shuffled": dict(shuffle=True, shuffle_seed=3),
    "batches": dict(shuffle=True, shuffle_seed=3, batch_size=32),
    "batches, drop_last": dict(shuffle=True, shuffle_seed=3, batch_size=32, drop_last=True),
    "shard 1 of 3": dict(shuffle=True, shuffle_seed=3, num_shards=3, shard_rank=1, batch_size=8),
    "predicate": dict(
        shuffle=True,
        shuffle_seed=3,
        batch_size=16,
        predicate=ydl.predicates.in_lambda("i", lambda i: i % 3 != 0),
    ),
    "skip list": dict(shuffle=True, shuffle_seed=3, batch_size=16, skip=list(range(0, N, 7))),
    "resumed mid-epoch": dict(shuffle=True, shuffle_seed=3, batch_size=10, start_offset=1234),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lineage_is_what_the_stream_then_hands_out(ref: ydl.DataRef, case: str) -> None:
    args = CASES[case]
    items = 3 * len(ref.stream(**args)) // 2  # into the next epoch
    stream = ref.stream(**args)
    said = stream.lineage(items)
    assert stream.offset == ref.stream(**args).offset  # it moved nothing
    assert [a.tolist() for a in said] == handed(stream, items)
    assert all(a.dtype == np.int64 for a in said)


def test_lineage_of_n_gram_windows_is_each_windows_records(ref: ydl.DataRef) -> None:
    ngram = ydl.NGram({0: ["i"], 2: ["i"]}, 100, "ts")
    stream = ref.stream(shuffle=True, shuffle_seed=1, ngram=ngram)
    said = stream.lineage(20)
    for window, got in zip(said, list(stream)[:20]):
        assert window.tolist() == [int(got[0]["i"]), int(got[2]["i"])]
    batched = ref.stream(shuffle=True, shuffle_seed=1, ngram=ngram, batch_size=4).lineage(2)
    assert batched[0].shape == (4, 2) and batched[0].tolist() == [w.tolist() for w in said[:4]]


def test_lineage_of_a_mixture_names_the_source(storage: ydl.LocalStorage, ref: ydl.DataRef) -> None:
    other = ydl.cache_dataset({"i": np.arange(1000, 1100)}, "o", "v", storage, progress=False)
    mix = ydl.mix({"main": ref, "other": other}, {"main": 3, "other": 1}, epoch_size=200)
    stream = mix.stream(shuffle=True, shuffle_seed=5, batch_size=8, fields=["i"])
    said = stream.lineage(30)
    for pairs, batch in zip(said, handed(stream, 30)):
        assert [i if name == "main" else 1000 + i for name, i in pairs] == batch
        assert {name for name, _ in pairs} <= {"main", "other"}


def test_lineage_from_a_saved_state_with_no_training(
    storage: ydl.LocalStorage, ref: ydl.DataRef, tmp_path, capsys
) -> None:
    args = dict(shuffle=True, shuffle_seed=8, batch_size=25)
    run = ref.stream(**args)
    epoch = iter(run)
    for _ in range(7):
        next(epoch)
    state = run.state().to_dict()
    coming = [b["i"].tolist() for b in [next(epoch) for _ in range(5)]]
    fresh = ref.stream(**args)
    fresh.load_state(state)
    assert [a.tolist() for a in fresh.lineage(5)] == coming
    assert [a.tolist() for a in ref.stream(**args).lineage(5, start_offset=state["offset"])] == (
        coming
    )
    # The command line: the same, from the state file.
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    store = ["--storage", storage.root]
    argv = ["lineage", "d", "v", "--state", str(path), "--batch-size", "25", "--items", "2:5"]
    assert main([*argv, "--json", *store]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"item": k, "records": coming[k]} for k in range(2, 5)]
    assert main([*argv, *store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2\t" + " ".join(map(str, coming[2]))
    for bad in ("5:2", "x", "-1:3", "3"):
        with pytest.raises(SystemExit):
            main([*argv[:-1], bad, *store])


def test_lineage_of_nothing_and_of_a_predicate_that_keeps_nothing(ref: ydl.DataRef) -> None:
    assert ref.stream().lineage(0) == []
    none = ydl.predicates.in_lambda("i", lambda i: i < 0)
    assert ref.stream(predicate=none, batch_size=4).lineage(10) == []
    with pytest.raises(ValueError, match="n must be"):
        ref.stream().lineage(-1)


# --- against iterating the stream, in every case ---

SIZES = (0, 1, 5, 13)  # records of the small versions: none, fewer than the shards, a few


@pytest.fixture(scope="module")
def small(storage: ydl.LocalStorage) -> dict[str, Any]:
    """Versions of each of SIZES records (field "i": the index), and a mixture of two (the
    second's "i" is 100 + its index)."""
    schema = ydl.Schema([ydl.Field("i", np.int64)])
    refs = {
        n: ydl.cache_dataset(
            ({"i": i} for i in range(n)), f"small{n}", "v", storage, progress=False,
            schema=schema, chunk_bytes=40,
        )
        for n in SIZES
    }  # fmt: skip
    other = ydl.cache_dataset(
        ({"i": 100 + i} for i in range(4)), "small-other", "v", storage, progress=False
    )
    return {**refs, "mix": ydl.mix({"a": refs[5], "b": other}, {"a": 2, "b": 1}, epoch_size=7)}


def item_records(item: Any) -> list[int]:
    """An item's "i" values: a record's, a batch's."""
    return np.atleast_1d(np.asarray(item["i"])).ravel().tolist()


def said_records(entry: Any) -> list[int]:
    """A lineage entry as "i" values: indices, or a mixture's (source, index) pairs."""
    if isinstance(entry, list):
        return [i if name == "a" else 100 + i for name, i in entry]
    return np.asarray(entry).tolist() if entry.ndim else [int(entry)]


def handed_by_epoch(stream: ydl.Stream, items: int, epochs: int) -> list[list[list[int]]]:
    """Each iteration's items (as "i" values), for ``epochs`` iterations or until ``items``."""
    out: list[list[list[int]]] = []
    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ydl.NothingPassedWarning)  # (a predicate emptied an epoch)
        while len(out) < epochs and count < items:
            out.append([])
            for item in stream:
                out[-1].append(item_records(item))
                count += 1
                if count == items:
                    break
    return out


def returned(seconds: float, call: Callable[[], Any]) -> Any:
    """What ``call()`` returns (or raises); an AssertionError where it has not returned after
    ``seconds``, as a loop without end never does (its thread is left to the interpreter)."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except Exception as exc:
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise AssertionError(f"it has not returned after {seconds} s: a loop without end?")
    ((returned_, value),) = outcome
    if not returned_:
        raise value
    return value


@st.composite
def stream_args(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """A source and the arguments of a stream over it: shards (some empty), offsets, batches,
    drop_last, skip lists and predicates, each sometimes leaving nothing."""
    key = draw(st.sampled_from([*SIZES, "mix"]))
    records = list(range(5)) if key == "mix" else list(range(int(key)))
    shards = draw(st.integers(1, 4))
    args: dict[str, Any] = dict(
        shuffle=draw(st.booleans()),
        shuffle_seed=draw(st.integers(0, 3)),
        num_shards=shards,
        shard_rank=draw(st.integers(0, shards - 1)),
        batch_size=draw(st.none() | st.integers(1, 4)),
        drop_last=draw(st.booleans()),
        start_offset=draw(st.integers(0, 30)),
        drop_shard_remainder=draw(st.booleans()),
    )
    if key == 13 and draw(st.booleans()):
        args["shard_by"] = "chunks"  # (chunks of a few records each)
    elif draw(st.booleans()):
        args["global_start"] = draw(st.integers(0, 20))
    if records and draw(st.booleans()):
        skip = draw(st.lists(st.sampled_from(records), unique=True))
        args["skip"] = {"a": skip} if key == "mix" else skip
    if draw(st.booleans()):
        kept = draw(st.lists(st.sampled_from([*range(13), 100, 102]), unique=True, max_size=4))
        args["predicate"] = ydl.predicates.in_set("i", kept)
    if key == "mix":
        args["fields"] = ["i"]
    return key, args


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=stream_args(), n=st.integers(0, 12))
def test_lineage_is_what_iterating_the_stream_hands_out(small, case, n) -> None:
    key, args = case
    try:
        stream = small[key].stream(**args)
    except ValueError:
        assume(False)  # fewer chunks than shards
    cap = 60  # iterations the reference makes, at most: past any search of lineage's here
    try:
        said = [said_records(entry) for entry in returned(10, lambda: stream.lineage(n))]
    except ValueError as exc:
        event("lineage cannot tell")
        # It cannot tell whether a later epoch hands out more: the epochs it searched hand
        # out nothing, and it found no more than it says.
        found, first, last = map(int, re.search(r"found (\d+) .* epochs (\d+) to (\d+)",
                                                str(exc)).groups())  # fmt: skip
        epochs = handed_by_epoch(small[key].stream(**args), n, cap)
        start = small[key].stream(**args).next_epoch_position[0]
        assert sum(len(e) for e in epochs[: last + 1 - start]) == found < n
        assert not any(epochs[first - start : last + 1 - start])
        return
    assert stream.offset == small[key].stream(**args).offset  # it moved nothing
    epochs = handed_by_epoch(stream, n, cap)
    handed = [item for epoch in epochs for item in epoch]
    event("fewer items, none after" if len(said) < n else "all the items asked for")
    if len(said) < n:  # no later epoch hands out an item: the reference finds none either
        assert handed == said
    else:
        assert len(said) == n and said[: len(handed)] == handed
        assert len(handed) == n or len(epochs) == cap


def test_lineage_returns_on_empty_shards_and_empty_versions(small) -> None:
    # More shards than records: shard 4 of 5 has no position in any epoch.
    assert returned(10, lambda: small[1].stream(num_shards=5, shard_rank=4).lineage(3)) == []
    assert returned(10, lambda: small[0].stream(batch_size=2).lineage(3)) == []
    one = small[1].stream(num_shards=5, shard_rank=0, batch_size=2).lineage(3)
    assert [a.tolist() for a in one] == [[0], [0], [0]]  # a short batch each epoch
    # Fewer positions than a batch, dropped: no epoch hands out anything.
    dropped = small[5].stream(batch_size=8, drop_last=True)
    assert returned(10, lambda: dropped.lineage(2)) == []


@pytest.mark.parametrize(
    "args",
    [
        dict(batch_size=4, drop_last=True, start_offset=10),  # the rest: short of a batch
        dict(skip=[11, 12], start_offset=11),  # the rest: all skipped
        dict(predicate=ydl.predicates.in_set("i", [0, 1]), start_offset=5),  # all rejected
        dict(skip=[4], predicate=ydl.predicates.in_set("i", [4, 7]), start_offset=8),
    ],
    ids=["drop_last", "skip", "predicate", "both"],
)
def test_an_empty_rest_of_an_epoch_is_not_the_end(small, args) -> None:
    stream = small[13].stream(**args)
    said = [a.tolist() for a in stream.lineage(4)]
    assert len(said) == 4
    assert said == [item for e in handed_by_epoch(stream, 4, 10) for item in e]


def test_lineage_says_when_it_cannot_tell_whether_more_come(small) -> None:
    # Drop_last and a predicate that keeps two records: fewer than a batch in every epoch,
    # which lineage cannot know of epochs it has not read. It stops, saying what it found.
    keeps_two = ydl.predicates.in_set("i", [1, 2])
    stream = small[13].stream(predicate=keeps_two, batch_size=4, drop_last=True)
    with pytest.raises(ValueError, match=r"found 0 of 3 items: epochs 0 to 7 .* fewer records"):
        stream.lineage(3)


def test_an_empty_epoch_of_a_shard_is_not_said_to_empty_them_all(small) -> None:
    keep = ydl.predicates.in_set("i", [3])
    stream = small[13].stream(shuffle=True, shuffle_seed=1, num_shards=4, predicate=keep)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        epochs = [[item_records(r) for r in stream] for _ in range(12)]
    assert [] in epochs and [[3]] in epochs  # this shard holds record 3 in some epochs only
    messages = [str(w.message) for w in said if w.category is ydl.NothingPassedWarning]
    assert len(messages) == epochs.count([])
    assert all("of this shard" in m and "epochs are empty" not in m for m in messages)
