"""Lineage (``stream.lineage(n, start_offset=None)``): the records each of the next items is made
of equals what the stream then hands out, across shuffle, shards, a predicate, batches, n-gram
windows, mixtures and skip lists; it reads nothing it need not, moves nothing, and works on a
fresh stream that loaded a saved state."""

from __future__ import annotations

import json

import numpy as np
import pytest

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
