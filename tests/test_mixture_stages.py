"""Mixture stages (docs/api.md#mixtures): ``ydl.mix(..., schedule={first_epoch: weights})``
changes the shares from given epochs on. Every epoch holds the exact shares of the weights then
in force; each source goes on with its own sequence of epochs across a change (nothing repeated
before its epoch ends, nothing skipped); a weight of 0 pauses a source; resume, shards and
elastic rescale hold; and a state loads into a mixture whose schedule differs only after the
state's epoch, so stages can be appended during a run.

Sources are tiny real caches of records ``{"src": j, "i": i}``; the expected shares and
sequences are computed here, not by the library.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers.mixtures import largest_remainder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.mixture import Mixture
from yogadl_plus.stream import StreamState

NAMES = ("a", "b", "c")
SIZES = (1, 2, 3, 5, 8, 13)
Pool = Callable[[int, int], ydl.DataRef]

PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Pool:
    """``pool(j, n)``: source ``j`` of ``n`` records ``{"src": j, "i": i}``, built once."""
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("stages"))
    made: dict[tuple[int, int], ydl.DataRef] = {}

    def of(j: int, n: int) -> ydl.DataRef:
        if (j, n) not in made:
            columns = {"src": np.full(n, j, np.int64), "i": np.arange(n, dtype=np.int64)}
            made[(j, n)] = ydl.cache_dataset(columns, f"s{j}", f"n{n}", storage, progress=False)
        return made[(j, n)]

    return of


@st.composite
def scheduled(draw: st.DrawFn) -> dict[str, Any]:
    """Sizes, an epoch size, and weights for epoch 0 and up to three later stages."""
    k = draw(st.integers(1, len(NAMES)))
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=k, max_size=k))

    def weights() -> list[int]:
        row = draw(st.lists(st.integers(0, 4), min_size=k, max_size=k))
        if not any(row):
            row[draw(st.integers(0, k - 1))] = 1
        return row

    firsts = sorted(draw(st.sets(st.integers(1, 6), max_size=3)))
    return {
        "sizes": sizes,
        "epoch_size": draw(st.integers(1, 30)),
        "weights": weights(),
        "schedule": {first: weights() for first in firsts},
    }


def make(pool: Pool, spec: dict[str, Any], schedule: Any = "spec") -> Mixture:
    names = NAMES[: len(spec["sizes"])]
    sources = {name: pool(j, n) for j, (name, n) in enumerate(zip(names, spec["sizes"]))}
    stages = spec["schedule"] if schedule == "spec" else schedule
    return ydl.mix(
        sources,
        dict(zip(names, spec["weights"])),
        epoch_size=spec["epoch_size"],
        schedule={e: dict(zip(names, w)) for e, w in (stages or {}).items()},
    )


def weights_at(spec: dict[str, Any], epoch: int) -> list[int]:
    firsts = [e for e in spec["schedule"] if e <= epoch]
    return spec["schedule"][max(firsts)] if firsts else spec["weights"]


def epoch_records(stream: ydl.Stream) -> list[tuple[int, int]]:
    """One epoch of a batching stream, as (source, record) pairs in order."""
    return [(int(s), int(i)) for batch in stream for s, i in zip(batch["src"], batch["i"])]


# --- shares and sequences ------------------------------------------------------------------


@PROPERTY
@given(spec=scheduled())
def test_each_epoch_has_the_shares_then_in_force_and_sources_go_on_in_sequence(
    pool: Pool, spec: dict[str, Any]
) -> None:
    mix = make(pool, spec)
    stream = mix.stream(batch_size=7)
    read: dict[int, list[int]] = {j: [] for j in range(len(spec["sizes"]))}
    for epoch in range(9):
        expected = largest_remainder(weights_at(spec, epoch), spec["epoch_size"])
        assert mix.counts_at(epoch) == expected
        got = epoch_records(stream)
        counts = Counter(s for s, _ in got)
        assert [counts[j] for j in range(len(expected))] == expected, epoch
        for s, i in got:
            read[s].append(i)
    # Unshuffled, a source's items in slot order are its own sequence: 0, 1, ..., size-1, 0, ...
    # across every change of weights, a paused source going on where it stopped.
    for j, records in read.items():
        size = spec["sizes"][j]
        assert records == [k % size for k in range(len(records))], j


@PROPERTY
@given(spec=scheduled(), seed=st.integers(0, 2**31))
def test_shuffled_sources_repeat_nothing_before_their_own_epoch_ends(
    pool: Pool, spec: dict[str, Any], seed: int
) -> None:
    mix = make(pool, spec)
    stream = mix.stream(shuffle=True, shuffle_seed=seed, batch_size=4)
    read: dict[int, list[int]] = {j: [] for j in range(len(spec["sizes"]))}
    for _ in range(9):
        got = epoch_records(stream)
        assert len(got) == spec["epoch_size"]
        for s, i in got:
            read[s].append(i)
        for j, records in read.items():
            # After any whole mixture epoch, a source has read each of its records a number
            # of times differing by at most one, those read once more being exactly its
            # sequence's partial own epoch.
            size = spec["sizes"][j]
            times = np.bincount(records, minlength=size) if records else np.zeros(size, int)
            whole, extra = divmod(len(records), size)
            assert sorted(times.tolist(), reverse=True) == [whole + 1] * extra + [whole] * (
                size - extra
            )


def test_a_weight_of_zero_pauses_a_source_and_it_resumes_where_it_stopped(pool: Pool) -> None:
    mix = ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 8)},
        {"a": 1, "b": 1},
        epoch_size=6,
        schedule={2: {"a": 1, "b": 0}, 4: {"a": 0, "b": 1}, 5: {"a": 1, "b": 1}},
    )
    assert [mix.counts_at(e) for e in range(6)] == [[3, 3]] * 2 + [[6, 0]] * 2 + [[0, 6], [3, 3]]
    epochs = [epoch_records(s) for s in [mix.stream(batch_size=6)] for _ in range(6)]
    b = [i for epoch in epochs for s, i in epoch if s == 1]
    a = [i for epoch in epochs for s, i in epoch if s == 0]
    assert b == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6]
    assert a == list(range(13)) + list(range(8))
    assert "from epoch 2: a=6, b=0" in repr(mix)


def test_a_paused_source_is_still_checked_for_the_fields_it_will_give(
    pool: Pool, tmp_path: Any
) -> None:
    other = ydl.cache_dataset(
        {"src": np.zeros(4, np.float32), "i": np.arange(4)},
        "f32",
        "1",
        ydl.LocalStorage(tmp_path),
        progress=False,
    )
    mix = ydl.mix({"a": pool(0, 5), "b": other}, {"a": 1, "b": 0}, schedule={3: {"a": 1, "b": 1}})
    with pytest.raises(ydl.SchemaError, match="'src'"):
        mix.stream(batch_size=2)


# --- resuming across stages, and appending one mid-run ---------------------------------------


@PROPERTY
@given(spec=scheduled(), seed=st.integers(0, 2**31), data=st.data())
def test_a_stage_appended_after_the_states_epoch_resumes_as_if_scheduled_all_along(
    pool: Pool, spec: dict[str, Any], seed: int, data: st.DataObject
) -> None:
    final = make(pool, spec)
    whole = [
        epoch_records(s)
        for s in [final.stream(shuffle=True, shuffle_seed=seed, batch_size=1)]
        for _ in range(8)
    ]
    flat = [pair for epoch in whole for pair in epoch]
    offset = data.draw(st.integers(0, len(flat)), label="offset")
    epoch, position = divmod(offset, spec["epoch_size"])
    # The run began with only the stages up to the state's epoch (later ones unknown yet).
    reached = epoch if position else epoch - 1
    known = {e: w for e, w in spec["schedule"].items() if e <= reached}
    first = make(pool, spec, schedule=known).stream(
        shuffle=True, shuffle_seed=seed, start_offset=offset
    )
    state = json.loads(json.dumps(first.state().to_dict()))
    resumed = final.stream(shuffle=True, shuffle_seed=seed, batch_size=1)
    resumed.load_state(state)
    got = []
    while len(got) < len(flat) - offset:
        got += epoch_records(resumed)
    assert got[: len(flat) - offset] == flat[offset:]


def test_loading_refuses_a_schedule_that_differs_where_the_state_has_read(pool: Pool) -> None:
    sources = {"a": pool(0, 13), "b": pool(1, 8)}
    old = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10, schedule={2: {"a": 1, "b": 3}})
    stream = old.stream(shuffle=True, shuffle_seed=1, batch_size=5)
    for _ in range(3):
        list(stream)
    next(iter(stream))  # the state is in epoch 3
    state = stream.state()
    assert state.to_dict()["schedule"] == {"": [[0, [5, 5]], [2, [3, 7]]]}
    for schedule, differs in [
        ({2: {"a": 1, "b": 3}, 4: {"a": 1, "b": 0}}, None),  # appended after: loads
        ({2: {"a": 1, "b": 3}, 3: {"a": 1, "b": 0}}, 3),  # in the state's own epoch
        ({2: {"a": 1, "b": 4}}, 2),
        ({1: {"a": 1, "b": 1}, 2: {"a": 1, "b": 3}}, None),  # the same shares, said twice
        (None, 2),
        ({2: {"a": 1, "b": 3}, 3: {"a": 1, "b": 2}}, None),  # other weights, the same shares
    ]:
        mix = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10, schedule=schedule)
        fresh = mix.stream(shuffle=True, shuffle_seed=1, batch_size=5)
        if differs is None:
            fresh.load_state(state.to_dict())
            assert fresh.offset == state.offset
        else:
            with pytest.raises(ValueError, match=f"differs at epoch {differs},.*in epoch 3"):
                fresh.load_state(state)
    # Epoch 0 differs: named as any other epoch, not as a fingerprint.
    mix = ydl.mix(sources, {"a": 3, "b": 1}, epoch_size=10, schedule={2: {"a": 1, "b": 3}})
    with pytest.raises(ValueError, match="differs at epoch 0"):
        mix.stream(shuffle=True, shuffle_seed=1).load_state(state)


def test_a_state_at_an_epochs_end_may_change_the_next_epoch(pool: Pool) -> None:
    sources = {"a": pool(0, 13), "b": pool(1, 8)}
    stream = ydl.mix(sources, epoch_size=10).stream(batch_size=5)
    list(stream)
    list(stream)
    state = stream.state()  # epoch 1 read whole: epoch 2 not begun
    assert "schedule" not in state.to_dict()  # a mixture without one saves what it always did
    later = ydl.mix(sources, epoch_size=10, schedule={2: {"a": 0, "b": 1}}).stream(batch_size=5)
    later.load_state(state)
    assert Counter(s for s, _ in epoch_records(later)) == {1: 10}
    earlier = ydl.mix(sources, epoch_size=10, schedule={1: {"a": 0, "b": 1}}).stream()
    with pytest.raises(ValueError, match="differs at epoch 1"):
        earlier.load_state(state)


def test_an_inner_mixtures_schedule_is_checked_in_its_own_epochs(pool: Pool) -> None:
    def outer(inner_schedule: Any) -> Mixture:
        inner = ydl.mix({"b": pool(1, 8), "c": pool(2, 5)}, epoch_size=4, schedule=inner_schedule)
        return ydl.mix({"a": pool(0, 13), "text": inner}, {"a": 1, "text": 1}, epoch_size=8)

    stream = outer({3: {"b": 0, "c": 1}}).stream(shuffle=True, shuffle_seed=5, batch_size=4)
    list(stream)
    list(stream)  # outer epochs 0-1: 8 inner items, inner epochs 0-1
    state = stream.state()
    assert state.to_dict()["schedule"]["text"] == [[0, [2, 2]], [3, [0, 4]]]
    outer({2: {"b": 0, "c": 1}}).stream(shuffle=True, shuffle_seed=5).load_state(state)
    with pytest.raises(ValueError, match="epoch 1 of source 'text'"):
        outer({1: {"b": 0, "c": 1}}).stream(shuffle=True, shuffle_seed=5).load_state(state)
    # Across the inner stages: exact shares in the inner mixture's own epochs (4 items each).
    stream = outer({2: {"b": 1, "c": 0}}).stream(batch_size=8)
    text = [s for _ in range(4) for s, _ in epoch_records(stream) if s]
    assert Counter(text[:8]) == {1: 4, 2: 4} and Counter(text[8:16]) == {1: 8}


# --- shards and elastic rescale ------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_split_every_stages_epochs_disjointly(pool: Pool, num_shards: int) -> None:
    spec = {
        "sizes": [13, 8, 5],
        "epoch_size": 17,
        "weights": [1, 1, 1],
        "schedule": {2: [3, 0, 1], 3: [0, 1, 0]},
    }
    mix = make(pool, spec)
    whole = mix.stream(shuffle=True, shuffle_seed=9, batch_size=1)
    shards = [
        mix.stream(shuffle=True, shuffle_seed=9, batch_size=1, shard_rank=r, num_shards=num_shards)
        for r in range(num_shards)
    ]
    for _ in range(5):
        expected = epoch_records(whole)
        parts = [epoch_records(s) for s in shards]
        assert Counter(pair for part in parts for pair in part) == Counter(expected)


def test_an_elastic_rescale_goes_on_across_a_stage(pool: Pool) -> None:
    spec = {"sizes": [13, 8], "epoch_size": 12, "weights": [1, 1], "schedule": {2: [1, 3]}}
    mix = make(pool, spec)
    single = mix.stream(shuffle=True, shuffle_seed=4, batch_size=1)
    whole = [pair for _ in range(4) for pair in epoch_records(single)]
    two = [
        mix.stream(shuffle=True, shuffle_seed=4, batch_size=1, shard_rank=r, num_shards=2)
        for r in range(2)
    ]
    got = [pair for s in two for pair in itertools_take(s, 9)]  # 18 items, into epoch 1
    start = two[0].global_offset
    three = [
        mix.stream(
            shuffle=True,
            shuffle_seed=4,
            batch_size=1,
            shard_rank=r,
            num_shards=3,
            global_start=start,
        )
        for r in range(3)
    ]
    for _ in range(3):
        for s in three:
            got += epoch_records(s)
    assert Counter(got[: len(whole)]) == Counter(whole[: len(got[: len(whole)])])
    assert Counter(got) == Counter(whole[: len(got)])


def itertools_take(stream: ydl.Stream, n: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for batch in stream:
        out += [(int(s), int(i)) for s, i in zip(batch["src"], batch["i"])]
        if len(out) >= n:
            break
    return out[:n]


# --- the torch face --------------------------------------------------------------------------


def test_a_dataloader_state_loads_into_a_mixture_with_a_stage_appended(pool: Pool) -> None:
    pytest.importorskip("torch")
    sources = {"a": pool(0, 13), "b": pool(1, 8)}
    args = dict(shuffle=True, shuffle_seed=2, batch_size=3)
    loader = ydl.torch.make_dataloader(ydl.mix(sources, epoch_size=9).stream(**args))
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    appended = ydl.mix(sources, epoch_size=9, schedule={1: {"a": 0, "b": 1}})
    resumed = ydl.torch.make_dataloader(appended.stream(**args))
    resumed.load_state_dict(saved)
    rest = [tuple(b["src"].tolist()) for b in resumed]
    assert len(rest) == 2
    changed = ydl.mix(sources, epoch_size=9, schedule={0 + 1: {"a": 1, "b": 0}})
    refused = ydl.torch.make_dataloader(changed.stream(**args))
    list(refused)
    next(iter(refused))  # a state in epoch 1
    later = refused.state_dict()
    again = ydl.torch.make_dataloader(appended.stream(**args))
    with pytest.raises(ValueError, match="differs at epoch 1"):
        again.load_state_dict(later)


# --- bad schedules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "error", "match"),
    [
        ({0: {"a": 1, "b": 1}}, ValueError, r"epochs >= 1, got 0: epoch 0's weights are weights="),
        ({True: {"a": 1, "b": 1}}, ValueError, r"schedule keys are epochs \(ints >= 1\), got True"),
        ({2.0: {"a": 1, "b": 1}}, ValueError, r"got 2.0"),
        ({3: {"a": 0, "b": 0}}, ValueError, r"schedule\[3\]: the weights .* all zero"),
        ({3: {"a": 1, "z": 1}}, ValueError, r"schedule\[3\]: weights names 'z'"),
        ({3: {"a": 1}}, ValueError, r"schedule\[3\]: weights has no weight for source 'b'"),
        ({3: {"a": 1, "b": -1}}, ValueError, r"schedule\[3\]: the weight of source 'b'"),
        ({3: [1, 1]}, TypeError, r"schedule\[3\]: weights must be a mapping"),
        ([(3, {"a": 1, "b": 1})], TypeError, r"schedule must be a mapping"),
    ],
)
def test_bad_schedules_are_refused_naming_the_stage(
    pool: Pool, schedule: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        ydl.mix({"a": pool(0, 5), "b": pool(1, 3)}, schedule=schedule)


def test_a_source_without_records_cannot_be_weighted_in_a_later_stage(
    pool: Pool, tmp_path: Any
) -> None:
    schema = ydl.Schema([ydl.Field("src", np.int64), ydl.Field("i", np.int64)])
    empty = ydl.cache_dataset(
        [], "e", "1", ydl.LocalStorage(tmp_path), schema=schema, progress=False
    )
    with pytest.raises(ValueError, match=r"schedule\[4\]: source 'e' has no records"):
        ydl.mix({"a": pool(0, 5), "e": empty}, {"a": 1, "e": 0}, schedule={4: {"a": 1, "e": 1}})


@pytest.mark.parametrize(
    "schedule",
    [{"": [[0]]}, {"": "x"}, {"": []}, {"": [[0, [1, "2"]]]}, {"": [[-1, [1, 1]]]}, [1]],
)
def test_a_malformed_schedule_in_a_state_is_refused(pool: Pool, schedule: Any) -> None:
    mix = ydl.mix({"a": pool(0, 5), "b": pool(1, 3)}, schedule={2: {"a": 1, "b": 0}})
    state = mix.stream().state().to_dict()
    with pytest.raises(ValueError, match="schedule"):
        StreamState.from_dict({**state, "schedule": schedule})


def test_lineage_follows_the_stages(pool: Pool) -> None:
    mix = ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 8)},
        {"a": 1, "b": 1},
        epoch_size=10,
        schedule={1: {"a": 0, "b": 1}, 2: {"a": 3, "b": 1}},
    )
    stream = mix.stream(shuffle=True, shuffle_seed=6, batch_size=4, start_offset=7)
    said = stream.lineage(8)
    handed = [batch for _ in range(3) for batch in stream][:8]
    names = {"a": 0, "b": 1}
    for pairs, batch in zip(said, handed):
        assert [(names[n], i) for n, i in pairs] == list(
            zip(batch["src"].tolist(), batch["i"].tolist())
        )


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_read_a_scheduled_mixture_as_the_stream_does(pool: Pool, worker_type: str) -> None:
    spec = {"sizes": [13, 8], "epoch_size": 12, "weights": [1, 1], "schedule": {1: [1, 3]}}
    mix = make(pool, spec)
    args = dict(shuffle=True, shuffle_seed=4, batch_size=5)
    inline = mix.stream(**args)
    workers = mix.stream(**args, num_workers=2, worker_type=worker_type)
    for _ in range(3):
        assert epoch_records(workers) == epoch_records(inline)


def test_a_state_at_the_start_of_a_global_start_stream_has_read_its_epoch(pool: Pool) -> None:
    # An elastic resume begins part-way into an epoch: its first position is not that epoch's
    # start, so the epoch was partly read before the rescale and may not change.
    sources = {"a": pool(0, 13), "b": pool(1, 8)}
    old = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10)
    new = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10, schedule={2: {"a": 0, "b": 1}})
    args = dict(shuffle=True, shuffle_seed=3, batch_size=1)
    state = old.stream(**args, global_start=25).state()
    with pytest.raises(ValueError, match="differs at epoch 2"):
        new.stream(**args, global_start=25).load_state(state)
    later = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10, schedule={3: {"a": 0, "b": 1}})
    later.stream(**args, global_start=25).load_state(state)


def test_a_scheduled_state_has_a_format_older_releases_refuse(pool: Pool) -> None:
    # A release before schedules would load the state and resume at epoch 0's weights.
    sources = {"a": pool(0, 13), "b": pool(1, 8)}
    plain = ydl.mix(sources, epoch_size=10).stream().state().to_dict()
    staged = ydl.mix(sources, epoch_size=10, schedule={2: {"a": 1, "b": 0}}).stream()
    saved = staged.state().to_dict()
    assert plain["format"] == 2 and saved["format"] == 3
    staged.load_state(json.loads(json.dumps(saved)))
    with pytest.raises(ValueError, match="reads formats 2 and 3"):
        StreamState.from_dict({**saved, "format": 4})


def test_keras_backup_refuses_a_schedule_changed_where_it_trained(
    pool: Pool, tmp_path: Any
) -> None:
    keras = pytest.importorskip("keras")
    sources = {"a": pool(0, 13), "b": pool(1, 8)}

    def stream(schedule: Any) -> ydl.Stream:
        mix = ydl.mix(sources, {"a": 1, "b": 1}, epoch_size=10, schedule=schedule)
        return mix.stream(shuffle=True, shuffle_seed=3, batch_size=5, fields=["src", "i"])

    def fit(stream: ydl.Stream, epochs: int) -> None:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        backup = ydl.keras.BackupAndRestore(
            str(tmp_path / "backup"), stream, save_freq="epoch", delete_checkpoint=False
        )
        data = ydl.keras.StreamSequence(stream, x="src", y="i")
        model.fit(data, epochs=epochs, callbacks=[backup], verbose=0)

    fit(stream({1: {"a": 1, "b": 0}}), epochs=3)  # backed up after epoch 2
    with pytest.raises(ValueError, match=r"backup.*differs at epoch 1"):
        fit(stream({1: {"a": 0, "b": 1}}), epochs=4)
    fit(stream({1: {"a": 1, "b": 0}, 3: {"a": 0, "b": 1}}), epochs=4)  # appended: resumes
