"""Mixtures (issue 17, API.md section 7a): ``ydl.mix(sources, weights, epoch_size)`` reads several
cached datasets as one, each source at exactly its largest-remainder share of every epoch, with
the Stream's order, resume, shard, elastic and boundary contract unchanged.

Small real caches (records ``{"src": j, "i": i}``) are built once for the module and mixed at
the weights, epoch sizes and shards hypothesis draws; the expected shares are computed here with
fractions. The order arithmetic at 10^9 records per source runs on a DataRef double that opens
no files.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus import predicates
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import TransformError
from yogadl_plus.mixture import Mixture
from yogadl_plus.order.interleave import Interleave, shares

REPO_ROOT = Path(__file__).resolve().parents[1]

NAMES = ("a", "b", "c", "d")
SIZES = (1, 2, 3, 5, 8, 13)

Pair = tuple[int, int]
Pool = Callable[[int, int], ydl.DataRef]

# Hypothesis reads real (tiny) caches: a few dozen examples per property keep the module quick.
PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# --- datasets and helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path_factory.mktemp("mixture"))


@pytest.fixture(scope="module")
def pool(storage: ydl.LocalStorage) -> Pool:
    """``pool(j, n)``: the dataset of source number ``j`` with ``n`` records ``{"src": j, "i":
    i}``, built on first use and kept for the module."""
    made: dict[tuple[int, int], ydl.DataRef] = {}

    def of(j: int, n: int) -> ydl.DataRef:
        if (j, n) not in made:
            records = [{"src": np.int64(j), "i": np.int64(i)} for i in range(n)]
            made[(j, n)] = ydl.cache_dataset(records, f"s{j}", f"n{n}", storage, progress=False)
        return made[(j, n)]

    return of


@st.composite
def mixtures(draw: st.DrawFn, max_sources: int = 4) -> dict[str, Any]:
    """Sizes, weights (None: by size) and epoch size (None: the sum of the sizes) of a mixture."""
    k = draw(st.integers(1, max_sources))
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=k, max_size=k))
    weights: list[Any] | None = None
    if draw(st.booleans()):
        weights = draw(
            st.lists(
                st.one_of(
                    st.integers(0, 6),
                    st.sampled_from([0.5, 0.1, 2.75, Fraction(1, 3), Fraction(5, 7)]),
                ),
                min_size=k,
                max_size=k,
            )
        )
        if not any(weights):
            weights[draw(st.integers(0, k - 1))] = 1
    epoch_size = draw(st.one_of(st.none(), st.integers(1, 40)))
    return {"sizes": sizes, "weights": weights, "epoch_size": epoch_size}


def make(pool: Pool, spec: dict[str, Any]) -> Mixture:
    sources = {NAMES[j]: pool(j, n) for j, n in enumerate(spec["sizes"])}
    weights = spec["weights"]
    named = None if weights is None else dict(zip(NAMES, weights))
    return ydl.mix(sources, named, epoch_size=spec["epoch_size"])


def largest_remainder(weights: Sequence[Any], total: int) -> list[int]:
    """``total`` split by ``weights``: each quota rounded down, then one more to the largest
    fractional parts (earlier first among equal ones); computed here, not by the library."""
    exact = [Fraction(w) for w in weights]
    quotas = [w * total / sum(exact) for w in exact]
    parts = [q.numerator // q.denominator for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda j: (parts[j] - quotas[j], j))
    for j in by_remainder[: total - sum(parts)]:
        parts[j] += 1
    return parts


def expected_counts(spec: dict[str, Any]) -> list[int]:
    weights = spec["weights"] if spec["weights"] is not None else spec["sizes"]
    total = spec["epoch_size"] if spec["epoch_size"] is not None else sum(spec["sizes"])
    return largest_remainder(weights, total)


def pair(item: dict[str, Any]) -> Pair:
    return int(item["src"]), int(item["i"])


def epoch_pairs(stream: ydl.Stream) -> list[Pair]:
    """The stream's next epoch as (src, i) pairs, in order."""
    return [pair(item) for item in stream]


def take(stream: ydl.Stream, k: int) -> list[Pair]:
    """The stream's next ``k`` items, through as many epochs as it takes."""
    out: list[Pair] = []
    while len(out) < k:
        out += [pair(item) for item in itertools.islice(iter(stream), k - len(out))]
    return out


def batch_pairs(batches: Iterable[dict[str, Any]]) -> list[Pair]:
    out: list[Pair] = []
    for batch in batches:
        out += [(int(s), int(i)) for s, i in zip(np.asarray(batch["src"]), np.asarray(batch["i"]))]
    return out


# --- shares ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    weights=st.lists(st.fractions(min_value=0, max_value=50), min_size=1, max_size=8),
    total=st.integers(0, 10**12),
)
def test_shares_are_the_largest_remainder_rounding(weights: list[Fraction], total: int) -> None:
    if not any(weights):
        weights[0] = Fraction(1)
    parts = shares(weights, total)
    assert parts == largest_remainder(weights, total)
    # What largest remainder means: each part its quota rounded down or up, summing to total,
    # and every part rounded up had a remainder no smaller than any rounded down.
    quotas = [w * total / sum(weights) for w in weights]
    assert sum(parts) == total
    assert all(math.floor(q) <= p <= math.ceil(q) for p, q in zip(parts, quotas))
    up = [q - math.floor(q) for p, q in zip(parts, quotas) if p > q]
    down = [q - math.floor(q) for p, q in zip(parts, quotas) if p == math.floor(q)]
    assert not up or not down or min(up) >= max(down)


def test_shares_break_ties_to_the_earlier_source_and_are_exact_at_any_size() -> None:
    assert shares([Fraction(1)] * 3, 4) == [2, 1, 1]
    assert shares([Fraction(1)] * 3, 5) == [2, 2, 1]
    assert shares([Fraction(1), Fraction(0), Fraction(1)], 3) == [2, 0, 1]
    # Floats would round 10^18 / 3 wrongly; exact rationals do not.
    third = 10**18 // 3
    assert shares([Fraction(1)] * 3, 10**18) == [third + 1, third, third]
    assert shares([Fraction(1, 3), Fraction(2, 3)], 3 * 10**17 + 1) == [10**17, 2 * 10**17 + 1]


# --- the interleave -------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=7))
def test_interleave_deals_each_source_its_count_evenly(counts: list[int]) -> None:
    assume(sum(counts))
    total = sum(counts)
    source, rank = Interleave(counts).source_and_rank(np.arange(total))
    # A split in halves per level: each level is within one of the exact proportion.
    levels = max(1, math.ceil(math.log2(len(counts))))
    for j, count in enumerate(counts):
        mine = source == j
        assert rank[mine].tolist() == list(range(count)), "ranks 0.. in slot order"
        seen = np.cumsum(mine)
        exact = np.arange(1, total + 1) * count / total
        assert np.abs(seen - exact).max() < levels
    if len([c for c in counts if c]) == 2:
        # Two sources: every prefix holds its exact share rounded down or up.
        j = next(j for j, c in enumerate(counts) if c)
        seen = np.cumsum(source == j)
        exact = [Fraction(p * counts[j], total) for p in range(1, total + 1)]
        assert all(math.floor(e) <= s <= math.ceil(e) for s, e in zip(seen.tolist(), exact))


