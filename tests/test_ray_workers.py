"""Ray workers: ``stream(..., num_workers=K, worker_type="ray")`` runs the boundary's work
(predicate, decode, transform) on Ray actors of the cluster ``ray.init`` joined, with the output of
``worker_type="thread"`` item for item, exact resume and ``offset_after``, and an actor killed
mid-epoch replaced, its units run again.

A real local Ray cluster on 127.0.0.1 (conftest's ``ray_cluster``); the transforms are this
module's functions, which the actors import by reference (tests/ is on their path).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus import predicates
from yogadl_plus.errors import TransformError, WorkerDied

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]

N = 3000


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> ydl.DataRef:
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("ray-workers"))
    rng = np.random.default_rng(0)
    columns = {"i": np.arange(N), "x": rng.standard_normal((N, 16)).astype(np.float32)}
    return ydl.cache_dataset(columns, "rayw", "v1", storage, progress=False)


def doubled(record: dict[str, Any]) -> dict[str, Any]:
    return {"i": record["i"], "x": record["x"] * 2, "pid": os.getpid()}


def without_pid(items: list[Any]) -> list[Any]:
    def clean(item: Any) -> Any:
        return {k: v for k, v in item.items() if k != "pid"}

    return [clean(item) for item in items]


def same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        if not all(np.array_equal(np.asarray(x[k]), np.asarray(y[k])) for k in x):
            return False
    return True


def below_2000(i: Any) -> bool:
    return int(i) < 2000


ARGS: list[dict[str, Any]] = [
    dict(shuffle=True, shuffle_seed=3, batch_size=64),
    dict(shuffle=True, shuffle_seed=3, batch_size=50, transform=doubled, drop_last=True),
    dict(
        shuffle=True,
        shuffle_seed=4,
        transform=doubled,
        predicate=predicates.in_lambda("i", below_2000),
    ),
    dict(shuffle=True, shuffle_seed=5, batch_size=32, shard_rank=1, num_shards=3),
]


@pytest.mark.parametrize("args", ARGS, ids=["batches", "transform", "predicate", "shard"])
def test_ray_workers_give_what_thread_workers_give(ref: ydl.DataRef, args: dict) -> None:
    threads = list(ref.stream(**args, num_workers=2))
    actors = list(ref.stream(**args, num_workers=3, worker_type="ray"))
    assert (
        same(without_pid(actors), without_pid(threads))
        if "transform" in args
        else same(actors, threads)
    )
    if "transform" in args:  # the transform ran in the actors, not here
        assert {int(np.asarray(item["pid"]).flat[0]) for item in actors} - {os.getpid()}
        assert os.getpid() not in {int(np.asarray(item["pid"]).flat[0]) for item in actors}


def test_a_mixture_on_ray_workers(ref: ydl.DataRef, tmp_path: Path) -> None:
    other = ydl.cache_dataset(
        {"i": np.arange(10_000, 10_500), "x": np.zeros((500, 16), np.float32)},
        "other",
        "v1",
        ydl.LocalStorage(tmp_path),
        progress=False,
    )
    mix = ydl.mix({"a": ref, "b": other}, {"a": 3, "b": 1}, epoch_size=2000)
    args = dict(shuffle=True, shuffle_seed=8, batch_size=40)
    threads = [b["i"].tolist() for b in mix.stream(**args, num_workers=2)]
    actors = [b["i"].tolist() for b in mix.stream(**args, num_workers=2, worker_type="ray")]
    assert actors == threads


def test_resume_and_offset_after_hold_on_ray_workers(ref: ydl.DataRef) -> None:
    args = dict(shuffle=True, shuffle_seed=6, batch_size=100)
    whole = [b["i"].tolist() for b in ref.stream(**args)]
    stream = ref.stream(**args, num_workers=4, worker_type="ray")
    epoch = iter(stream)
    first = [next(epoch)["i"].tolist() for _ in range(7)]
    state = stream.state()
    offset = stream.offset_after(0, 7)
    del epoch
    resumed = ref.stream(**args, num_workers=3, worker_type="ray")
    resumed.load_state(state)
    assert first + [b["i"].tolist() for b in resumed] == whole
    again = ref.stream(**args, start_offset=offset, num_workers=2, worker_type="ray")
    assert [b["i"].tolist() for b in again] == whole[7:]


@pytest.mark.crash
def test_an_actor_killed_mid_epoch_is_replaced_and_its_units_run_again(
    ref: ydl.DataRef, tmp_path: Path, caplog: Any
) -> None:
    marker = tmp_path / "killed"
    args = dict(shuffle=True, shuffle_seed=2, batch_size=30)
    expected = [b["i"].tolist() for b in ref.stream(**args)]
    stream = ref.stream(**args, transform=_KillOnce(str(marker)), num_workers=3, worker_type="ray")
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        got = [b["i"].tolist() for b in stream]
    assert marker.exists(), "the transform did not kill an actor"
    assert got == expected
    assert any("Ray worker died" in r.getMessage() for r in caplog.records)


class _KillOnce:
    """A transform that kills its actor the first time it meets record 1234 (a file marks it)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if int(record["i"]) == 1234 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return record


