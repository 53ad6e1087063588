"""DataRef: record i in O(1), negative indices, batches of selected fields, across chunks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import yogadl_plus as ydl

N = 700


def make_records():
    rng = np.random.default_rng(5)
    for i in range(N):
        yield {
            "i": np.int64(i),
            "x": rng.standard_normal(8).astype(np.float32),
            "name": f"rec-{i}",
            "ragged": np.arange(i % 7, dtype=np.int16),
            "big": np.full(2048, i % 251, np.uint8),
        }


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("dataref"))
    # Small chunks so that reads cross chunk boundaries.
    return ydl.cache_dataset(make_records, "d", "v", storage, chunk_bytes=200_000, progress=False)


def test_several_chunks_and_len(ref):
    assert len(ref.manifest.chunks) >= 3
    assert len(ref) == N == sum(c.records for c in ref.manifest.chunks)


def test_every_record_reads_back(ref):
    expected = list(make_records())
    for i in np.random.default_rng(0).permutation(N):
        got, want = ref[int(i)], expected[i]
        assert got["i"] == i and got["name"] == want["name"]
        np.testing.assert_array_equal(got["x"], want["x"])
        np.testing.assert_array_equal(got["ragged"], want["ragged"])
        np.testing.assert_array_equal(got["big"], want["big"])


def test_negative_indices_and_numpy_ints(ref):
    assert ref[-1]["i"] == N - 1 and ref[-N]["i"] == 0
    assert ref[np.int32(5)]["i"] == 5


@pytest.mark.parametrize("index", [N, -N - 1, 10**12])
def test_out_of_range_is_index_error_with_the_range(ref, index):
    with pytest.raises(IndexError, match=rf"record index {index} is out of range \[-{N}, {N}\)"):
        ref[index]


def test_non_int_index_is_type_error(ref):
    with pytest.raises(TypeError, match="DataRef indices are ints, slices, or lists"):
        ref[1.5]
    with pytest.raises(TypeError):
        ref["x"]


def test_get_batch_stacks_fixed_fields_and_lists_the_rest(ref):
    indices = [699, 0, 350, -1, 123, 123]
    batch = ref.get_batch(indices)
    assert batch["i"].tolist() == [699, 0, 350, 699, 123, 123]
    assert batch["x"].shape == (6, 8) and batch["x"].dtype == np.float32
    assert batch["x"].flags.c_contiguous and batch["x"].flags.writeable
    assert batch["big"].shape == (6, 2048)
    assert batch["name"] == [f"rec-{i % N}" for i in [699, 0, 350, 699, 123, 123]]
    assert [len(r) for r in batch["ragged"]] == [699 % 7, 0, 0, 699 % 7, 123 % 7, 123 % 7]
    for row, i in zip(batch["x"], batch["i"]):
        np.testing.assert_array_equal(row, ref[int(i)]["x"])


def test_get_batch_selects_fields_in_the_order_asked(ref):
    batch = ref.get_batch(np.array([3, 2]), fields=["name", "i"])
    assert list(batch) == ["name", "i"] and batch["i"].tolist() == [3, 2]
    assert list(ref.get_batch([1], fields="x")) == ["x"]


def test_get_batch_does_not_decode_unselected_fields(ref, monkeypatch):
    from yogadl_plus import codecs

    def explode(*args, **kwargs):
        raise AssertionError("an unselected field was decoded")

    monkeypatch.setattr(codecs.String, "decode", explode)
    monkeypatch.setattr(codecs.Raw, "decode", explode)
    batch = ref.get_batch(list(range(50)), fields=["i", "x", "big"])
    assert batch["i"].tolist() == list(range(50))


def test_get_batch_errors(ref):
    with pytest.raises(IndexError, match=f"record index {N}"):
        ref.get_batch([0, N])
    with pytest.raises(TypeError, match="1-d sequence of ints"):
        ref.get_batch([0.5])
    with pytest.raises(ydl.SchemaError, match="no field 'nope'"):
        ref.get_batch([0], fields=["nope"])
    assert ref.get_batch([])["i"].shape == (0,)


def test_identity(ref):
    assert (ref.dataset_id, ref.version) == ("d", "v")
    assert ref.schema.names == ("i", "x", "name", "ragged", "big")
    assert "records=700" in repr(ref)


def test_a_collected_datarefs_release_never_waits_for_the_open_lock(tmp_path):
    """The garbage collector may finalize a DataRef while this thread opens an LMDB file
    (holding the environments' lock): the finalizer must not wait for that lock."""
    import threading

    from yogadl_plus.cache import environments

    storage = ydl.LocalStorage(tmp_path)
    ydl.cache_dataset([{"i": i} for i in range(5)], "d", "v", storage, progress=False)
    dropped = storage.fetch("d", "v")
    assert dropped[3]["i"] == 3
    finished = threading.Event()

    def collect_inside_open():
        with environments.ENVIRONMENTS.lock:  # as in acquire(), when the collector strikes
            dropped._chunks._opened._finalizer()
        finished.set()

    worker = threading.Thread(target=collect_inside_open, daemon=True)
    worker.start()
    assert finished.wait(10), "the finalizer waited for a lock its own thread holds"
    assert environments.ENVIRONMENTS.collected, "released later, not while the lock is held"
    # The queued release is applied at the next open: the file is opened and read again.
    again = storage.fetch("d", "v")
    assert again.get_batch([4])["i"].tolist() == [4]
    assert not environments.ENVIRONMENTS.collected
    del again  # a DataRef dropped while the lock is free releases at once
    assert not environments.ENVIRONMENTS.collected


def test_verify_reports_each_chunk_that_matches_and_names_a_damaged_one(tmp_path):
    storage = ydl.LocalStorage(tmp_path)
    ref = ydl.cache_dataset(make_records, "d", "v", storage, chunk_bytes=200_000, progress=False)
    seen = []
    ref.verify(on_chunk=seen.append)
    assert seen == list(ref.manifest.chunks)
    path = Path(ref.directory) / ref.manifest.chunks[-1].file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    seen.clear()
    with pytest.raises(ydl.CacheCorrupted, match=f"^chunk {re.escape(str(path))} has sha256"):
        ref.verify(on_chunk=seen.append)
    assert seen == list(ref.manifest.chunks[:-1])


def test_slices_lists_and_masks_give_the_get_batch_form(ref):
    # Before: ref[10:13] and ref[[1, 2]] raised TypeError; numpy, HF datasets and Grain users
    # type both.
    for index, picked in (
        (slice(10, 13), [10, 11, 12]),
        (slice(None, None, -300), [N - 1, N - 301, N - 601]),
        ([1, -1, 1], [1, N - 1, 1]),
        (np.array([5, 6]), [5, 6]),
        (np.arange(N) % 250 == 0, [0, 250, 500]),
        ([], []),
    ):
        got, want = ref[index], ref.get_batch(picked)
        assert got["i"].tolist() == want["i"].tolist() == [i % N for i in picked]
        assert got["name"] == want["name"]
    with pytest.raises(IndexError, match="a mask of 3 bools"):
        ref[np.array([True, False, True])]
    with pytest.raises(IndexError, match="out of range"):
        ref[[0, N]]


def test_dir_lists_only_public_names():
    names = dir(ydl)
    assert {"Any", "TYPE_CHECKING", "annotations", "dataref", "checks"}.isdisjoint(names)
    assert {"cache_dataset", "DataRef", "torch", "tensorflow", "mix"} <= set(names)
    assert all(not n.startswith("_") or n == "__version__" for n in names)