def test_interleave_refuses_bad_counts_and_slots() -> None:
    with pytest.raises(ValueError, match="not all zero"):
        Interleave([0, 0])
    with pytest.raises(ValueError, match="non-negative"):
        Interleave([3, -1])
    with pytest.raises(IndexError, match="slot 5 is out of range"):
        Interleave([2, 3]).source_and_rank([0, 5])
    with pytest.raises(IndexError, match="slot -1"):
        Interleave([2, 3]).source_and_rank([-1])


# --- properties over real caches ------------------------------------------------------------


@PROPERTY
@given(spec=mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_each_epoch_gives_each_source_exactly_its_share(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix = make(pool, spec)
    counts = expected_counts(spec)
    assert mix.counts == counts and len(mix) == sum(counts)
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    for _ in range(3):
        items = epoch_pairs(stream)
        per_source = Counter(src for src, _ in items)
        assert [per_source[j] for j in range(len(counts))] == counts
        assert all(0 <= i < spec["sizes"][src] for src, i in items)


@PROPERTY
@given(spec=mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_over_whole_epochs_the_records_of_a_source_are_seen_evenly(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix = make(pool, spec)
    counts = expected_counts(spec)
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    seen: Counter[Pair] = Counter()
    for epochs in range(1, 5):
        seen.update(epoch_pairs(stream))
        for j, n in enumerate(spec["sizes"]):
            per_record = [seen[(j, i)] for i in range(n)]
            assert sum(per_record) == epochs * counts[j]
            # A down-sampled source repeats nothing before all of it was seen, an up-sampled
            # one repeats evenly.
            assert max(per_record) - min(per_record) <= 1, (j, per_record)


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 3),
    data=st.data(),
)
def test_resume_from_any_offset_gives_the_rest_of_the_stream(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int, shards: int, data: st.DataObject
) -> None:
    mix = make(pool, spec)
    assume(len(mix) >= shards)  # a shard without positions cannot tell one epoch from the next
    rank = data.draw(st.integers(0, shards - 1))
    common = dict(shuffle=shuffle, shuffle_seed=seed, num_shards=shards, shard_rank=rank)
    whole = mix.stream(**common)
    reference = epoch_pairs(whole) + epoch_pairs(whole)  # epochs 0 and 1
    k = data.draw(st.integers(0, len(reference)))
    resumed = mix.stream(start_offset=k, **common)
    tail: list[Pair] = []
    while resumed.next_epoch_position[0] < 2:
        tail += epoch_pairs(resumed)
    assert tail == reference[k:]
    # The same through state() / load_state, into an equal mixture made afresh and a pickled one.
    stream = mix.stream(**common)
    assert take(stream, k) == reference[:k] and stream.offset == k
    state = stream.state()
    for again in (make(pool, spec), pickle.loads(pickle.dumps(mix))):
        loaded = again.stream(**common)
        loaded.load_state(json.loads(json.dumps(state.to_dict())))
        assert take(loaded, len(reference) - k) == reference[k:]


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 4),
    epoch=st.integers(0, 2),
    drop=st.booleans(),
)
def test_shards_are_disjoint_and_cover_each_epoch(
    pool: Pool,
    spec: dict[str, Any],
    shuffle: bool,
    seed: int,
    shards: int,
    epoch: int,
    drop: bool,
) -> None:
    mix = make(pool, spec)
    common = dict(shuffle=shuffle, shuffle_seed=seed)
    whole = epoch_pairs(mix.stream(start_offset=epoch * len(mix), **common))
    # drop_shard_remainder: the epoch's last len % S positions are left out.
    kept = len(mix) // shards * shards if drop else len(mix)
    slots = []
    for rank in range(shards):
        first = mix.stream(num_shards=shards, shard_rank=rank, drop_shard_remainder=drop, **common)
        length = first.plan().positions_per_epoch
        slots += first.plan().indices(epoch, 0, length).tolist()
        stream = mix.stream(
            num_shards=shards,
            shard_rank=rank,
            drop_shard_remainder=drop,
            start_offset=epoch * length,
            **common,
        )
        # Shard r hands out the positions r, r + S, r + 2S, ... of the epoch's order.
        assert epoch_pairs(stream) == whole[:kept][rank::shards]
    assert len(slots) == kept and len(set(slots)) == kept
    assert set(slots) <= set(range(len(mix)))
    if not drop:
        assert sorted(slots) == list(range(len(mix)))


@PROPERTY
@given(
    spec=mixtures(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64),
    shards=st.integers(1, 4),
    new_shards=st.integers(1, 4),
    epoch=st.integers(0, 1),
    data=st.data(),
)
def test_rescaling_from_s_to_s_prime_ranks_loses_and_repeats_nothing(
    pool: Pool,
    spec: dict[str, Any],
    shuffle: bool,
    seed: int,
    shards: int,
    new_shards: int,
    epoch: int,
    data: st.DataObject,
) -> None:
    mix = make(pool, spec)
    n = len(mix)
    assume(n >= shards)
    common = dict(shuffle=shuffle, shuffle_seed=seed)
    lengths = [
        mix.stream(num_shards=shards, shard_rank=r, **common).plan().positions_per_epoch
        for r in range(shards)
    ]
    k = data.draw(st.integers(0, min(lengths)))  # the global step every rank reached
    consumed: list[Pair] = []
    slots: list[int] = []
    offsets = set()
    for rank in range(shards):
        stream = mix.stream(
            num_shards=shards, shard_rank=rank, start_offset=epoch * lengths[rank], **common
        )
        consumed += [pair(item) for item in itertools.islice(iter(stream), k)]
        slots += stream.plan().indices(epoch, 0, k).tolist()
        offsets.add(stream.global_offset)
    assert len(offsets) == 1, "every rank at the same step reports the same global offset"
    (checkpoint,) = offsets
    assert epoch * n + shards * k <= checkpoint <= (epoch + 1) * n
    after = [
        mix.stream(num_shards=new_shards, shard_rank=r, global_start=checkpoint, **common)
        for r in range(new_shards)
    ]
    whole = [epoch_pairs(mix.stream(start_offset=e * n, **common)) for e in (epoch, epoch + 1)]
    if checkpoint < (epoch + 1) * n:
        for stream in after:
            slots += stream.plan().indices(epoch, 0, stream.plan().epoch_length(epoch)).tolist()
        rest = [p for stream in after for p in epoch_pairs(stream)]
    else:
        rest = []  # the epoch was finished: the new ranks start the next one whole
    assert sorted(slots) == list(range(n)), "each slot of the epoch read exactly once"
    assert Counter(consumed + rest) == Counter(whole[0])
    # And the next epoch, whole on the new ranks.
    following = [p for stream in after for p in epoch_pairs(stream)]
    assert Counter(following) == Counter(whole[1])


# --- the order of an epoch ------------------------------------------------------------------


def test_shuffle_interleaves_the_sources_through_the_epoch(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 13), "b": pool(1, 8)}, {"a": 1, "b": 1}, epoch_size=400)
    plain = [src for src, _ in epoch_pairs(mix.stream())]
    assert plain == [1, 0] * 200, "unshuffled: the proportional interleave"
    stream = mix.stream(shuffle=True, shuffle_seed=11)
    epochs = [epoch_pairs(stream) for _ in range(2)]
    for items in epochs:
        sources = [src for src, _ in items]
        assert sources != plain
        # Each quarter holds about its share of each source: not one source, then the other.
        for quarter in range(4):
            part = sources[quarter * 100 : (quarter + 1) * 100]
            assert 25 <= part.count(0) <= 75, part
        assert max(len(list(run)) for _, run in itertools.groupby(sources)) < 15
    assert epochs[0] != epochs[1], "each epoch its own order"
    again = mix.stream(shuffle=True, shuffle_seed=11)
    assert [epoch_pairs(again) for _ in range(2)] == epochs, "same seed, same order"
    assert epoch_pairs(mix.stream(shuffle=True, shuffle_seed=12)) != epochs[0]


