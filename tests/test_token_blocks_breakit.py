"""Token blocks and token columns as a demanding user and a hostile environment meet them:
corner-case data (no documents, empty ones, dtypes from uint8 to uint64, nulls, fixed
shapes, compressed fields), damaged storage, versions of an earlier release, buckets read on
demand through a small local cache, stream states loaded into other blocks, the framework
faces, and many threads at once; each checked against a plain numpy reference."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.damage import chunk_path, flip_byte

import yogadl_plus as ydl
from yogadl_plus.dataref import DataRef, DataRefOnDemand

_built = itertools.count()


def flat_blocks(docs: list[Any], length: int, eos: int | None, dtype: Any) -> np.ndarray:
    """The reference: every document then eos, end to end, cut into rows of ``length``."""
    flat: list[int] = []
    for doc in docs:
        flat += [] if doc is None else [int(t) for t in doc]
        flat += [] if eos is None else [int(eos)]
    n = len(flat) // length
    return np.array(flat[: n * length], dtype=dtype).reshape(n, length)


def build(
    storage: ydl.Storage,
    docs: list[Any],
    dtype: Any = np.int32,
    shape: tuple[int | None, ...] = (None,),
    *,
    field: str = "tokens",
    chunk_bytes: int = 300,
    **options: Any,
) -> DataRef:
    """A version of ``docs`` as field ``field`` (None: a null), in small chunks."""
    nullable = any(d is None for d in docs)
    schema = ydl.Schema(
        [ydl.Field(field, dtype, shape, nullable=nullable, **options), ydl.Field("k", np.int64)]
    )
    records = [{field: d, "k": np.int64(i)} for i, d in enumerate(docs)]
    return ydl.cache_dataset(
        records, "d", f"v{next(_built)}", storage, schema=schema, progress=False,
        chunk_bytes=chunk_bytes,
    )  # fmt: skip


def random_docs(seed: int, n: int, dtype: Any = np.int32, most: int = 30) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    return [
        rng.integers(info.min, info.max, int(rng.integers(0, most)), dtype=dtype, endpoint=True)
        for _ in range(n)
    ]


def all_blocks(blocks: ydl.TokenBlocks) -> dict[str, np.ndarray]:
    return blocks.get_batch(np.arange(len(blocks)))


# --- buckets: pulled, and read on demand through a local cache smaller than the version ---


@pytest.mark.servers
@pytest.mark.filterwarnings("ignore::yogadl_plus.CacheLimitWarning")
def test_blocks_read_on_demand_through_a_small_cache_are_the_built_ones(s3_server, tmp_path):
    from helpers.remote_helpers import make_storage, spec_for

    spec = spec_for("s3", s3_server, s3_server.make_bucket(), prefix=uuid.uuid4().hex[:12])
    docs = random_docs(11, 300, np.uint16, most=40)
    built = build(make_storage(spec, tmp_path / "builder"), docs, np.uint16, chunk_bytes=400)
    chunks = built.manifest.chunks
    assert len(chunks) >= 12
    want = flat_blocks(docs, 50, 7, np.uint16)
    limit = 3 * max(c.bytes for c in chunks)
    machine = make_storage(spec, tmp_path / "machine", local_cache_limit=limit)
    on_demand = machine.fetch("d", built.version, on_demand=True)
    assert isinstance(on_demand, DataRefOnDemand)
    blocks = ydl.token_blocks(on_demand, length=50, eos=7, segments=True)
    # Read ahead of a block announces every chunk it spans; they come to local disk.
    spanning = [i for i in range(len(blocks)) if len(spanned_chunks(blocks, i)) > 1]
    assert spanning
    for i in spanning:
        assert announced_chunks(blocks, on_demand, i) == spanned_chunks(blocks, i), i
    last = len(blocks) - 1
    blocks.read_ahead(np.array([last]))
    blocks.get_batch([last])
    # A shuffled epoch in batches whose blocks span chunks: each the reference's.
    stream = blocks.stream(shuffle=True, shuffle_seed=4, batch_size=6, num_workers=2)
    lineage = stream.lineage(len(stream))
    got = list(stream)
    assert len(got) == len(lineage) and sum(len(ids) for ids in lineage) == len(want)
    for ids, batch in zip(lineage, got):
        np.testing.assert_array_equal(batch["tokens"], want[np.asarray(ids).reshape(-1)])
    pulled = make_storage(spec, tmp_path / "pulled").fetch("d", built.version)
    pulled_blocks = ydl.token_blocks(pulled, length=50, eos=7)
    np.testing.assert_array_equal(all_blocks(pulled_blocks)["tokens"], want)


def announced_chunks(blocks: ydl.TokenBlocks, ref: DataRef, i: int) -> set[int]:
    """The chunks ``blocks.read_ahead([i])`` announces to ``ref``."""
    announced: list[np.ndarray] = []
    ref.read_ahead = announced.append  # type: ignore[method-assign]
    try:
        blocks.read_ahead(np.array([i]))
    finally:
        del ref.read_ahead
    starts = np.concatenate([[0], np.cumsum(ref.chunk_records)])
    return set((np.searchsorted(starts, np.concatenate(announced or [[]]), "right") - 1).tolist())


def spanned_chunks(blocks: ydl.TokenBlocks, i: int) -> set[int]:
    """The chunks block ``i`` takes tokens from."""
    cum, length = blocks.index.cum, blocks.length
    first = int(np.searchsorted(cum, i * length, "right")) - 1
    last = int(np.searchsorted(cum, (i + 1) * length, "left")) - 1
    return {c for c in range(first, last + 1) if cum[c + 1] > cum[c]}


def test_read_ahead_of_blocks_tells_a_local_version_nothing(tmp_path):
    # (Its hints are of records' pages; blocks read token columns.)
    docs = [np.arange(n, dtype=np.int32) for n in [3, 40, 0, 5, 60, 2, 2, 2, 80]]
    ref = build(ydl.LocalStorage(tmp_path), docs, chunk_bytes=120)
    blocks = ydl.token_blocks(ref, length=37, eos=1)
    assert all(announced_chunks(blocks, ref, i) == set() for i in range(len(blocks)))


# --- stream states: loaded only where they mean the same blocks ---


@pytest.fixture(scope="module")
def two_fields(tmp_path_factory: pytest.TempPathFactory) -> DataRef:
    """120 documents with two token fields ("tokens", "other") and a str, in small chunks."""
    rng = np.random.default_rng(0)
    schema = ydl.Schema(
        [
            ydl.Field("tokens", np.int32, (None,)),
            ydl.Field("other", np.int32, (None,)),
            ydl.Field("text", str),
        ]
    )
    records = [
        {
            "tokens": rng.integers(0, 100, rng.integers(0, 30)).astype(np.int32),
            "other": rng.integers(0, 100, rng.integers(0, 30)).astype(np.int32),
            "text": f"doc {i}",
        }
        for i in range(120)
    ]
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("two"))
    return ydl.cache_dataset(
        records, "two", "v", storage, schema=schema, progress=False, chunk_bytes=500
    )


@pytest.mark.parametrize(
    "changed, named",
    [
        (dict(length=9), r"token_blocks\(two:v, tokens, 9, eos=3\)"),
        (dict(eos=4), r"token_blocks\(two:v, tokens, 8, eos=4\)"),
        (dict(eos=None), r"this stream 'token_blocks\(two:v, tokens, 8\)'"),
        (dict(segments=True), r"token_blocks\(two:v, tokens, 8, eos=3, segments=True\)"),
        (dict(field="other"), r"token_blocks\(two:v, other, 8, eos=3\)"),
    ],
)
def test_a_state_loads_only_into_blocks_made_alike_naming_what_differs(
    two_fields: DataRef, changed: dict[str, Any], named: str
) -> None:
    made: dict[str, Any] = dict(field="tokens", length=8, eos=3, segments=False)
    args: dict[str, Any] = dict(shuffle=True, shuffle_seed=1, batch_size=4)
    stream = ydl.token_blocks(two_fields, **made).stream(**args)
    list(itertools.islice(iter(stream), 5))
    state = json.loads(json.dumps(stream.state().to_dict()))
    other = ydl.token_blocks(two_fields, **{**made, **changed}).stream(**args)
    with pytest.raises(ValueError, match=named):
        other.load_state(state)


def test_a_versions_state_and_a_blocks_state_do_not_cross(two_fields: DataRef) -> None:
    blocks = ydl.token_blocks(two_fields, length=8, eos=3)
    for saver, loader in [(two_fields, blocks), (blocks, two_fields)]:
        stream = saver.stream(shuffle=True, batch_size=4)
        next(iter(stream))
        state = json.loads(json.dumps(stream.state().to_dict()))
        with pytest.raises(ValueError, match="saved from a different stream"):
            loader.stream(shuffle=True, batch_size=4).load_state(state)


def test_the_lineage_command_refuses_a_blocks_state_in_a_sentence(
    two_fields: DataRef, tmp_path: Path
) -> None:
    blocks = ydl.token_blocks(two_fields, length=8, eos=3)
    root = str(Path(two_fields.directory).parent.parent)
    for source in (blocks, ydl.mix({"a": blocks, "b": ydl.token_blocks(two_fields, "other", 8)})):
        stream = source.stream(batch_size=2)
        next(iter(stream))
        saved = tmp_path / "state.json"
        saved.write_text(json.dumps(stream.state().to_dict()))
        done = subprocess.run(
            [sys.executable, "-m", "yogadl_plus", "lineage", "two", "v", "--state", str(saved),
             "--storage", root],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "over token blocks" in done.stderr or "over a mixture" in done.stderr
        assert "ask stream.lineage()" in done.stderr


# --- data at the edges, as numpy says ---


@pytest.mark.parametrize(
    "dtype, eos",
    [
        (np.uint8, 255),
        (np.uint16, np.uint16(65535)),
        (np.int64, -(2**63)),
        (np.uint64, 2**64 - 1),
        (np.uint64, np.uint64(2**63 + 5)),
        (np.int8, np.int64(-128)),
    ],
)
def test_every_integer_dtype_and_its_extreme_eos(tmp_path, dtype: Any, eos: Any) -> None:
    docs = random_docs(1, 30, dtype)
    ref = build(ydl.LocalStorage(tmp_path), docs, dtype)
    for blocks in (ydl.token_blocks(ref, length=5, eos=eos), ydl.token_blocks(ref, length=5)):
        got = all_blocks(blocks)["tokens"]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, flat_blocks(docs, 5, blocks.eos, dtype))
    info = np.iinfo(dtype)
    for bad in (int(info.min) - 1, int(info.max) + 1):
        with pytest.raises(ValueError, match=f"eos={bad} does not fit"):
            ydl.token_blocks(ref, eos=bad)
    for bad in (True, np.bool_(False), 3.0):
        with pytest.raises(TypeError, match="eos must be None or an int"):
            ydl.token_blocks(ref, eos=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "shape, options, nulls",
    [
        ((None,), {}, True),
        ((4,), {}, False),
        ((4,), {}, True),
        ((None,), {"codec": ydl.codecs.Compressed()}, True),
        ((6,), {"codec": ydl.codecs.Compressed()}, False),
    ],
)
def test_nulls_fixed_shapes_and_compressed_fields_under_another_name(
    tmp_path, shape: tuple[int | None, ...], options: dict[str, Any], nulls: bool
) -> None:
    rng = np.random.default_rng(2)
    size = shape[0]
    docs: list[Any] = [
        rng.integers(0, 9000, size if size is not None else int(rng.integers(0, 20)), np.int32)
        for _ in range(40)
    ]
    if nulls:
        docs[3] = docs[4] = docs[30] = None
    ref = build(ydl.LocalStorage(tmp_path), docs, np.int32, shape, field="ids", **options)
    assert ref.token_counts("ids") is not None
    for eos in (None, 9):
        blocks = ydl.token_blocks(ref, "ids", length=7, eos=eos, segments=True)
        got = all_blocks(blocks)
        assert set(got) == {"tokens", "position", "segment"}
        np.testing.assert_array_equal(got["tokens"], flat_blocks(docs, 7, eos, np.int32))


def test_no_documents_empty_documents_and_blocks_longer_than_the_corpus(tmp_path) -> None:
    storage = ydl.LocalStorage(tmp_path)
    none = ydl.token_blocks(build(storage, [], chunk_bytes=64), length=4, eos=3)
    empty_ref = build(storage, [np.zeros(0, np.int32)] * 50, chunk_bytes=64)
    assert len(empty_ref.manifest.chunks) > 5
    text = build(storage, random_docs(3, 20), chunk_bytes=64)
    zero_blocks = [
        none,
        ydl.token_blocks(empty_ref, length=1, segments=True),
        ydl.token_blocks(text, length=10**6, eos=1, segments=True),
    ]
    for blocks in zero_blocks:
        assert len(blocks) == 0 and list(blocks.stream(shuffle=True, batch_size=2)) == []
        batch = blocks.get_batch([])
        assert batch["tokens"].shape == (0, blocks.length)
        with pytest.raises(IndexError):
            blocks.documents(0)
    four = ydl.token_blocks(text, length=4)
    with pytest.raises(ValueError, match="source 'a' has no records, yet weight 1"):
        ydl.mix({"a": zero_blocks[2], "b": four}, {"a": 1, "b": 1})
    assert len(list(ydl.mix({"a": zero_blocks[2], "b": four}).stream())) == len(four)
    # All empty, with eos: a block of eos tokens, each its own document.
    eos_only = ydl.token_blocks(empty_ref, length=3, eos=7, segments=True)
    assert len(eos_only) == 16
    np.testing.assert_array_equal(eos_only[0]["tokens"], [7, 7, 7])
    np.testing.assert_array_equal(eos_only[0]["segment"], [0, 1, 2])
    assert eos_only.documents(1).tolist() == [[3, 0, 1], [4, 0, 1], [5, 0, 1]]
    # One document longer than many blocks, in blocks of one token.
    long = build(storage, [np.arange(500, dtype=np.int32)], chunk_bytes=64)
    ones = ydl.token_blocks(long, length=1, eos=-1, segments=True)
    assert len(ones) == 501 and ones[-1]["tokens"].tolist() == [-1]
    assert ones[-1]["position"].tolist() == [500]
    assert ones.documents(250).tolist() == [[0, 250, 251]]


def test_a_length_too_long_for_a_block_is_a_value_error_naming_it(tmp_path) -> None:
    ref = build(ydl.LocalStorage(tmp_path), random_docs(0, 3), np.int32)
    with pytest.raises(ValueError, match=r"length=2000000000 .* 8,000,000,000 bytes"):
        ydl.token_blocks(ref, length=2_000_000_000)


# --- damaged storage, and versions an earlier release built ---


@pytest.mark.parametrize("part", ["tokens", "ends", "eos_ends"])
def test_a_flipped_byte_in_a_token_column_is_refused_through_token_blocks(
    tmp_path, part: str
) -> None:
    storage = ydl.LocalStorage(tmp_path)
    ref = build(storage, random_docs(1, 40, most=300), chunk_bytes=8000)
    assert len(ref.manifest.chunks) >= 3
    blocks = ydl.token_blocks(ref, length=64, eos=1)
    want = all_blocks(blocks)["tokens"]  # (each chunk verified and stamped)
    column = ref.token_chunk("tokens", 1)
    needle = np.asarray(getattr(column, part)[:]).tobytes()
    path = chunk_path(ref, 1)
    ref.close()
    del column
    flip_byte(path, path.read_bytes().find(needle) + len(needle) // 2)
    cum = blocks.index.cum
    inside = [i for i in range(len(blocks)) if cum[1] <= i * 64 < cum[2]]
    assert inside and cum[1] >= 64  # (block 0 lies in chunk 0)
    for read in (
        lambda b: b.get_batch(inside),
        lambda b: list(b.stream(shuffle=True, batch_size=5)),
        lambda b: b.documents(inside[0]),
    ):
        again = ydl.token_blocks(storage.fetch("d", ref.version), length=64, eos=1)
        np.testing.assert_array_equal(again[0]["tokens"], want[0])  # (chunk 0 is fine)
        with pytest.raises(ydl.CacheCorrupted, match=r"chunk-00001\.mdb .* sha256"):
            read(again)


OLD_RELEASE = r"""
import sys, numpy as np, yogadl_plus as ydl
rng = np.random.default_rng(3)
docs = [rng.integers(0, 60000, int(rng.integers(0, 40))).astype(np.uint16) for _ in range(80)]
docs[7] = None
schema = ydl.Schema([ydl.Field("ids", np.uint16, (None,), nullable=True)])
ydl.cache_dataset([{"ids": d} for d in docs], "old", sys.argv[2], ydl.LocalStorage(sys.argv[1]),
                  schema=schema, progress=False, chunk_bytes=300)
