"""Token blocks (``ydl.token_blocks``): documents' tokens end to end, an eos after each when
given, cut into blocks of ``length``; checked against a plain numpy reference (the
concatenation, reshaped) for random documents (empty ones, ones longer than several blocks),
eos or none, block lengths from 1 to longer than any document, and many tiny chunks.

Every property runs on both ways a version is read: as built (with token columns where the
version keeps them) and scanned (a version without token columns: ``NoTokenColumns`` below
hides them), so the slow path stays covered whatever the storage gives.
"""

from __future__ import annotations

import itertools
import json
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.cache.tokencolumns import TokenChunk
from yogadl_plus.dataref import DataRef
from yogadl_plus.tokencut import Cut, cut_blocks

PROPERTY = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
EOS = 999


class NoTokenColumns(DataRef):
    """A DataRef read as a version built before token columns existed."""

    def token_counts(self, field: str) -> np.ndarray | None:
        return None


READS = ("as_built", "scanned")


def reading(ref: DataRef, how: str) -> DataRef:
    return ref if how == "as_built" else NoTokenColumns(ref.directory, ref.manifest)


class Reference:
    """What the blocks must be, computed with plain numpy from the documents."""

    def __init__(self, docs: list[np.ndarray | None], length: int, eos: int | None) -> None:
        tokens, positions, owners = [], [], []
        for j, doc in enumerate(docs):
            t = [] if doc is None else list(doc)
            if eos is not None:
                t.append(eos)
            tokens += t
            positions += range(len(t))
            owners += [j] * len(t)
        n = len(tokens) // length
        self.n = n
        cut = n * length
        self.tokens = np.array(tokens[:cut], np.int64).reshape(n, length)
        self.position = np.array(positions[:cut], np.int64).reshape(n, length)
        starts = self.position == 0
        starts[:, 0] = False
        self.segment = np.cumsum(starts, axis=1)
        self.owner = np.array(owners[:cut], np.int64).reshape(n, length)

    def documents(self, i: int) -> list[tuple[int, int, int]]:
        found = []
        for j in dict.fromkeys(self.owner[i].tolist()):
            held = self.position[i][self.owner[i] == j]
            found.append((j, int(held.min()), int(held.max()) + 1))
        return found


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path_factory.mktemp("blocks"))


_built = itertools.count()


def build(storage: ydl.Storage, docs: list[np.ndarray | None], chunk_bytes: int = 256) -> DataRef:
    """A version of ``docs`` (int32 token arrays, None for a null) in tiny chunks."""
    schema = ydl.Schema(
        [ydl.Field("tokens", np.int32, (None,), nullable=True), ydl.Field("n", np.int64)]
    )
    records = [{"tokens": doc, "n": np.int64(j)} for j, doc in enumerate(docs)]
    return ydl.cache_dataset(
        records, "docs", f"v{next(_built)}", storage, schema=schema, progress=False,
        chunk_bytes=chunk_bytes,
    )  # fmt: skip


@st.composite
def documents(draw: st.DrawFn, max_length: int = 40) -> list[np.ndarray | None]:
    """Documents of random lengths: empty ones, nulls, and some longer than several blocks."""
    lengths = draw(
        st.lists(
            st.one_of(st.integers(0, 6), st.integers(0, 3 * max_length), st.none()),
            min_size=1,
            max_size=40,
        )
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return [None if n is None else rng.integers(0, 500, n).astype(np.int32) for n in lengths]


@pytest.fixture(scope="module")
def corpus(storage: ydl.Storage) -> tuple[list[np.ndarray | None], DataRef]:
    """One dataset for the stream properties: 60 documents of 0 to 30 tokens, tiny chunks."""
    rng = np.random.default_rng(7)
    docs: list[np.ndarray | None] = [
        rng.integers(0, 500, rng.integers(0, 31)).astype(np.int32) for _ in range(60)
    ]
    docs[5] = None
    return docs, build(storage, docs)


def rows(items: Any) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in item["tokens"]) for item in items]


# --- blocks are the reference ---