def test_each_source_shuffles_by_its_own_key(pool: Pool) -> None:
    # Two sources of the same size: keyed by the seed alone, both would walk one order.
    one = ydl.mix({"a": pool(0, 13), "b": pool(1, 13)}, epoch_size=26 * 3)
    stream = one.stream(shuffle=True, shuffle_seed=5)
    items = [p for _ in range(2) for p in epoch_pairs(stream)]
    walks = [[i for src, i in items if src == j] for j in (0, 1)]
    assert sorted(walks[0]) == sorted(walks[1]) == sorted(list(range(13)) * 6)
    assert walks[0] != walks[1]
    # The key is the source's name: renamed, a source walks another order.
    other = ydl.mix({"x": pool(0, 13), "b": pool(1, 13)}, epoch_size=26 * 3)
    renamed = epoch_pairs(other.stream(shuffle=True, shuffle_seed=5))
    assert [i for s, i in renamed if s == 0] != walks[0][:39]
    assert [i for s, i in renamed if s == 1] == walks[1][:39]


def test_same_seed_same_order_in_another_process(pool: Pool, tmp_path: Path) -> None:
    mix = ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 3)},
        {"a": 2, "b": 1, "c": Fraction(1, 2)},
        epoch_size=37,
    )
    outer = ydl.mix({"inner": mix, "d": pool(3, 8)}, {"inner": 3, "d": 1}, epoch_size=29)
    (tmp_path / "mix.pickle").write_bytes(pickle.dumps(outer))
    code = (
        "import json, pickle, sys\n"
        "mix = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "out = []\n"
        "for seed in (0, 2**64 - 1):\n"
        "    stream = mix.stream(shuffle=True, shuffle_seed=seed, num_shards=2, shard_rank=1)\n"
        "    out.append([[int(r['src']), int(r['i'])] for e in range(3) for r in stream])\n"
        "json.dump(out, sys.stdout)\n"
    )
    here = []
    for seed in (0, 2**64 - 1):
        stream = outer.stream(shuffle=True, shuffle_seed=seed, num_shards=2, shard_rank=1)
        here.append([list(p) for _ in range(3) for p in epoch_pairs(stream)])
    # Another hash salt: the order must not depend on Python's per-process hash().
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "mix.pickle")], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(result.stdout) == here


# --- positions of epoch 0: mix[i], get_batch ------------------------------------------------


@PROPERTY
@given(spec=mixtures(), data=st.data())
def test_getitem_and_get_batch_read_the_unshuffled_epoch_0(
    pool: Pool, spec: dict[str, Any], data: st.DataObject
) -> None:
    mix = make(pool, spec)
    n = len(mix)
    epoch0 = epoch_pairs(mix.stream(shuffle=False))
    assert [pair(mix[i]) for i in range(n)] == epoch0
    assert [pair(mix[i]) for i in range(-n, 0)] == epoch0
    assert pair(mix[np.int64(n - 1)]) == epoch0[-1]
    indices = data.draw(st.lists(st.integers(-n, n - 1), max_size=25))
    assert batch_pairs([mix.get_batch(indices)]) == [epoch0[i] for i in indices]
    only = mix.get_batch(np.array(indices, dtype=np.int32), fields=["i"])
    assert list(only) == ["i"]
    assert [int(i) for i in only["i"]] == [epoch0[i][1] for i in indices]


def test_getitem_and_get_batch_refuse_bad_positions(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    assert len(mix) == 8
    for bad in (8, -9, 10**12):
        with pytest.raises(IndexError, match=f"position {bad} is out of range"):
            mix[bad]
        with pytest.raises(IndexError, match=f"position {bad} is out of range"):
            mix.get_batch([0, bad])
    for bad in (1.0, "1", None):
        with pytest.raises(TypeError, match="Mixture indices are ints"):
            mix[bad]  # type: ignore[index]
    for indices in ([1.5], [[0, 1]], ["a"], np.zeros((2, 2), np.int64)):
        with pytest.raises(TypeError, match="1-d sequence of ints"):
            mix.get_batch(indices)  # type: ignore[arg-type]


def test_get_batch_of_no_positions_is_typed_like_a_datarefs(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    empty = mix.get_batch([])
    plain = pool(0, 3).get_batch([])
    assert list(empty) == list(plain) == ["src", "i"]
    for name in plain:
        assert isinstance(empty[name], np.ndarray) and empty[name].dtype == plain[name].dtype
        assert empty[name].shape == (0,)


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "weights, error, message",
    [
        ({"a": 1}, ValueError, "weights has no weight for source 'b'"),
        ({"a": 1, "b": 1, "zz": 1}, ValueError, "weights names 'zz', which is not a source"),
        ({"a": -1, "b": 1}, ValueError, "weight of source 'a' must be a finite number >= 0"),
        ({"a": 1, "b": float("nan")}, ValueError, "weight of source 'b' must be a finite"),
        ({"a": float("inf"), "b": 1}, ValueError, "weight of source 'a' must be a finite"),
        ({"a": 1, "b": -math.inf}, ValueError, "weight of source 'b' must be a finite"),
        ({"a": True, "b": 1}, ValueError, "weight of source 'a' must be a number, got True"),
        ({"a": 1, "b": np.True_}, ValueError, "weight of source 'b' must be a number"),
        ({"a": "1", "b": 1}, ValueError, "weight of source 'a' must be a number, got '1'"),
        ({"a": None, "b": 1}, ValueError, "weight of source 'a' must be a number, got None"),
        ({"a": 0, "b": 0.0}, ValueError, "positive sum; they are all zero"),
        ([1, 1], TypeError, "weights must be a mapping"),
    ],
)
def test_bad_weights_are_refused_naming_the_source(
    pool: Pool, weights: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ydl.mix({"a": pool(0, 3), "b": pool(1, 5)}, weights)


@pytest.mark.parametrize("epoch_size", [0, -3, 2.5, 4.0, "3", True, np.float64(3)])
def test_bad_epoch_sizes_are_refused(pool: Pool, epoch_size: Any) -> None:
    with pytest.raises(ValueError, match="epoch_size must be"):
        ydl.mix({"a": pool(0, 3)}, epoch_size=epoch_size)


def test_numpy_and_rational_weights_are_exact_numbers(pool: Pool) -> None:
    sources = {"a": pool(0, 3), "b": pool(1, 5)}
    expected = largest_remainder([3, 1], 10)
    for w in (np.int8(3), np.uint64(3), np.float32(3.0), np.float16(3.0), Fraction(3), 3.0):
        mix = ydl.mix(sources, {"a": w, "b": 1}, epoch_size=10)
        assert mix.counts == expected
        assert all(type(c) is int for c in mix.counts), mix.counts
    # Weights as big as int8's range must not wrap around.
    mix = ydl.mix(sources, {"a": np.int8(100), "b": np.int8(27)}, epoch_size=127)
    assert mix.counts == [100, 27]
    mix = ydl.mix(sources, {"a": np.uint8(200), "b": np.uint8(55)}, epoch_size=1000)
    assert mix.counts == largest_remainder([200, 55], 1000)
    # Past float's range: exact all the same.
    mix = ydl.mix(sources, {"a": 10**400, "b": 3 * 10**399}, epoch_size=13)
    assert mix.counts == [10, 3]
    with pytest.raises(ValueError, match="weight of source 'b' must be a finite number >= 0"):
        ydl.mix(sources, {"a": 1, "b": -(10**400)})


def test_bad_sources_are_refused(pool: Pool, storage: ydl.LocalStorage) -> None:
    a = pool(0, 3)
    with pytest.raises(ValueError, match="at least one source"):
        ydl.mix({})
    with pytest.raises(TypeError, match="sources must be a mapping"):
        ydl.mix([a])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="source 'b' must be a DataRef or a Mixture, got list"):
        ydl.mix({"a": a, "b": [{"src": 0, "i": 1}]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="source 'b' must be a DataRef or a Mixture, got Stream"):
        ydl.mix({"a": a, "b": a.stream()})  # type: ignore[dict-item]
    for name in ("", "x/y", 3, None):
        with pytest.raises(ValueError, match="source names must be non-empty strs"):
            ydl.mix({"a": a, name: pool(1, 5)})  # type: ignore[dict-item]


def test_a_source_without_records_takes_no_positive_weight(
    pool: Pool, storage: ydl.LocalStorage
) -> None:
    schema = ydl.Schema([ydl.Field("src", np.int64), ydl.Field("i", np.int64)])
    empty = ydl.cache_dataset([], "empty", "v", storage, schema=schema, progress=False)
    a = pool(0, 3)
    with pytest.raises(ValueError, match="source 'e' has no records"):
        ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 1}, epoch_size=10)
    # Even where its share of a short epoch rounds to nothing.
    with pytest.raises(ValueError, match="source 'e' has no records"):
        ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 1}, epoch_size=1)
    with pytest.raises(ValueError, match="no records"):
        ydl.mix({"e": empty})
    # Weight 0, or weights by size: it takes no part.
    for mix in (ydl.mix({"a": a, "e": empty}, {"a": 1, "e": 0}), ydl.mix({"a": a, "e": empty})):
        assert mix.counts == [3, 0]
        assert sorted(epoch_pairs(mix.stream(shuffle=True, shuffle_seed=1))) == [
            (0, 0),
            (0, 1),
            (0, 2),
        ]


