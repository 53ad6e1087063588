"""The order of a mixture's epoch: shuffled, the sources interleave through it, each source
walks its own epochs in the order of its own key (its name), the same seed gives the same order
in another process, and a placement cut in blocks reads what it reads whole.

The order arithmetic at 10^9 records per source runs on a DataRef double that opens no files.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import tracemalloc
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import Pool, epoch_pairs
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.dataref import DataRef
from yogadl_plus.order.interleave import Interleave

REPO_ROOT = Path(__file__).resolve().parents[1]


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

    def read_ahead(self, indices: np.ndarray, now: bool = False) -> None:
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