"""


# The last commit whose builds have no token columns (cache format 3).
BEFORE_TOKEN_COLUMNS = "8ab6e0d"


def code_before_token_columns(folder: Path) -> Path | None:
    """The package as it was at BEFORE_TOKEN_COLUMNS, unpacked under ``folder`` from this
    repository's history (None without git or that history: a shallow clone)."""
    import io
    import tarfile

    root = Path(__file__).resolve().parents[1]
    try:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", BEFORE_TOKEN_COLUMNS, "yogadl_plus"],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def test_a_version_an_earlier_release_built_gives_the_same_blocks(tmp_path) -> None:
    """A version written by the code before token columns (scanned) and one written now
    (token columns): the same blocks, documents and shuffled stream."""
    before = code_before_token_columns(tmp_path / "before-code")
    if before is None:
        pytest.skip(f"no git history holding {BEFORE_TOKEN_COLUMNS} here")
    here = str(Path(ydl.__file__).resolve().parents[1])
    for version, path in (("before", str(before)), ("now", here)):
        subprocess.run(
            [sys.executable, "-c", OLD_RELEASE, str(tmp_path), version],
            env={**os.environ, "PYTHONPATH": path}, cwd=tmp_path, check=True, timeout=120,
        )  # fmt: skip
    storage = ydl.LocalStorage(tmp_path)
    before, now = storage.fetch("old", "before"), storage.fetch("old", "now")
    assert before.token_counts("ids") is None and now.token_counts("ids") is not None
    for eos, segments in [(None, False), (65535, True)]:
        made: dict[str, Any] = dict(eos=eos, segments=segments)
        old, new = (ydl.token_blocks(r, "ids", 7, **made) for r in [before, now])
        assert len(old) == len(new) > 100
        for key, value in all_blocks(old).items():
            np.testing.assert_array_equal(value, all_blocks(new)[key])
        for i in (0, len(old) // 2, len(old) - 1):
            np.testing.assert_array_equal(old.documents(i), new.documents(i))
        args: dict[str, Any] = dict(shuffle=True, shuffle_seed=3, batch_size=5)
        for a, b in zip(old.stream(**args), new.stream(**args)):
            np.testing.assert_array_equal(a["tokens"], b["tokens"])


# --- concurrency, faces, pickling ---


@pytest.mark.parametrize("eos", [None, 5])
def test_get_batch_from_four_threads_at_once_equals_the_reference(tmp_path, eos) -> None:
    docs = random_docs(8, 300, np.uint16, most=25)
    ref = build(ydl.LocalStorage(tmp_path), docs, np.uint16, chunk_bytes=200)
    assert len(ref.manifest.chunks) > 30
    blocks = ydl.token_blocks(ref, length=11, eos=eos, segments=True)
    want = flat_blocks(docs, 11, eos, np.uint16)
    wrong: list[int] = []

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            picked = rng.integers(0, len(blocks), int(rng.integers(1, 30)))
            if not np.array_equal(blocks.get_batch(picked)["tokens"], want[picked]):
                wrong.append(seed)
            blocks.documents(int(picked[0]))

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads) and wrong == []