@pytest.fixture(scope="module")
def varied(storage: ydl.LocalStorage) -> dict[str, ydl.DataRef]:
    """Datasets whose field ``x`` differs: in shape, in dtype, or missing."""

    def build(name: str, src: int, x: Callable[[int], Any] | None) -> ydl.DataRef:
        records = [
            {"src": np.int64(src), "i": np.int64(i), **({"x": x(i)} if x is not None else {})}
            for i in range(6)
        ]
        return ydl.cache_dataset(records, name, "v", storage, progress=False)

    return {
        "x4": build("x4", 0, lambda i: np.full(4, i, np.float32)),
        "x4b": build("x4b", 1, lambda i: np.full(4, -i, np.float32)),
        "x3": build("x3", 2, lambda i: np.full(3, i, np.float32)),
        "xint": build("xint", 3, lambda i: np.full(4, i, np.int32)),
        "nox": build("nox", 4, None),
    }


@pytest.mark.parametrize("other", ["x3", "xint", "nox"])
def test_batching_sources_whose_fields_differ_is_a_schema_error(
    varied: dict[str, ydl.DataRef], other: str
) -> None:
    mix = ydl.mix({"four": varied["x4"], "other": varied[other]})
    for fields in (None, ["i", "x"]):
        with pytest.raises(ydl.SchemaError, match="field 'x'") as caught:
            mix.stream(batch_size=4, fields=fields)
        assert "'other'" in str(caught.value)
        if fields is None or other != "nox":
            # (Asked for by name, a field one source lacks is that source's error.)
            assert "'four'" in str(caught.value)
        with pytest.raises(ydl.SchemaError, match="field 'x'"):
            mix.get_batch([0], fields=fields)  # one source's position: still refused
        with pytest.raises(ydl.SchemaError, match="field 'x'"):
            mix.get_batch([len(mix) - 1], fields=fields)
    # The shared fields batch.
    batches = list(mix.stream(batch_size=4, fields=["src", "i"], shuffle=True, shuffle_seed=3))
    assert sorted(batch_pairs(batches)) == sorted(epoch_pairs(mix.stream()))
    assert batch_pairs([mix.get_batch(range(len(mix)), ["src", "i"])]) == epoch_pairs(mix.stream())


def test_batches_of_sources_alike_merge_their_arrays(varied: dict[str, ydl.DataRef]) -> None:
    mix = ydl.mix({"p": varied["x4"], "q": varied["x4b"]}, {"p": 1, "q": 2}, epoch_size=9)
    batches = list(mix.stream(batch_size=4, shuffle=True, shuffle_seed=5))
    assert [len(b["i"]) for b in batches] == [4, 4, 1]
    for batch in batches:
        assert batch["x"].dtype == np.float32 and batch["x"].shape[1:] == (4,)
        for src, i, x in zip(batch["src"], batch["i"], batch["x"]):
            assert x.tolist() == [float(i if src == 0 else -i)] * 4


def test_record_mode_keeps_each_sources_own_fields(varied: dict[str, ydl.DataRef]) -> None:
    mix = ydl.mix({"four": varied["x4"], "three": varied["x3"], "none": varied["nox"]})
    items = list(mix.stream(shuffle=True, shuffle_seed=2))
    assert len(items) == 18
    for item in items:
        if item["src"] == 4:
            assert set(item) == {"src", "i"}
        else:
            assert set(item) == {"src", "i", "x"}
            assert item["x"].shape == ((4,) if item["src"] == 0 else (3,))
            assert item["x"].tolist() == [float(item["i"])] * len(item["x"])
    with pytest.raises(TransformError, match="source 'three'"):
        list(mix.stream(transform=lambda r: r["x"][3]))
    assert all(set(item) == {"i"} for item in mix.stream(fields=["i"]))
    # Naming a field a source lacks is an error naming that source.
    lacking = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    with pytest.raises(ydl.SchemaError, match=r"source 'none'.*'x'"):
        lacking.stream(fields=["i", "x"])


def test_options_a_mixture_cannot_take_say_why(pool: Pool) -> None:
    mix = ydl.mix({"a": pool(0, 3), "b": pool(1, 5)})
    gram = ydl.NGram({0: ["i"], 1: ["i"]}, delta_threshold=1, timestamp_field="i")
    with pytest.raises(ValueError, match="ngram= windows run within one dataset"):
        mix.stream(ngram=gram)
    with pytest.raises(ValueError, match=r"shard_by='chunks'.*use shard_by='records'"):
        mix.stream(shard_by="chunks", num_shards=2, shuffle_seed=1)
    with pytest.raises(ValueError, match=r"shuffle_window=.*a mixture's epoch is shuffled whole"):
        mix.stream(shuffle=True, shuffle_seed=1, shuffle_window=2)


def test_a_predicate_on_a_field_a_source_lacks_names_the_source(
    varied: dict[str, ydl.DataRef],
) -> None:
    mix = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    with pytest.raises(ydl.SchemaError, match=r"source 'none'.*'x'"):
        mix.stream(predicate=predicates.in_lambda("x", lambda x: x[0] > 0))


