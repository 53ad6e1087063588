"""ydl.grain: a DataRef and a Mixture as Grain random-access sources, a Grain sampler with the
stream's order, and grain.DataLoader reading every record once per epoch and resuming exactly from
its own checkpoints, with worker processes too."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus.errors import MissingExtra  # noqa: E402

N = 300
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return ydl.LocalStorage(tmp_path_factory.mktemp("grain"))


@pytest.fixture(scope="module")
def ref(storage):
    records = (
        {"i": np.int64(i), "x": np.full(4, i, np.float32), "s": f"r{i}", "odd": bool(i % 2)}
        for i in range(N)
    )
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=5000)


@pytest.fixture(scope="module")
def workers_allowed():
    # Grain 0.2.18 with JAX installed reads an absl flag when it starts worker processes and
    # fails if no absl.app parsed the flags (docs/adapters/grain.md says so).
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def ids(batches) -> list[int]:
    return [int(v) for b in batches for v in np.asarray(b["i"]).reshape(-1)]


def loader(data_source, sampler, workers=0, batch=None, **kwargs):
    operations = [] if batch is None else [grain.transforms.Batch(batch)]
    return grain.DataLoader(
        data_source=data_source,
        sampler=sampler,
        worker_count=workers,
        operations=operations,
        **kwargs,
    )


def test_a_dataref_is_a_grain_source_as_it_is_and_through_source(ref):
    plain = grain.MapDataset.source(ref)
    ours = grain.MapDataset.source(ydl.grain.source(ref))
    assert len(plain) == len(ours) == N
    for i in (0, 1, 157, N - 1):
        expected = ref[i]
        for got in (plain[i], ours[i]):
            assert got.keys() == expected.keys() and got["s"] == expected["s"]
            assert got["i"] == i and np.array_equal(got["x"], expected["x"])
    assert isinstance(ydl.grain.source(ref), grain.sources.RandomAccessDataSource)


def test_shuffle_then_batch_reads_every_record_once_per_epoch(ref):
    ds = grain.MapDataset.source(ydl.grain.source(ref, fields=["i", "x"])).shuffle(seed=3)
    batches = ds.batch(32)
    assert len(batches) == 10 and batches[0]["x"].shape == (32, 4)
    epoch0 = ids(batches[k] for k in range(len(batches)))
    assert sorted(epoch0) == list(range(N)) and epoch0 != list(range(N))
    assert set(batches[0]) == {"i", "x"}
    epoch1 = [ds[k]["i"] for k in range(N, 2 * N)]
    assert sorted(epoch1) == list(range(N)) and epoch1 != epoch0[: len(epoch1)]


def test_fields_select_what_is_decoded(ref, monkeypatch):
    src = ydl.grain.source(ref, fields=["s", "i"])
    assert list(src[5]) == ["s", "i"] and src[5]["s"] == "r5"
    assert src._getitems([9, 2, 9]) == [{"s": "r9", "i": 9}, {"s": "r2", "i": 2}, src[9]]
    decoders = ref.layout._decoders
    decoded = Counter()
    for name, decode in list(decoders.items()):
        monkeypatch.setitem(
            decoders, name, lambda data, n=name, f=decode: decoded.update([n]) or f(data)
        )
    src[7]
    assert set(decoded) == {"s", "i"}, "x and odd were not decoded"
    with pytest.raises(ydl.SchemaError, match="nope"):
        ydl.grain.source(ref, fields=["nope"])
    with pytest.raises(IndexError, match="out of range"):
        src[N]


def test_a_source_pickles_and_names_its_build(ref, storage):
    src = ydl.grain.source(ref, fields="x")
    copy = pickle.loads(pickle.dumps(src))
    assert np.array_equal(copy[11]["x"], np.full(4, 11, np.float32))
    assert repr(copy) == repr(src) and "d:v@" in repr(src) and "fields=['x']" in repr(src)
    other = ydl.cache_dataset([{"i": np.int64(0)}], "d2", "v", storage, progress=False)
    assert repr(ydl.grain.source(other)) != repr(ydl.grain.source(ref))
    with pytest.raises(TypeError, match="DataRef or a Mixture"):
        ydl.grain.source([1, 2, 3])


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_dataloader_with_index_sampler_reads_every_record_once(ref, workers, workers_allowed):
    sampler = grain.samplers.IndexSampler(N, shuffle=True, seed=1, num_epochs=2)
    got = ids(loader(ydl.grain.source(ref, ["i", "x"]), sampler, workers, batch=25))
    assert len(got) == 2 * N
    assert sorted(got[:N]) == sorted(got[N:]) == list(range(N))
    assert got[:N] != got[N:], "each epoch its own shuffle"


@pytest.mark.parametrize("shards, drop", [(1, False), (3, False), (7, True)])
def test_our_sampler_gives_grain_the_streams_order(ref, shards, drop):
    kwargs = dict(shuffle=True, shuffle_seed=11)
    per_shard = []
    for rank in range(shards):
        options = grain.sharding.ShardOptions(rank, shards, drop_remainder=drop)
        sampler = ydl.grain.sampler(ref, shard_options=options, num_epochs=2, **kwargs)
        got = ids(loader(ydl.grain.source(ref, "i"), sampler))  # shard options from the sampler
        stream = ref.stream(
            num_shards=shards, shard_rank=rank, drop_shard_remainder=drop, fields="i", **kwargs
        )
        assert got == ids(stream) + ids(stream), f"shard {rank}: epochs 0 and 1"
        per_shard.append(got)
    length = N - N % shards
    for epoch in range(2):
        seen = [r for got in per_shard for r in np.array_split(got, 2)[epoch]]
        assert len(seen) == len(set(seen)) == length, "disjoint shards covering the (cut) epoch"
    if shards > 1:
        first = per_shard[0]
        half = len(first) // 2
        assert set(first[:half]) != set(first[half:]), "records move between shards every epoch"


def test_grains_index_sampler_keeps_each_shards_records(ref):
    # The difference docs/adapters/grain.md describes: Grain shards are fixed contiguous slices.
    options = grain.sharding.ShardOptions(0, 2)
    sampler = grain.samplers.IndexSampler(N, options, shuffle=True, seed=11, num_epochs=2)
    got = ids(loader(ydl.grain.source(ref, "i"), sampler))
    assert set(got[: N // 2]) == set(got[N // 2 :]) == set(range(N // 2))


def test_sampler_arguments(ref):
    with pytest.raises(ValueError, match="needs a shuffle_seed"):
        ydl.grain.sampler(ref, shuffle=True)
    with pytest.raises(ValueError, match="num_epochs"):
        ydl.grain.sampler(ref, num_epochs=0)
    with pytest.raises(ValueError, match="shuffle_window"):
        ydl.grain.sampler(ref, shuffle_window=2)
    with pytest.raises(ValueError, match="in whole rounds of 400 shards"):
        ydl.grain.sampler(ref, shard_options=grain.sharding.ShardOptions(0, 400, True))
    one = ydl.grain.sampler(ref, num_epochs=1)
    assert len(one) == N and one[N - 1].record_key == N - 1 and one[0].rng is None
    with pytest.raises(IndexError, match=rf"Got index {N}"):
        one[N]
    endless = ydl.grain.sampler(ref, shuffle=True, shuffle_seed=2, shuffle_window=2)
    assert len(endless) == sys.maxsize and endless[10**12].rng is not None
    stream = ref.stream(shuffle=True, shuffle_seed=2, shuffle_window=2, fields="i")
    assert [endless[k].record_key for k in range(N)] == ids(stream)
    assert "shuffle_seed=2" in repr(endless) and "shuffle_window=2" in repr(endless)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_dataloader_checkpoint_resumes_at_the_next_batch(ref, workers, workers_allowed):
    def make():
        sampler = ydl.grain.sampler(ref, shuffle=True, shuffle_seed=5, num_epochs=1)
        return loader(ydl.grain.source(ref, ["i", "x"]), sampler, workers, batch=10)

    it = iter(make())
    consumed = [ids([next(it)]) for _ in range(13)]
    state = it.get_state()
    uninterrupted = [ids([b]) for b in it]
    assert sorted(r for b in consumed + uninterrupted for r in b) == list(range(N))
    del it
    resumed = iter(make())
    resumed.set_state(state)
    assert [ids([b]) for b in resumed] == uninterrupted


def test_a_checkpoint_of_another_order_or_build_is_refused(storage):
    def build(first, overwrite=False):
        rows = ({"i": np.int64(first + i)} for i in range(N))
        return ydl.cache_dataset(rows, "d3", "v", storage, progress=False, overwrite=overwrite)

    def make(data, seed):
        sampler = ydl.grain.sampler(data, shuffle=True, shuffle_seed=seed, num_epochs=1)
        return iter(loader(ydl.grain.source(data, "i"), sampler))

    ref = build(0)
    it = make(ref, 1)
    next(it)
    state = it.get_state()
    make(ref, 1).set_state(state)
    with pytest.raises(ValueError, match="Sampler in checkpoint does not match"):
        make(ref, 2).set_state(state)
    rebuilt = build(1, overwrite=True)  # the same version, records, fields and seed
    with pytest.raises(ValueError, match="does not match"):
        make(rebuilt, 1).set_state(state)


@pytest.fixture(scope="module")
def mix(storage):
    def make(name, n):
        rows = ({"src": name, "i": np.int64(i)} for i in range(n))
        return ydl.cache_dataset(rows, name, "v", storage, progress=False)

    return ydl.mix({"a": make("a", 40), "b": make("b", 200)}, {"a": 1, "b": 3}, epoch_size=100)


@pytest.mark.slow
def test_a_mixture_is_a_grain_source(mix, workers_allowed):
    src = ydl.grain.source(mix)
    ds = grain.MapDataset.source(src)
    assert len(ds) == 100
    for i in (0, 3, 99):
        assert ds[i] == mix[i] == grain.MapDataset.source(mix)[i]
    sampler = grain.samplers.IndexSampler(len(src), shuffle=True, seed=0, num_epochs=1)
    got = list(loader(src, sampler, workers=2, batch=20))
    sources = Counter(s for b in got for s in b["src"])
    assert sources == {"a": 25, "b": 75}
    assert sorted((s, int(i)) for b in got for s, i in zip(b["src"], b["i"])) == sorted(
        (r["src"], int(r["i"])) for r in (mix[k] for k in range(100))
    )
    assert ydl.grain.source(mix, fields="i")[99] == {"i": mix[99]["i"]}
    with pytest.raises(TypeError, match=r"IndexSampler over ydl\.grain\.source"):
        ydl.grain.sampler(mix)


def test_without_grain_the_face_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "grain", None)  # import grain fails, as when missing
    monkeypatch.delitem(sys.modules, "yogadl_plus.adapters.grain", raising=False)
    monkeypatch.delattr(ydl, "grain", raising=False)
    needs = r"^ydl\.grain needs Grain: pip install 'yogadl_plus\[grain\]'$"
    with pytest.raises(MissingExtra, match=needs):
        ydl.grain.source  # noqa: B018


def test_a_grain_pipeline_ends_without_noise(ref, storage, tmp_path):
    # Before: Grain keeps its source to the very end of the interpreter, where the DataRef's
    # pin released its file after the module's globals were gone: "Exception ignored in
    # Pin.__del__ ... 'NoneType' object has no attribute 'close'" on every run.
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import grain, yogadl_plus as ydl
            ref = ydl.LocalStorage({storage.root!r}).fetch("d", "v")
            sampler = grain.samplers.IndexSampler(len(ref), shuffle=True, seed=0, num_epochs=1)
            loader = grain.DataLoader(data_source=ref, sampler=sampler, worker_count=0)
            print(sum(1 for _ in loader))
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout == f"{N}\n", result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
