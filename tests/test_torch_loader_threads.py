"""make_dataloader(stream, num_workers=0) over a stream with workers of its own (threads or
processes): the stream's workers do the reading and the transform, and the loader hands out the
same items as the stream and as a loader over the stream without workers, resumes exactly,
leaves no worker behind, and surfaces a transform's error after the items before it."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus import predicates  # noqa: E402

N = 300
WORKERS = [("thread", 2), ("process", 2)]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    storage = ydl.LocalStorage(tmp_path_factory.mktemp("loader-threads"))
    records = ({"i": np.int64(i), "x": np.full(4, i, np.float32)} for i in range(N))
    return ydl.cache_dataset(records, "d", "v", storage, progress=False, chunk_bytes=5000)


def where_made(record):
    """The record, with the process and thread its transform ran in."""
    return {**record, "pid": np.int64(os.getpid()), "thread": threading.current_thread().name}


def jitter(record, rng):
    return {**record, "x": record["x"] + rng.integers(0, 1000, 4).astype(np.float32)}


def fails_on_56(record):
    if record["i"] == 56:
        raise RuntimeError("bad record")
    return record


def not_picklable(record):
    return {**record, "f": lambda: None}


def stream(ref, workers=None, **args):
    """``ref``'s stream with ``workers`` = (worker_type, num_workers) of its own (None: none)."""
    if workers is not None:
        args.update(worker_type=workers[0], num_workers=workers[1])
    return ref.stream(**args)


def contents(items) -> list[dict[str, list]]:
    """Each item's fields as plain lists (``pid`` and ``thread``, which say where, left out)."""
    return [
        {k: np.asarray(v).tolist() for k, v in item.items() if k not in ("pid", "thread")}
        for item in items
    ]


@pytest.mark.parametrize("workers", WORKERS)
def test_the_streams_workers_run_the_transform(ref, workers):
    # Before, a loader without workers read each batch in this thread: a stream's workers,
    # made to run its transform in parallel, stood idle.
    loader = ydl.torch.make_dataloader(stream(ref, workers, batch_size=16, transform=where_made))
    batches = list(loader)
    assert [int(i) for b in batches for i in b["i"]] == list(range(N))
    if workers[0] == "thread":
        made_in = {name for b in batches for name in b["thread"]}
        assert made_in and all(name.startswith("yogadl_plus-worker") for name in made_in)
    else:
        made_in = {int(pid) for b in batches for pid in b["pid"]}
        assert made_in and os.getpid() not in made_in


ORDERS = [
    dict(shuffle=True, shuffle_seed=3, batch_size=16),
    dict(shuffle=True, shuffle_seed=3, batch_size=16, transform=ydl.random_map(jitter)),
    dict(shuffle=True, shuffle_seed=5),  # records
    dict(batch_size=7, predicate=predicates.in_lambda("i", lambda i: i % 3 != 1)),
    dict(shuffle=True, shuffle_seed=5, batch_size=9, skip=np.arange(0, N, 4), drop_last=True),
]


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("args", ORDERS)
def test_the_items_are_the_streams_and_the_loaders_without_workers(ref, workers, args):
    loader = ydl.torch.make_dataloader(stream(ref, workers, **args))
    got = [contents(loader) for _ in range(2)]  # two epochs: random draws differ between them
    alone = stream(ref, workers, **args)
    assert got == [contents(alone) for _ in range(2)]
    plain = ydl.torch.make_dataloader(stream(ref, **args))
    assert got == [contents(plain) for _ in range(2)]
    assert loader.stats().items == alone.stats().items


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("args", [ORDERS[1], ORDERS[2], ORDERS[3], ORDERS[4]])
def test_a_state_mid_epoch_resumes_at_the_next_item(ref, workers, args):
    def make():
        return ydl.torch.make_dataloader(stream(ref, workers, **args))

    epochs = [contents(stream(ref, **args, start_offset=e * N)) for e in range(2)]
    loader = make()
    # An iteration left unfinished: the next iter() is the next epoch.
    assert contents(b for b, _ in zip(loader, range(3))) == epochs[0][:3]
    k = len(epochs[1]) // 2
    states = {}
    for j, _ in enumerate(loader):
        states[j + 1] = loader.state_dict()
        if j + 1 == k:
            break
    for at in (1, k):
        resumed = make()
        resumed.load_state_dict(states[at])
        assert contents(resumed) == epochs[1][at:]


def worker_threads() -> int:
    return sum(t.name.startswith("yogadl_plus-worker") for t in threading.enumerate())


@pytest.mark.parametrize("workers", WORKERS)
def test_an_abandoned_iteration_leaves_no_worker_behind(ref, workers):
    before = worker_threads()
    loader = ydl.torch.make_dataloader(stream(ref, workers, batch_size=8, transform=where_made))
    it = iter(loader)
    batches = [next(it) for _ in range(3)]
    pids = {int(pid) for b in batches for pid in b["pid"]} - {os.getpid()}
    assert worker_threads() > before or pids  # the stream's workers ran
    del it, loader
    gc.collect()
    deadline = time.monotonic() + 10  # (they leave after the unit they are on)
    while time.monotonic() < deadline:
        children = {p.pid for p in multiprocessing.active_children()}
        if worker_threads() == before and not pids & children:
            break
        time.sleep(0.02)
    assert worker_threads() == before
    assert not pids & {p.pid for p in multiprocessing.active_children()}


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize(
    "args, before",
    [
        (dict(), [[i] for i in range(56)]),
        (dict(batch_size=10), [list(range(j, j + 10)) for j in range(0, 50, 10)]),
        # (Without DataLoader workers, the passing records read before the one that fails
        # are not handed out: the batches before it come only from DataLoader workers.)
        (dict(batch_size=10, predicate=predicates.in_lambda("i", lambda i: i % 2 == 0)), []),
    ],
)
def test_a_transform_error_comes_after_the_items_before_it(ref, workers, args, before):
    # The stream's workers fail a read of many records at once; the loader hands out the
    # items before the one that fails as without them, then the error naming it.
    for with_workers in (workers, None):
        got = []
        loader = ydl.torch.make_dataloader(stream(ref, with_workers, transform=fails_on_56, **args))
        with pytest.raises(ydl.TransformError, match="record 56"):
            for item in loader:
                got.append(np.asarray(item["i"]).reshape(-1).tolist())
        assert got == before


def test_a_result_a_worker_process_cannot_send_back_is_read_here_with_a_warning(ref):
    loader = ydl.torch.make_dataloader(
        stream(ref, ("process", 2), batch_size=50, transform=not_picklable),
        collate_fn=lambda batch: batch["i"],
    )
    with pytest.warns(RuntimeWarning, match="read without them"):
        assert [int(i) for b in loader for i in b] == list(range(N))