# --- mixtures of mixtures, remote sources ---------------------------------------------------


@st.composite
def nested_mixtures(draw: st.DrawFn) -> dict[str, Any]:
    inner = draw(mixtures(max_sources=2))
    outer = {
        "size": draw(st.sampled_from(SIZES)),
        "weights": draw(st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 4)))),
        "epoch_size": draw(st.one_of(st.none(), st.integers(1, 40))),
    }
    return {"inner": inner, "outer": outer}


def make_nested(pool: Pool, spec: dict[str, Any]) -> tuple[Mixture, list[int], list[int]]:
    """The mixture {"in": mixture of sources 0.., "z": source 3}, the outer shares and the
    inner ones."""
    inner = make(pool, spec["inner"])
    o = spec["outer"]
    weights = None if o["weights"] is None else dict(zip(("in", "z"), o["weights"]))
    mix = ydl.mix({"in": inner, "z": pool(3, o["size"])}, weights, epoch_size=o["epoch_size"])
    outer_counts = largest_remainder(
        o["weights"] or (len(inner), o["size"]),
        o["epoch_size"] if o["epoch_size"] is not None else len(inner) + o["size"],
    )
    return mix, outer_counts, expected_counts(spec["inner"])


@PROPERTY
@given(spec=nested_mixtures(), shuffle=st.booleans(), seed=st.integers(0, 2**64))
def test_a_mixture_of_mixtures_keeps_shares_and_balance_at_each_level(
    pool: Pool, spec: dict[str, Any], shuffle: bool, seed: int
) -> None:
    mix, outer_counts, inner_counts = make_nested(pool, spec)
    inner_len = sum(inner_counts)
    sizes = [*spec["inner"]["sizes"], spec["outer"]["size"]]
    assert [leaf.name for leaf in mix.leaves] == [
        *(f"in/{NAMES[j]}" for j in range(len(inner_counts))),
        "z",
    ]
    stream = mix.stream(shuffle=shuffle, shuffle_seed=seed)
    seen: Counter[Pair] = Counter()
    for epochs in range(1, 5):
        items = epoch_pairs(stream)
        seen.update(items)
        # The outer level: each epoch, the inner mixture and "z" get exactly their shares.
        assert sum(src == 3 for src, _ in items) == outer_counts[1]
        # The inner level: the inner mixture's part of e epochs is its first e * c positions,
        # of which each inner source gets exactly its shares for whole inner epochs.
        whole, part = divmod(epochs * outer_counts[0], inner_len)
        if part == 0:
            for j, count in enumerate(inner_counts):
                assert sum(seen[(j, i)] for i in range(sizes[j])) == whole * count
        # The records of every leaf: seen evenly.
        for j, n in enumerate(sizes):
            per_record = [seen[(j, i)] for i in range(n)]
            assert max(per_record) - min(per_record) <= 1, (j, per_record)


def test_a_mixture_of_mixtures_streams_resumes_and_shards(pool: Pool) -> None:
    text = ydl.mix({"a": pool(0, 13), "b": pool(1, 5)}, {"a": 3, "b": 1}, epoch_size=12)
    mix = ydl.mix({"text": text, "code": pool(2, 8)}, {"text": 2, "code": 1}, epoch_size=30)
    assert mix.counts == [20, 10] and text.counts == [9, 3]
    assert repr(mix) == "Mixture(text=20, code=10; epoch_size=30)"
    common = dict(shuffle=True, shuffle_seed=9)
    stream = mix.stream(**common)
    epochs = [epoch_pairs(stream) for _ in range(6)]  # 120 inner positions: 10 inner epochs
    seen = Counter(p for items in epochs for p in items)
    assert sum(seen[(0, i)] for i in range(13)) == 10 * 9
    assert sum(seen[(1, i)] for i in range(5)) == 10 * 3
    flat = [p for items in epochs for p in items]
    for k in (0, 7, 30, 95):
        assert take(mix.stream(start_offset=k, **common), 180 - k) == flat[k:]
    halves = [epoch_pairs(mix.stream(num_shards=2, shard_rank=r, **common)) for r in (0, 1)]
    assert Counter(halves[0] + halves[1]) == Counter(epochs[0])


def test_a_mixture_of_a_remote_dataref_and_a_local_one(
    pool: Pool, s3_server: Any, s3_bucket: str, tmp_path: Path
) -> None:
    builder = s3_server.storage(s3_bucket, "mix", tmp_path / "builder")
    records = [{"src": np.int64(7), "i": np.int64(i), "pad": b"x" * 300} for i in range(200)]
    built = ydl.cache_dataset(records, "remote", "v", builder, chunk_bytes=4000, progress=False)
    assert len(built.manifest.chunks) >= 8
    local = pool(0, 13)
    machine = s3_server.storage(s3_bucket, "mix", tmp_path / "machine")
    # Pulled whole, and read on demand (chunks fetched as reads, and read-ahead, need them).
    for remote in (machine.fetch("remote", "v"), machine.fetch("remote", "v", on_demand=True)):
        mix = ydl.mix({"remote": remote, "local": local}, {"remote": 1, "local": 1}, epoch_size=60)
        assert mix.counts == [30, 30]
        stream = mix.stream(shuffle=True, shuffle_seed=2, fields=["src", "i"])
        epochs = [epoch_pairs(stream) for _ in range(3)]
        remote_seen = [i for items in epochs for src, i in items if src == 7]
        assert len(remote_seen) == len(set(remote_seen)) == 90, "down-sampled: no repeats"
        local_seen = Counter(i for items in epochs for src, i in items if src == 0)
        assert sorted(local_seen) == list(range(13)) and set(local_seen.values()) == {6, 7}
        batches = mix.stream(
            shuffle=True, shuffle_seed=2, batch_size=8, num_workers=2, fields=["src", "i"]
        )
        assert [batch_pairs(batches) for _ in range(3)] == epochs
        assert pair(mix[0]) in ((7, 0), (0, 0))


# --- O(sources) at 10^9 records per source --------------------------------------------------


class HugeRef(DataRef):
    """A DataRef of ``n`` records that opens no files: enough of one for a Mixture and a
    Stream's order (len, select, manifest), not for reading records."""

    def __init__(self, name: str, n: int) -> None:
        schema = ydl.Schema([ydl.Field("i", np.int64)])
        chunk = SimpleNamespace(records=n, bytes=8 * n, sha256=name * 64, file="none")
        self.manifest = SimpleNamespace(  # type: ignore[assignment]
            dataset_id=name, version="v", schema=schema, chunks=[chunk], num_records=n
        )
        self._len = n
        self._fingerprint = None

    def read_ahead(self, indices: np.ndarray) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_mixture_of_billions_costs_memory_of_its_sources_only() -> None:
    tracemalloc.start()
    try:
        refs = {name: HugeRef(name, 10**9) for name in "abc"}
        mix = ydl.mix(refs, {"a": 1, "b": 1, "c": 3}, epoch_size=5 * 10**9)
        stream = mix.stream(shuffle=True, shuffle_seed=3, start_offset=7 * len(mix) - 10)
        epoch, position = stream.next_epoch_position
        slots = stream.plan().indices(epoch, position - 2000, position + 10)
        located = mix.place(epoch, slots, True, stream.shuffle_seed)
        state = stream.state()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3_000_000, peak
    assert mix.counts == [10**9, 10**9, 3 * 10**9]
    assert (epoch, position) == (6, 5 * 10**9 - 10) and len(slots) == 2010
    assert len(set(slots.tolist())) == 2010 and slots.min() >= 0 and slots.max() < len(mix)
    assert sum(len(r) for _, _, r in located.parts) == 2010
    for _, _, r in located.parts:
        assert r.min() >= 0 and r.max() < 10**9 and len(set(r.tolist())) == len(r)
    assert state.positions == 5 * 10**9 and state.offset == 7 * len(mix) - 10


