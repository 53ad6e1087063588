"""A chunk's download: written at its place in the file as its bytes arrive, hashed on the way
when it comes in one read, and right whatever pieces the bytes come in and however often a
read is cut off and begun again (storage/chunkdownload.py, against an object store in memory)."""

from __future__ import annotations

import hashlib
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yogadl_plus.cache.manifest import ChunkInfo
from yogadl_plus.errors import CacheCorrupted, StorageError
from yogadl_plus.storage.chunkdownload import checked_download, download_chunk
from yogadl_plus.storage.objects import RangeSink


class PiecesStore:
    """An object store holding one object, ``data``, that sends ranged reads in pieces of
    random sizes and cuts off some of them midway (``cut``: how often), beginning them again
    as a store's retries do: ``seek(0)``, then all of it."""

    url = "mem://bucket"

    def __init__(self, data: bytes, seed: int, cut: float) -> None:
        self.data = data
        self.draw = random.Random(seed)
        self.cut = cut
        self.reads: list[tuple[int, int]] = []

    def _send(self, out: RangeSink, body: bytes) -> None:
        out.seek(0)
        at = 0
        while at < len(body):
            step = self.draw.randint(1, max(1, len(body) // 3))
            out.write(body[at : at + step])
            at += step

    def read_range_into(self, key: str, start: int, stop: int, out: RangeSink) -> None:
        self.reads.append((start, stop))
        body = self.data[start:stop]
        while self.draw.random() < self.cut:  # a try cut off midway, with other bytes
            self._send(out, bytes(b ^ 0xFF for b in body[: self.draw.randint(0, len(body))]))
        self._send(out, body)


def chunk_of(data: bytes) -> ChunkInfo:
    return ChunkInfo("chunk-00000.mdb", 1, len(data), hashlib.sha256(data).hexdigest())


def fetched(store: PiecesStore, info: ChunkInfo, path: Path, part_bytes: int) -> str | None:
    path.write_bytes(b"\0" * info.bytes)  # made at the chunk's full size first
    with ThreadPoolExecutor(4) as pool:
        return download_chunk(store, "k", info, str(path), part_bytes, lambda: pool)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=3000),
    part_bytes=st.integers(1, 1200),
    seed=st.integers(0, 2**32),
    cut=st.sampled_from([0.0, 0.5]),
)
def test_a_chunk_arrives_whole_whatever_its_pieces_parts_and_cut_off_tries(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, part_bytes: int, seed: int, cut: float
) -> None:
    path = tmp_path_factory.mktemp("chunk") / "chunk.part"
    store = PiecesStore(data, seed, cut)
    info = chunk_of(data)
    hashed = fetched(store, info, path, part_bytes)
    assert path.read_bytes() == data
    spans = sorted(set(store.reads))
    # Parts cover the chunk exactly, each of part_bytes to twice that (one read under two).
    assert [s for s, _ in spans] == [0] + [e for _, e in spans[:-1]] and spans[-1][1] == len(data)
    if len(data) < 2 * part_bytes:
        assert spans == [(0, len(data))] and hashed == info.sha256  # no need to read it back
    else:
        assert all(part_bytes <= e - s < 2 * part_bytes for s, e in spans) and hashed is None


def test_bytes_hashed_on_the_way_that_are_not_the_chunk_are_fetched_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = bytes(range(256)) * 8
    info = chunk_of(data)
    path = tmp_path / "chunk.part"
    store = PiecesStore(data, 0, 0.0)
    damaged = PiecesStore(data[:100] + b"\x00" + data[101:], 0, 0.0)
    tries = iter([damaged, damaged, store])
    checked_download(
        lambda: fetched(next(tries), info, path, 1 << 20), str(path), info, "mem://bucket/k"
    )
    assert path.read_bytes() == data
    said = [r.getMessage() for r in caplog.records]
    assert any("fetching it again (download 2 of 3)" in m for m in said), said
    # The same wrong bytes every time: the object is blamed, and says what to do.
    tries = iter([damaged] * 3)
    with pytest.raises(CacheCorrupted, match="3 downloads gave these same bytes"):
        checked_download(
            lambda: fetched(next(tries), info, path, 1 << 20), str(path), info, "mem://bucket/k"
        )


def test_a_range_cut_short_is_a_damaged_object_naming_the_chunk(tmp_path: Path) -> None:
    data = b"x" * 1000
    store = PiecesStore(data[:700], 0, 0.0)  # the object is shorter than its manifest says
    with pytest.raises(CacheCorrupted, match=r"mem://bucket/k ends before byte 1,000"):
        fetched(store, chunk_of(data), tmp_path / "chunk.part", 400)


def test_a_store_that_sends_more_than_the_range_never_writes_past_it(tmp_path: Path) -> None:
    data = bytes(range(200)) * 5

    class IgnoresRanges(PiecesStore):  # a server that answers a ranged GET with everything
        def read_range_into(self, key: str, start: int, stop: int, out: RangeSink) -> None:
            self._send(out, self.data)

    path = tmp_path / "chunk.part"
    with pytest.raises(StorageError, match=r"sent more than the bytes (0 to 500|500 to 1,000)"):
        fetched(IgnoresRanges(data, 0, 0.0), chunk_of(data), path, 400)
    assert path.stat().st_size == len(data)  # nothing written past the chunk's end