@pytest.mark.parametrize("workers", [0, 2])
def test_the_torch_face_gives_blocks_as_tensors_and_resumes_exactly(tmp_path, workers) -> None:
    torch = pytest.importorskip("torch")
    import yogadl_plus.torch

    docs = random_docs(5, 80, np.int64, most=20)
    ref = build(ydl.LocalStorage(tmp_path), docs, np.int64, chunk_bytes=500)
    blocks = ydl.token_blocks(ref, length=16, eos=0, segments=True)

    def loader() -> Any:
        stream = blocks.stream(batch_size=4, shuffle=True, shuffle_seed=1)
        return yogadl_plus.torch.make_dataloader(stream, num_workers=workers)

    first = loader()
    epoch = iter(first)
    head = [next(epoch) for _ in range(3)]
    assert {k: (v.dtype, tuple(v.shape)) for k, v in head[0].items()} == {
        "tokens": (torch.int64, (4, 16)),
        "position": (torch.int64, (4, 16)),
        "segment": (torch.int32, (4, 16)),
    }
    saved = first.state_dict()
    rest = list(epoch)
    resumed = loader()
    resumed.load_state_dict(saved)
    again = list(resumed)
    assert len(again) == len(rest)
    for a, b in zip(rest, again):
        assert all(torch.equal(a[k], b[k]) for k in a)
    got = torch.cat([b["tokens"] for b in head + rest]).numpy()
    want = flat_blocks(docs, 16, 0, np.int64)
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))


class NoTokenColumns(DataRef):
    """A DataRef read as a version built before token columns existed."""

    def token_counts(self, field: str) -> np.ndarray | None:
        return None


def test_a_scanned_index_travels_with_the_blocks_and_is_not_scanned_again(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = build(ydl.LocalStorage(tmp_path), random_docs(4, 60))
    blocks = ydl.token_blocks(NoTokenColumns(ref.directory, ref.manifest), length=9, eos=2)
    want = all_blocks(blocks)
    copy = pickle.loads(pickle.dumps(blocks))
    monkeypatch.setattr(DataRef, "get_batch", None)  # (a scan would read documents' lengths)
    assert copy.index is not None and len(copy) == len(blocks)
    monkeypatch.undo()
    for key, value in all_blocks(copy).items():
        np.testing.assert_array_equal(value, want[key])