class _KillAlways:
    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        if int(record["i"]) == 77:
            os.kill(os.getpid(), signal.SIGKILL)
        return record


@pytest.mark.crash
def test_a_unit_that_kills_every_actor_is_worker_died_naming_it(ref: ydl.DataRef) -> None:
    stream = ref.stream(batch_size=10, transform=_KillAlways(), num_workers=2, worker_type="ray")
    with pytest.raises(
        WorkerDied, match=r"died 3 times running positions 70 to 79 .*records 70, 71"
    ):
        list(stream)


def refuses_record_5(record: dict[str, Any]) -> dict[str, Any]:
    if int(record["i"]) == 5:
        raise ValueError("no fives")
    return record


def test_a_transforms_error_comes_back_as_itself(ref: ydl.DataRef) -> None:
    stream = ref.stream(transform=refuses_record_5, num_workers=2, worker_type="ray")
    with pytest.raises(TransformError, match="record 5: ValueError: no fives"):
        list(stream)


def test_without_ray_init_the_stream_says_to_call_it(
    ref: ydl.DataRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match=r"call ray.init\(\.\.\.\) first"):
        list(ref.stream(num_workers=2, worker_type="ray"))


class _Lock:
    """A result no pickle can send back."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()


def with_a_lock(record: dict[str, Any]) -> dict[str, Any]:
    return {"i": record["i"], "lock": _Lock()}


def test_a_result_that_cannot_be_sent_back_is_a_transform_error(ref: ydl.DataRef) -> None:
    stream = ref.stream(transform=with_a_lock, num_workers=2, worker_type="ray")
    with pytest.raises(TransformError, match="the transform's result for record 0"):
        list(stream)


def test_a_transform_that_cannot_be_sent_is_named(ref: ydl.DataRef) -> None:
    import threading

    lock = threading.Lock()
    stream = ref.stream(transform=lambda r: (lock, r)[1], num_workers=2, worker_type="ray")
    with pytest.raises(TransformError, match=r"cannot be sent to Ray actors .*transform"):
        list(stream)


def test_dropping_an_epoch_midway_does_not_stall_the_next(ref: ydl.DataRef, caplog: Any) -> None:
    # Units in flight when the epoch is dropped are left to finish unread: cancelling them in
    # Ray stalled the actors' next units for about 30 s.
    args = dict(shuffle=True, shuffle_seed=1, batch_size=50, transform=doubled)

    def dropped_then_next(stream: ydl.Stream) -> list[list[int]]:
        epoch = iter(stream)
        next(epoch)
        del epoch
        return [b["i"].tolist() for b in stream]

    expected = dropped_then_next(ref.stream(**args, num_workers=2))
    stream = ref.stream(**args, num_workers=2, worker_type="ray")
    with caplog.at_level(logging.WARNING, logger="yogadl_plus"):
        assert dropped_then_next(stream) == expected
    assert not [r for r in caplog.records if "waited" in r.getMessage()]
    arrays = next(iter(stream))["x"]
    arrays[0] = 0  # results arrive as arrays the caller may write to


def test_a_stream_dropped_on_rays_own_thread_stops_its_workers_without_hanging(
    tmp_path: Path,
) -> None:
    # Before: its pool's finalizer called ray.kill on Ray's event-loop thread, which that call
    # waits for: Ray never served again, and ray.shutdown() hung at the end of the suite. In a
    # process of its own (a cluster of its own), so that a hang cannot take this one down.
    job = Path(__file__).parent / "jobs" / "ray_drop_job.py"
    process = subprocess.Popen(
        [sys.executable, str(job), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the job and the Ray processes it started
        out, _ = process.communicate()
        pytest.fail(f"the job hung:\n{out[-3000:]}")
    assert process.returncode == 0 and out.rstrip().endswith("ok"), out[-3000:]