@PROPERTY
@given(
    docs=documents(),
    length=st.integers(1, 45),
    eos=st.sampled_from([None, EOS]),
    how=st.sampled_from(READS),
    chunk_bytes=st.sampled_from([64, 256, 4096]),
)
def test_blocks_equal_the_reference(
    storage: ydl.Storage,
    docs: list[np.ndarray | None],
    length: int,
    eos: int | None,
    how: str,
    chunk_bytes: int,
) -> None:
    ref = reading(build(storage, docs, chunk_bytes), how)
    blocks = ydl.token_blocks(ref, length=length, eos=eos, segments=True)
    expected = Reference(docs, length, eos)
    assert len(blocks) == expected.n
    batch = blocks.get_batch(np.arange(expected.n))
    assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape == (expected.n, length)
    np.testing.assert_array_equal(batch["tokens"], expected.tokens)
    np.testing.assert_array_equal(batch["position"], expected.position)
    np.testing.assert_array_equal(batch["segment"], expected.segment)
    assert batch["segment"].dtype == np.int32 and batch["position"].dtype == np.int64
    if not expected.n:
        return
    shuffled = np.random.default_rng(length).permutation(np.repeat(np.arange(expected.n), 2))
    np.testing.assert_array_equal(
        blocks.get_batch(shuffled, "tokens")["tokens"], expected.tokens[shuffled]
    )
    for i in {0, expected.n - 1, expected.n // 2}:
        np.testing.assert_array_equal(blocks[i]["tokens"], expected.tokens[i])
        np.testing.assert_array_equal(blocks[i - expected.n]["position"], expected.position[i])
        assert [tuple(r) for r in blocks.documents(i).tolist()] == expected.documents(i)
    streamed = list(blocks.stream())
    assert rows(streamed) == [tuple(r) for r in expected.tokens.tolist()]


class Columns:
    """``docs`` as in-memory token columns, ``splits`` documents per chunk (empty chunks too),
    read as a version's are: each read's arrays are garbage after the next read, so a cut
    that kept a view past it gives wrong blocks."""

    def __init__(self, docs: list[np.ndarray | None], splits: list[int], eos: bool) -> None:
        self.chunks: list[list[np.ndarray]] = []
        for a, b in itertools.pairwise([0, *splits, len(docs)]):
            part = [np.zeros(0, np.int32) if d is None else d for d in docs[a:b]]
            ends = np.cumsum([len(d) for d in part], dtype=np.int64)
            self.chunks.append(
                [
                    np.concatenate([np.zeros(0, np.int32), *part]),
                    ends,
                    ends + np.arange(1, len(part) + 1),
                ]
            )
        flat = [
            int(e[-1]) if len(e) else 0 for _, *ends in self.chunks for e in ends[eos : eos + 1]
        ]
        self.cum = np.concatenate([[0], np.cumsum(flat)]).astype(np.int64)
        self.reads = 0
        self._last: list[np.ndarray] = []

    def read(self, chunk: int) -> TokenChunk:
        for array in self._last:
            array[...] = -7
        self.reads += 1
        self._last = [part.copy() for part in self.chunks[chunk]]
        return TokenChunk(*self._last)

    def inside(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Which blocks from ``starts`` lie inside one chunk."""
        chunk = np.searchsorted(self.cum, starts, "right") - 1
        return starts + length <= self.cum[chunk + 1]


@settings(max_examples=60, deadline=None)
@given(
    docs=documents(),
    length=st.integers(1, 45),
    eos=st.sampled_from([None, EOS]),
    data=st.data(),
)
def test_cut_blocks_whatever_the_chunks_and_the_order(
    docs: list[np.ndarray | None], length: int, eos: int | None, data: st.DataObject
) -> None:
    """Blocks inside one chunk, blocks inside one chunk each across many, blocks across
    many tiny chunks; in order, shuffled, repeated; into fresh arrays or into views of wider
    rows (a stream's): the reference every way."""
    splits = sorted(data.draw(st.lists(st.integers(0, len(docs)), max_size=12)))
    columns = Columns(docs, splits, eos is not None)
    expected = Reference(docs, length, eos)
    if not expected.n:
        return
    picked = np.array(data.draw(st.lists(st.integers(0, expected.n - 1), min_size=1, max_size=24)))
    inside = picked[columns.inside(picked * length, length)]
    for batch in (picked, inside, np.sort(picked)):
        if not len(batch):
            continue
        touched = len(np.unique(np.searchsorted(columns.cum, batch * length, "right")))
        columns.reads = 0
        cut = cut_blocks(
            batch * length, length, columns.cum, columns.read, np.dtype(np.int32), eos, True
        )
        np.testing.assert_array_equal(cut.tokens, expected.tokens[batch])
        np.testing.assert_array_equal(cut.position, expected.position[batch])
        np.testing.assert_array_equal(cut.segment, expected.segment[batch])
        if batch is inside:  # (a chunk read once however its blocks are ordered)
            assert columns.reads == touched
        # Into views of rows laid out as a stream's: tokens, then position, then segment.
        rows = np.full((len(batch), 16 * length + 8), 5, np.uint8)
        views = Cut(
            rows[:, 8 : 8 + 4 * length].view(np.int32),
            rows[:, 8 + 4 * length : 8 + 12 * length].view(np.int64),
            rows[:, 8 + 12 * length :].view(np.int32),
        )
        cut_blocks(
            batch * length, length, columns.cum, columns.read, np.dtype(np.int32), eos, True, views
        )
        np.testing.assert_array_equal(views.tokens, expected.tokens[batch])
        np.testing.assert_array_equal(views.position, expected.position[batch])
        np.testing.assert_array_equal(views.segment, expected.segment[batch])
        assert (rows[:, :8] == 5).all()
        plain = cut_blocks(
            batch * length, length, columns.cum, columns.read, np.dtype(np.int32), eos
        )
        np.testing.assert_array_equal(plain.tokens, expected.tokens[batch])
        assert plain.position is None and plain.segment is None


@pytest.mark.parametrize("how", READS)
def test_a_block_spans_many_tiny_chunks_and_empty_documents(storage: ydl.Storage, how: str) -> None:
    docs: list[np.ndarray | None] = [np.array([j], np.int32) if j % 3 else None for j in range(40)]
    docs += [np.zeros(0, np.int32)] * 5 + [np.arange(100, dtype=np.int32)]
    ref = reading(build(storage, docs, chunk_bytes=32), how)
    assert len(ref.chunk_records) > 10
    for eos in (None, EOS):
        blocks = ydl.token_blocks(ref, length=37, eos=eos, segments=True)
        expected = Reference(docs, 37, eos)
        batch = blocks[:]
        np.testing.assert_array_equal(batch["tokens"], expected.tokens)
        np.testing.assert_array_equal(batch["position"], expected.position)
        np.testing.assert_array_equal(batch["segment"], expected.segment)
        assert int(np.sum(blocks.chunk_records)) == len(blocks)


def test_a_block_is_indexed_like_a_sequence(corpus: tuple[list[Any], DataRef]) -> None:
    _, ref = corpus
    blocks = ydl.token_blocks(ref, length=16)
    n = len(blocks)
    with pytest.raises(IndexError, match=rf"block index {n} is out of range \[-{n}, {n}\)"):
        blocks[n]
    with pytest.raises(IndexError, match="out of range"):
        blocks.get_batch([0, -n - 1])
    np.testing.assert_array_equal(blocks[-1]["tokens"], blocks[n - 1]["tokens"])
    assert set(blocks[0]) == {"tokens"}
    assert blocks.get_batch([])["tokens"].shape == (0, 16)
    with pytest.raises(ydl.SchemaError, match="'position'"):
        blocks.get_batch([0], fields=["position"])
    assert "field='tokens', length=16" in repr(blocks)


# --- streams: epochs, resume, shards, workers, states ---


@PROPERTY
@given(
    length=st.integers(1, 40),
    eos=st.sampled_from([None, EOS]),
    seed=st.integers(0, 2**31),
    how=st.sampled_from(READS),
    data=st.data(),
)
def test_shuffled_epochs_are_permutations_and_resume_anywhere(
    corpus: tuple[list[Any], DataRef],
    length: int,
    eos: int | None,
    seed: int,
    how: str,
    data: st.DataObject,
) -> None:
    docs, ref = corpus
    blocks = ydl.token_blocks(reading(ref, how), length=length, eos=eos)
    expected = sorted(tuple(r) for r in Reference(docs, length, eos).tokens.tolist())
    stream = blocks.stream(shuffle=True, shuffle_seed=seed)
    epochs = [rows(stream), rows(stream)]
    for epoch in epochs:
        assert sorted(epoch) == expected
    whole = epochs[0] + epochs[1]
    offset = data.draw(st.integers(0, len(whole) - 1))
    resumed = blocks.stream(shuffle=True, shuffle_seed=seed, start_offset=offset)
    tail = rows(resumed) + (rows(resumed) if offset < len(epochs[0]) else [])
    assert tail == whole[offset:]
    # A state saved there, through JSON, resumes the same.
    saved = blocks.stream(shuffle=True, shuffle_seed=seed)
    saved.seek(offset)
    state = json.loads(json.dumps(saved.state().to_dict()))
    again = blocks.stream(shuffle=True, shuffle_seed=seed)
    again.load_state(state)
    assert (rows(again) + rows(again))[: len(tail)] == tail


@PROPERTY
@given(
    length=st.integers(1, 30),
    eos=st.sampled_from([None, EOS]),
    shards=st.integers(2, 3),
    step=st.integers(0, 40),
)
def test_shards_are_disjoint_cover_the_epoch_and_rescale(
    corpus: tuple[list[Any], DataRef],
    length: int,
    eos: int | None,
    shards: int,
    step: int,
) -> None:
    docs, ref = corpus
    blocks = ydl.token_blocks(ref, length=length, eos=eos)
    expected = Reference(docs, length, eos).tokens

    def read(stream: ydl.Stream) -> list[int]:
        """The blocks of the stream's next epoch, checked against the reference."""
        begun = stream.offset
        items = rows(stream)
        ids = [int(i) for (i,) in stream.lineage(len(items), start_offset=begun)]
        assert items == [tuple(r) for r in expected[ids].tolist()]
        return ids

    args: dict[str, Any] = dict(shuffle=True, shuffle_seed=3, num_shards=shards)
    seen = Counter(
        i for rank in range(shards) for i in read(blocks.stream(**args, shard_rank=rank))
    )
    assert seen == Counter(range(len(blocks)))
    # Elastic: every rank k items in, the rest of the epoch read on another number of shards.
    before = [blocks.stream(**args, shard_rank=rank) for rank in range(shards)]
    k = min(step, *(len(stream) for stream in before))
    consumed = []
    for stream in before:
        consumed += [int(i) for (i,) in stream.lineage(k)]
        list(itertools.islice(iter(stream), k))
    (checkpoint,) = {stream.global_offset for stream in before}
    args["num_shards"] = 5 - shards
    after = [
        i
        for rank in range(5 - shards)
        for i in read(blocks.stream(**args, shard_rank=rank, global_start=checkpoint))
    ]
    if checkpoint < len(blocks):
        assert Counter(consumed + after) == Counter(range(len(blocks)))


def test_lineage_names_blocks_and_documents_name_their_documents(
    corpus: tuple[list[Any], DataRef],
) -> None:
    docs, ref = corpus
    blocks = ydl.token_blocks(ref, length=24, eos=EOS)
    expected = Reference(docs, 24, EOS)
    stream = blocks.stream(shuffle=True, shuffle_seed=5)
    (first,), (second,) = stream.lineage(2)
    got = rows(stream)[:2]
    assert got == [tuple(expected.tokens[first]), tuple(expected.tokens[second])]
    for i in (first, second):
        found = blocks.documents(i)
        assert [tuple(r) for r in found.tolist()] == expected.documents(i)
        # Each named document's positions hold those tokens.
        tokens = np.concatenate(
            [np.append(docs[j] if docs[j] is not None else [], EOS)[a:b] for j, a, b in found]
        )
        np.testing.assert_array_equal(tokens, expected.tokens[i])


def test_process_workers_give_what_the_stream_gives_in_process(
    corpus: tuple[list[Any], DataRef],
) -> None:
    _, ref = corpus
    blocks = ydl.token_blocks(ref, length=20, eos=EOS, segments=True)
    args: dict[str, Any] = dict(shuffle=True, shuffle_seed=11, batch_size=4)
    inline = list(blocks.stream(**args))
    pooled = list(blocks.stream(**args, num_workers=2, worker_type="process"))
    assert len(inline) == len(pooled)
    for a, b in zip(inline, pooled):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_blocks_pickle_with_their_index(corpus: tuple[list[Any], DataRef]) -> None:
    _, ref = corpus
    blocks = ydl.token_blocks(ref, length=9, eos=EOS, segments=True)
    before = blocks.get_batch(np.arange(len(blocks)))
    copy = pickle.loads(pickle.dumps(blocks))
    assert copy.index is not None and repr(copy) == repr(blocks)
    for key, value in copy.get_batch(np.arange(len(copy))).items():
        np.testing.assert_array_equal(value, before[key])


# --- the boundary: predicates, skip lists, transforms, batches ---


def test_predicates_and_skip_lists_work_on_blocks(corpus: tuple[list[Any], DataRef]) -> None:
    docs, ref = corpus
    blocks = ydl.token_blocks(ref, length=12, eos=EOS, segments=True)
    expected = Reference(docs, 12, EOS)
    with_eos = ydl.predicates.in_lambda(["tokens"], lambda tokens: bool((tokens == EOS).any()))
    kept = rows(blocks.stream(predicate=with_eos))
    assert kept == [tuple(r) for r in expected.tokens.tolist() if EOS in r]
    one_document = ydl.predicates.in_lambda(["segment"], lambda segment: int(segment[-1]) == 0)
    assert rows(blocks.stream(predicate=one_document)) == [
        tuple(r) for r, s in zip(expected.tokens.tolist(), expected.segment) if s[-1] == 0
    ]
    skip = [0, 3, len(blocks) - 1]
    streamed = list(blocks.stream(skip=skip, batch_size=5))
    got = np.concatenate([b["tokens"] for b in streamed])
    np.testing.assert_array_equal(got, np.delete(expected.tokens, skip, axis=0))
    assert streamed[0]["position"].shape == (5, 12)
    doubled = rows(blocks.stream(transform=lambda item: {"tokens": item["tokens"] * 2}))
    assert doubled == [tuple(2 * t for t in r) for r in expected.tokens.tolist()]


# --- mixtures ---


def test_mixtures_of_token_blocks_give_exact_shares_and_change_at_a_stage(
    storage: ydl.Storage, corpus: tuple[list[Any], DataRef]
) -> None:
    docs, ref = corpus
    other_docs = [np.full(k % 7, 1000 + k, np.int32) for k in range(50)]
    other = build(storage, other_docs)
    web = ydl.token_blocks(ref, length=8, eos=EOS)
    code = ydl.token_blocks(other, length=8, eos=EOS)
    web_rows = {tuple(r) for r in Reference(docs, 8, EOS).tokens.tolist()}
    mixture = ydl.mix(
        {"web": web, "code": code}, {"web": 3, "code": 1}, epoch_size=40,
        schedule={2: {"web": 1, "code": 1}},
    )  # fmt: skip
    stream = mixture.stream(shuffle=True, shuffle_seed=2, skip={"code": [0]})
    for epoch, share in enumerate([30, 30, 20]):
        got = rows(stream)
        from_web = sum(r in web_rows for r in got)
        assert from_web == share, epoch
        # (The one code block skipped leaves an item out wherever the mixture reads it.)
        assert len(got) - from_web in (40 - share, 40 - share - 1), epoch
    lineage = ydl.mix({"web": web, "code": code}, {"web": 3, "code": 1}).stream().lineage(4)
    assert {name for ((name, _),) in lineage} <= {"web", "code"}


# --- refusals ---


def test_bad_fields_lengths_and_eos_are_refused_by_name(storage: ydl.Storage) -> None:
    schema = ydl.Schema(
        [
            ydl.Field("tokens", np.int32, (None,)),
            ydl.Field("floats", np.float32, (None,)),
            ydl.Field("grid", np.int32, (2, 2)),
            ydl.Field("text", str),
            ydl.Field("small", np.uint8, (3,)),
        ]
    )
    records = [
        {"tokens": np.arange(3, dtype=np.int32), "floats": np.zeros(2, np.float32),
         "grid": np.zeros((2, 2), np.int32), "text": "a", "small": np.zeros(3, np.uint8)}
    ]  # fmt: skip
    ref = ydl.cache_dataset(records, "bad", "v", storage, schema=schema, progress=False)
    with pytest.raises(ydl.SchemaError, match=r"field 'floats' is float32\[None\]"):
        ydl.token_blocks(ref, "floats")
    with pytest.raises(ydl.SchemaError, match=r"field 'grid' is int32\[2, 2\]"):
        ydl.token_blocks(ref, "grid")
    with pytest.raises(ydl.SchemaError, match="field 'text' is str"):
        ydl.token_blocks(ref, "text")
    with pytest.raises(ydl.SchemaError, match=r"no field 'nope'; the schema has \['tokens'"):
        ydl.token_blocks(ref, "nope")
    for bad in (0, -1):
        with pytest.raises(
            ValueError, match=f"length must be at least 1 token per block, got {bad}"
        ):
            ydl.token_blocks(ref, length=bad)
    with pytest.raises(TypeError, match="length must be an int"):
        ydl.token_blocks(ref, length="8")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"eos=256 does not fit the field's dtype uint8 \(\[0, 255\]\)"
    ):
        ydl.token_blocks(ref, "small", eos=256)
    with pytest.raises(ValueError, match="eos=-1 does not fit"):
        ydl.token_blocks(ref, "small", eos=-1)
    with pytest.raises(TypeError, match="eos must be None or an int"):
        ydl.token_blocks(ref, eos=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="segments must be a bool"):
        ydl.token_blocks(ref, segments="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cut from one DataRef's documents, got Mixture"):
        ydl.token_blocks(ydl.mix({"a": ref}))  # type: ignore[arg-type]
    blocks = ydl.token_blocks(ref, "small", length=2, eos=255)
    assert blocks[0]["tokens"].dtype == np.uint8
    with pytest.raises(ValueError, match="ngram= windows over token blocks"):
        blocks.stream(ngram=ydl.NGram({-1: ["tokens"], 0: ["tokens"]}, 1, "tokens"))