def test_the_interleave_is_exact_at_billions() -> None:
    counts = [10**9, 10**9, 3 * 10**9]
    interleave = Interleave(counts)
    # Source a gets every 5th slot (4, 9, ...); of the other slots, b every 4th, c the rest:
    # in 20 slots, 4 of a, 4 of b and 12 of c, each source's ranks running on.
    end = sum(counts)
    for first in (0, 20 * 123_456_789, end - 20_000):
        slots = np.arange(first, first + 20_000)
        source, rank = interleave.source_and_rank(slots)
        assert np.bincount(source, minlength=3).tolist() == [4000, 4000, 12000]
        a = slots[source == 0]
        assert (a % 5 == 4).all() and (rank[source == 0] == a // 5).all()
        for j, count in enumerate(counts):
            ranks = rank[source == j]
            assert (np.diff(ranks) == 1).all()
            assert ranks[0] == first * count // end
    source, rank = interleave.source_and_rank([end - 1])
    assert (int(source[0]), int(rank[0])) == (0, 10**9 - 1), "the last slot, a's last rank"
    # Past int64 products (3e9 * 8e9): each slot's side is floor((s + 1) * a / T) > floor(s *
    # a / T), in exact integers, up to the last slot.
    a, b = 3 * 10**9 + 1, 5 * 10**9 + 7
    total = a + b
    slots = np.concatenate([np.arange(5000), np.arange(total // 3, total // 3 + 5000)])
    # ... and where slot * a / T falls just short of an integer (slot * a = -1 mod T), which
    # floating point would round up.
    short = -pow(a, -1, total) % total
    slots = np.concatenate([slots, np.arange(short - 2, short + 3), np.arange(total - 5000, total)])
    source, rank = Interleave([a, b]).source_and_rank(slots)
    for slot, j, r in zip(slots.tolist(), source.tolist(), rank.tolist()):
        left = (slot + 1) * a // total > slot * a // total
        assert (j, r) == ((0, slot * a // total) if left else (1, slot - slot * a // total))
    assert rank[source == 0][-1] == a - 1 and rank[source == 1][-1] == b - 1
    # Two equal sources alternate exactly.
    two = Interleave([4 * 10**9, 4 * 10**9])
    slots = np.array([0, 1, 2, 8 * 10**9 - 2, 8 * 10**9 - 1])
    source, rank = two.source_and_rank(slots)
    assert source.tolist() == [1, 0, 1, 1, 0]
    assert rank.tolist() == [0, 0, 1, 4 * 10**9 - 1, 4 * 10**9 - 1]


def test_sources_of_billions_walk_their_own_epochs() -> None:
    mix = ydl.mix({"a": HugeRef("a", 10**9), "b": HugeRef("b", 10)}, {"a": 1, "b": 10**8 - 1})
    assert mix.counts == [10, 10**9] and len(mix) == 10**9 + 10
    # Source b (10 records) is up-sampled to 10^9 items per epoch: its slots read its records
    # evenly, in any epoch.
    (b,) = [r for leaf, _, r in mix.place(3, np.arange(1000), True, 5).parts if leaf == 1]
    assert np.bincount(b, minlength=10).tolist() == [100] * 10
    # Source a (10^9 records) is down-sampled to 10 a mixture epoch: its r-th slot is the one
    # where floor(slot * 10 / len) steps up. It is read without replacement for 10^8 mixture
    # epochs, all from its own epoch 0.
    total = len(mix)
    a_slots = np.array([-(-(r + 1) * total // 10) - 1 for r in range(10)])
    source, rank = Interleave(mix.counts).source_and_rank(a_slots)
    assert source.tolist() == [0] * 10 and rank.tolist() == list(range(10))
    seen: list[int] = []
    for epoch in (0, 1, 2, 10**8 - 1):
        ((leaf, where, records),) = mix.place(epoch, a_slots, True, 5).parts
        assert leaf == 0 and sorted(where.tolist()) == list(range(10))
        seen += records.tolist()
    assert len(set(seen)) == 40, "no record of a repeats within its own epoch"


# --- through the boundary -------------------------------------------------------------------


def _twice(item: dict[str, Any]) -> dict[str, Any]:
    return {"src": item["src"], "i": item["i"], "twice": int(item["i"]) * 2}


def _fails_on_b2(item: dict[str, Any]) -> dict[str, Any]:
    if item["src"] == 1 and item["i"] == 2:
        raise RuntimeError("no b2")
    return item


@pytest.fixture(scope="module")
def three(pool: Pool) -> Mixture:
    return ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)},
        {"a": 3, "b": 2, "c": 1},
        epoch_size=70,
    )


def test_predicates_filter_each_sources_items(three: Mixture) -> None:
    common = dict(shuffle=True, shuffle_seed=4)
    everything = epoch_pairs(three.stream(**common))
    odd_or_c = predicates.in_lambda(["src", "i"], lambda s, i: s == 2 or i % 2 == 1)
    kept = epoch_pairs(three.stream(predicate=odd_or_c, **common))
    assert kept == [(s, i) for s, i in everything if s == 2 or i % 2 == 1]
    only_b = predicates.in_set("src", [1])
    batches = list(three.stream(predicate=only_b, batch_size=4, **common))
    assert batch_pairs(batches) == [p for p in everything if p[0] == 1]
    # A stream with a predicate resumes where it left off, offsets counting positions.
    stream = three.stream(predicate=odd_or_c, **common)
    first = [pair(item) for item in itertools.islice(iter(stream), 9)]
    rest = epoch_pairs(three.stream(predicate=odd_or_c, start_offset=stream.offset, **common))
    assert first + rest == kept


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_give_what_reading_inline_gives(three: Mixture, worker_type: str) -> None:
    common = dict(shuffle=True, shuffle_seed=6, num_shards=2, shard_rank=1, start_offset=20)
    for extra in (
        {},
        {"batch_size": 4},
        {"batch_size": 5, "transform": _twice},
        {"transform": _twice},
    ):
        inline = three.stream(**common, **extra)
        workers = three.stream(num_workers=2, worker_type=worker_type, **common, **extra)
        try:
            for _ in range(2):
                want, got = list(inline), list(workers)
                assert len(got) == len(want) > 0
                for w, g in zip(want, got):
                    assert w.keys() == g.keys()
                    for name in w:
                        np.testing.assert_array_equal(np.asarray(g[name]), np.asarray(w[name]))
            assert workers.offset == inline.offset
        finally:
            workers.close()


def test_batches_with_a_transform_collate_items_of_every_source(three: Mixture) -> None:
    batches = list(three.stream(batch_size=8, transform=_twice, shuffle=True, shuffle_seed=1))
    assert sum(len(b["i"]) for b in batches) == 70
    for batch in batches:
        assert (np.asarray(batch["twice"]) == 2 * np.asarray(batch["i"])).all()
    assert batch_pairs(batches) == epoch_pairs(three.stream(shuffle=True, shuffle_seed=1))


@pytest.mark.parametrize("workers, worker_type", [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_transform_error_names_the_source(three: Mixture, workers: int, worker_type: str) -> None:
    stream = three.stream(transform=_fails_on_b2, num_workers=workers, worker_type=worker_type)
    try:
        with pytest.raises(TransformError, match=r"source 'b'.*record 2.*no b2"):
            list(stream)
    finally:
        stream.close()


def test_read_ahead_announces_the_records_each_epoch_reads(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both sources down-sampled: each epoch reads other records of theirs.
    mix = ydl.mix({"a": pool(0, 13), "b": pool(1, 8)}, {"a": 1, "b": 1}, epoch_size=6)
    announced: dict[int, set[int]] = {}
    for j, leaf in enumerate(mix.leaves):

        def note(indices: np.ndarray, j: int = j) -> None:
            announced.setdefault(j, set()).update(np.asarray(indices).tolist())

        monkeypatch.setattr(leaf.ref, "read_ahead", note)
    stream = mix.stream(shuffle=True, shuffle_seed=3)
    for _ in range(3):
        announced.clear()
        read: dict[int, set[int]] = {}
        for src, i in epoch_pairs(stream):
            read.setdefault(src, set()).add(i)
        assert announced == read


def test_stream_state_loads_only_into_the_same_mixture(pool: Pool, three: Mixture) -> None:
    common = dict(shuffle=True, shuffle_seed=8)
    stream = three.stream(**common)
    head = take(stream, 33)
    state = stream.state().to_dict()
    assert json.loads(json.dumps(state)) == state
    same = ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)},
        {"a": 6, "b": 4, "c": 2},  # other weights, the same shares
        epoch_size=70,
    )
    resumed = same.stream(**common)
    resumed.load_state(state)
    assert head + take(resumed, 70) == take(three.stream(**common), 103)
    sources = {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)}
    # What differs is named: the shares (in the dataset's description), or the epoch's size.
    others = [
        (ydl.mix(sources, {"a": 1, "b": 2, "c": 3}, epoch_size=70), r"dataset: .*a=s0:n13\*35"),
        (ydl.mix(sources, {"a": 3, "b": 2, "c": 1}, epoch_size=71), "positions: saved 70"),
        (
            ydl.mix({**sources, "c": pool(2, 13)}, {"a": 3, "b": 2, "c": 1}, epoch_size=70),
            "c=s2:n8",
        ),
        (
            ydl.mix(
                {"a": sources["a"], "b": sources["b"], "z": sources["c"]},
                {"a": 3, "b": 2, "z": 1},
                epoch_size=70,
            ),
            "z=s2:n8",
        ),
    ]
    for other, named in others:
        with pytest.raises(ValueError, match="saved from a different stream") as caught:
            other.stream(**common).load_state(state)
        assert re.search(named, str(caught.value)), str(caught.value)
    with pytest.raises(ValueError, match=r"saved from a different stream.*dataset"):
        pool(0, 13).stream(**common).load_state(state)
    with pytest.raises(ValueError, match="seed: saved 8, this stream 9"):
        three.stream(shuffle=True, shuffle_seed=9).load_state(state)
    # And the other way: a DataRef's state does not load into a mixture.
    plain = pool(0, 13).stream(**common)
    with pytest.raises(ValueError, match="saved from a different stream"):
        three.stream(**common).load_state(plain.state())


def test_torch_dataloader_over_a_mixture_resumes_exactly(three: Mixture) -> None:
    torch = pytest.importorskip("torch")

    def make() -> Any:
        stream = three.stream(
            shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1, batch_size=4, transform=_twice
        )
        return ydl.torch.make_dataloader(stream, num_workers=2)

    def ids(batches: Iterable[dict[str, Any]]) -> list[Pair]:
        return [
            (int(s), int(i))
            for b in batches
            for s, i in zip(torch.as_tensor(b["src"]).tolist(), torch.as_tensor(b["i"]).tolist())
        ]

    reference_loader = make()
    reference = [ids([b]) for _ in range(2) for b in reference_loader]
    inline = three.stream(
        shuffle=True, shuffle_seed=5, num_shards=2, shard_rank=1, batch_size=4, transform=_twice
    )
    assert reference == [batch_pairs([b]) for _ in range(2) for b in inline]
    for k in (0, 3, 7):
        loader = make()
        it = iter(loader)
        consumed = [ids([next(it)]) for _ in range(k)]
        state = loader.state_dict()
        del it
        again = make()
        again.load_state_dict(state)
        rest = [ids([b]) for b in again]
        assert consumed + rest == reference[: len(loader)]


def test_torch_refuses_index_based_faces_of_a_mixture(three: Mixture) -> None:
    pytest.importorskip("torch")
    with pytest.raises(TypeError, match="make_dataloader"):
        ydl.torch.RecordDataset(three)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="make_dataloader"):
        ydl.torch.StreamSampler(three, shuffle=True, shuffle_seed=1)  # type: ignore[arg-type]


def test_tf_dataset_over_a_mixture_gives_the_streams_items(three: Mixture) -> None:
    pytest.importorskip("tensorflow")
    records = three.stream(shuffle=True, shuffle_seed=2)
    want = epoch_pairs(three.stream(shuffle=True, shuffle_seed=2))
    got = [
        (int(e["src"]), int(e["i"]))
        for e in ydl.tensorflow.make_tf_dataset(records).as_numpy_iterator()
    ]
    assert got == want
    batches = three.stream(shuffle=True, shuffle_seed=2, batch_size=16)
    dataset = ydl.tensorflow.make_tf_dataset(batches)
    assert batch_pairs(dataset.as_numpy_iterator()) == want
    assert batch_pairs(dataset.as_numpy_iterator()) == epoch_pairs(
        three.stream(shuffle=True, shuffle_seed=2, start_offset=70)
    ), "the next iteration is the next epoch"


def test_tf_dataset_of_records_whose_fields_differ_holds_the_shared_ones(
    varied: dict[str, ydl.DataRef],
) -> None:
    pytest.importorskip("tensorflow")
    mix = ydl.mix({"four": varied["x4"], "none": varied["nox"]})
    want = epoch_pairs(mix.stream(shuffle=True, shuffle_seed=3))
    for read_ahead in (True, False):
        dataset = ydl.tensorflow.make_tf_dataset(
            mix.stream(shuffle=True, shuffle_seed=3), read_ahead=read_ahead
        )
        got = list(dataset.as_numpy_iterator())
        assert all(set(e) == {"src", "i"} for e in got)
        assert [pair(e) for e in got] == want


def test_keras_fits_a_mixture_and_its_backup_resumes_at_the_same_item(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")
    storage = ydl.LocalStorage(tmp_path / "store")
    sources = {
        name: ydl.cache_dataset(
            ({"x": np.full(3, 100 * k + i, np.float32), "y": np.int64(k)} for i in range(n)),
            name,
            "v",
            storage,
            progress=False,
        )
        for k, (name, n) in enumerate({"web": 40, "books": 12}.items())
    }
    mix = ydl.mix(sources, {"web": 3, "books": 1}, epoch_size=48)

    def stream() -> ydl.Stream:
        return mix.stream(shuffle=True, shuffle_seed=4, batch_size=8)

    seq = ydl.keras.StreamSequence(stream(), x="x", y="y")
    assert len(seq) == 6
    epoch = [tuple(seq[b][0][:, 0].tolist()) for b in range(6)]
    assert sum(epoch, ()) == tuple(float(r) for b in stream() for r in b["x"][:, 0])

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = str(tmp_path / "backup")
    first = stream()
    callback = ydl.keras.BackupAndRestore(backup, first, save_freq=4, delete_checkpoint=False)
    model.fit(ydl.keras.StreamSequence(first, x="x", y="y"), epochs=1, callbacks=[callback],
              verbose=0)  # fmt: skip
    with open(os.path.join(backup, "training_metadata.json")) as f:
        saved = json.load(f)["yogadl_plus"]
    assert saved["stream"]["dataset"] == "mix(web=web:v*36, books=books:v*12)"
    assert saved["offset"] == 4 * 8  # the backup after the 4th batch of 6
    # Restored into a new stream over the same mixture, it resumes at that item.
    resumed = stream()
    restore = ydl.keras.BackupAndRestore(backup, resumed, delete_checkpoint=False)
    restore.set_model(model)
    restore.on_train_begin()
    assert resumed.offset == saved["offset"]
    rest = [float(r) for b in resumed for r in b["x"][:, 0]]
    assert rest == [float(v) for b in epoch[4:] for v in b]
    # A stream over another mixture of the same sources refuses the backup, naming why.
    other = ydl.mix(sources, {"web": 1, "books": 1}, epoch_size=48)
    refused = ydl.keras.BackupAndRestore(
        backup, other.stream(shuffle=True, shuffle_seed=4, batch_size=8), delete_checkpoint=False
    )
    refused.set_model(model)
    with pytest.raises(ValueError, match="dataset"):
        refused.on_train_begin()


def test_small_sources_follow_the_one_keyed_shuffle_whatever_the_blocks():
    # A small source's epochs are Permutation tables, kept between blocks of slots: placing an
    # epoch in blocks gives what placing it at once does, and each source epoch's records are
    # exactly Permutation(size, key, epoch)'s order.
    from yogadl_plus.order import MixOrder, Permutation
    from yogadl_plus.order.mixing import source_seed

    order = MixOrder(["big", "small"], [5000, 7], [3000, 700])
    slots = np.random.default_rng(3).permutation(3700)
    whole = order.place(2, slots, True, 11)
    pieces = [order.place(2, slots[s : s + 500], True, 11) for s in range(0, 3700, 500)]
    for leaf in (0, 1):
        (part,) = [p for p in whole.parts if p[0] == leaf]
        joined = np.concatenate([p[2] for piece in pieces for p in piece.parts if p[0] == leaf])
        assert sorted(joined.tolist()) == sorted(part[2].tolist())
    (small,) = [p for p in whole.parts if p[0] == 1]
    sequence = 2 * 700 + Interleave(order.counts).source_and_rank(slots[small[1]])[1]
    key = source_seed(11, "small")
    for epoch, position, record in zip(sequence // 7, sequence % 7, small[2]):
        assert Permutation(7, key, int(epoch))[int(position)] == record


@pytest.mark.parametrize("slots_of_big", [2600, 40_000], ids=["two-epochs", "many-epochs"])
def test_a_big_source_read_across_its_epochs_follows_each_epochs_own_shuffle(
    slots_of_big: int,
) -> None:
    # A block of shuffled slots reads a big source across two of its epochs (up-sampled a
    # little), or across many (up-sampled 30 times): each epoch's positions are found apart,
    # and every record is Permutation(size, key, epoch)'s at its position, as defined.
    from yogadl_plus.order import MixOrder, Permutation
    from yogadl_plus.order.mixing import source_seed

    order = MixOrder(["other", "big"], [5000, 1300], [1000, slots_of_big])
    slots = np.random.default_rng(4).permutation(order.epoch_size)[:6000]
    (big,) = [p for p in order.place(3, slots, True, 11).parts if p[0] == 1]
    sequence = 3 * slots_of_big + Interleave(order.counts).source_and_rank(slots[big[1]])[1]
    epochs = sequence // 1300
    assert len(np.unique(epochs)) >= (2 if slots_of_big < 5000 else 20)
    key = source_seed(11, "big")
    for epoch in np.unique(epochs).tolist():
        at = epochs == epoch
        expected = Permutation(1300, key, epoch).indices(sequence[at] % 1300)
        assert big[2][at].tolist() == expected.tolist()


def test_a_damaged_chunk_of_one_source_fails_a_mixtures_batches_naming_it(
    storage: ydl.LocalStorage,
) -> None:
    # Mixture batches read every source in one pass: a damaged chunk is still the
    # CacheCorrupted naming it, never other records.
    from helpers.damage import chunk_path, flip_byte

    good = ydl.cache_dataset(
        {"src": np.zeros(400, np.int64), "i": np.arange(400)}, "dm-a", "v", storage,
        progress=False,
    )  # fmt: skip
    bad = ydl.cache_dataset(
        {"src": np.ones(400, np.int64), "i": np.arange(400)}, "dm-b", "v", storage,
        progress=False,
    )  # fmt: skip
    mix = ydl.mix({"a": good, "b": bad})
    assert len(list(mix.stream(shuffle=True, shuffle_seed=2, batch_size=64))) == 13
    bad.close()  # (its chunks are opened, and checked, again on the next read)
    flip_byte(chunk_path(bad), 5000)
    with pytest.raises(ydl.CacheCorrupted, match="dm-b"):
        list(mix.stream(shuffle=True, shuffle_seed=2, batch_size=64))


# --- the source's own epoch of each read, through cuts of a placement ---


def reads_at(placement: Any) -> dict[int, tuple[int, int, int]]:
    """offset -> (leaf, record, the epoch of its own source it is read in) of a Placement."""
    out = {}
    for k, part in enumerate(placement.parts):
        own = np.broadcast_to(placement.record_epochs(k), len(part[2])).tolist()
        for at, record, epoch in zip(placement.offsets(part).tolist(), part[2].tolist(), own):
            out[at] = (part[0], record, epoch)
    return out


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 20), length=st.integers(1, 25), step=st.integers(1, 9),
    cut=st.tuples(st.integers(0, 25), st.integers(0, 25)), epoch=st.integers(0, 4),
    shuffle=st.booleans(), nested=st.booleans(),
)  # fmt: skip
def test_cutting_a_placement_keeps_each_read_s_own_epoch(
    start, length, step, cut, epoch, shuffle, nested
) -> None:
    from yogadl_plus.order import MixOrder

    # A source of 3 records up-sampled (7 of 12 slots); nested, an inner mixture of 5 items
    # read 7 times an epoch, whose leaves' reads come from several of its epochs at once.
    inner = MixOrder(["p", "q"], [2, 3], [1, 4]) if nested else 3
    order = MixOrder(["small", "big"], [inner, 10], [7, 5])
    slots = np.arange(start, start + length) % 12
    placement = order.place(epoch, slots, shuffle, 1)
    whole = reads_at(placement)
    assert sorted(whole) == list(range(length))
    if not nested:  # item q of a source of n: record q % n (unshuffled) of its epoch q // n
        small = [e for leaf, _, e in whole.values() if leaf == 0]
        assert set(small) <= {(epoch * 7 + r) // 3 for r in range(7)}
    pieces = placement.split(step)
    assert {
        k * step + at: read
        for k, piece in enumerate(pieces)
        for at, read in reads_at(piece).items()
    } == whole
    low, high = sorted(cut)
    assert reads_at(placement[low:high]) == {
        at - low: read for at, read in whole.items() if low <= at < high
    }
