"""The framework faces against their own ceilings, in the same run, as ratios.

    python -m bench.bench_faces [--records 100000] [--big 2000] [--rounds 3] [--json out.json]

Data, built once in a temporary folder: ``{"x": float32[64], "label": int64}`` (--records), and
``{"x": uint8[256 KiB], "y": int64}`` (--big). Every row is shuffled (``shuffle_seed=0``) and
iterated eagerly in Python (``for _ in ds``), its figure the best epoch of --rounds rounds; the
rows of a round run one after the other, in one order in odd rounds and the reverse in even
ones, after one untimed epoch of each (worker processes start, tf.data traces), and the ratio's
range over the rounds is printed beside the best.

Rows (baseline in the same run):

- ``make_tf_dataset(stream(batch_size=256))`` against tf.data's in-memory
  ``from_tensor_slices(...).batch(256)`` over the same arrays; the same face over a stream with
  ``num_workers=2, worker_type="process"``; and, for the in-process ceiling, the stream alone
  and the face's tf.data machinery fed ready blocks (no reading);
- ``make_tf_dataset(stream())`` record by record against in-memory ``from_tensor_slices``
  element by element (the first 20,000 records, as bench_frameworks.py);
- ``make_dataloader`` over 256 KiB records in batches of 32: ``num_workers=2`` (its default
  ``persistent_workers=True``) and ``num_workers=2, persistent_workers=False`` against
  ``num_workers=0``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import smoke, time_once, warm, write_json

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH = 256
RECORDS_ROW = smoke(20_000, 500)
BIG_BYTES = 256 << 10
BIG_BATCH = 32


def build(folder: str, records: int, big: int) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    storage = ydl.LocalStorage(folder)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(records, 64)).astype(np.float32)
    label = rng.integers(0, 10, records).astype(np.int64)
    small = ydl.cache_dataset(
        ({"x": x[i], "label": label[i]} for i in range(records)), "small", "v1", storage,
        progress=False,
    )  # fmt: skip
    blobs = (
        {"x": rng.integers(0, 255, BIG_BYTES, dtype=np.uint8), "y": np.int64(i)} for i in range(big)
    )
    large = ydl.cache_dataset(blobs, "big", "v1", storage, progress=False)
    warm(folder)
    return small, large, x, label


def epoch_time(make: Callable[[], Any], expected: int) -> float:
    """Seconds to make the iterable and iterate it once, counting ``expected`` items."""
    took, count = time_once(lambda: sum(1 for _ in make()))
    assert count == expected, (count, expected)
    return took


def tf_rows(small: Any, x: np.ndarray, label: np.ndarray) -> dict[str, tuple[Callable, int]]:
    import tensorflow as tf

    from yogadl_plus.adapters.tensorflow import _batch_groups

    n = len(label)
    batches = -(-n // BATCH)
    face = ydl.tensorflow.make_tf_dataset
    processes = small.stream(
        shuffle=True, shuffle_seed=0, batch_size=BATCH, num_workers=2, worker_type="process"
    )
    ready = list(_batch_groups(small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), dict))
    signature = {
        "x": tf.TensorSpec((None, None, 64), tf.float32),
        "label": tf.TensorSpec((None, None), tf.int64),
    }

    def machinery() -> Any:  # the face's tf.data part, fed blocks already read
        dataset = tf.data.Dataset.from_generator(lambda: iter(ready), output_signature=signature)
        return dataset.unbatch().prefetch(tf.data.AUTOTUNE)

    def both_at_once() -> Any:  # the two halves side by side, in two threads of one process
        return _side_by_side(
            lambda: small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), machinery
        )

    xs, labels = x[:RECORDS_ROW], label[:RECORDS_ROW]
    return {
        "tf in memory, batch 256": (
            lambda: tf.data.Dataset.from_tensor_slices({"x": x, "label": label}).batch(BATCH),
            batches,
        ),
        "face, batch 256": (
            lambda: face(small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)),
            batches,
        ),
        "face, batch 256, 2 worker processes": (lambda: face(processes), batches),
        "stream alone, batch 256": (
            lambda: small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH),
            batches,
        ),
        "face's tf.data part alone, batch 256": (machinery, batches),
        "both halves at once, in two threads": (both_at_once, batches),
        "tf in memory, records": (
            lambda: tf.data.Dataset.from_tensor_slices({"x": xs, "label": labels}),
            RECORDS_ROW,
        ),
        "face, records": (
            lambda: face(small.stream(shuffle=True, shuffle_seed=0)).take(RECORDS_ROW),
            RECORDS_ROW,
        ),
    }


def _side_by_side(stream: Callable[[], Any], dataset: Callable[[], Any]) -> Any:
    """The items of ``dataset()``, iterated while another thread iterates ``stream()`` to its
    end: the two halves of the face at once, as the face runs them, but with nothing passed
    between them. If they could overlap, this would take the longer of the two alone; if they
    take turns (Python's one interpreter lock), their sum."""
    import threading

    reader = threading.Thread(target=lambda: [None for _ in stream()])
    reader.start()
    try:
        yield from dataset()
    finally:
        reader.join()


def torch_rows(large: Any) -> dict[str, tuple[Callable, int]]:
    batches = -(-len(large) // BIG_BATCH)
    loaders = {
        name: ydl.torch.make_dataloader(
            large.stream(shuffle=True, shuffle_seed=0, batch_size=BIG_BATCH), **kwargs
        )
        for name, kwargs in (
            ("torch 256 KiB, batch 32, 0 workers", {}),
            ("torch 256 KiB, batch 32, 2 workers", {"num_workers": 2}),
            (
                "torch 256 KiB, batch 32, 2 workers not persistent",
                {"num_workers": 2, "persistent_workers": False},
            ),
        )
    }
    return {name: (lambda loader=loader: loader, batches) for name, loader in loaders.items()}


PAIRS = [  # (row, baseline, target)
    ("face, batch 256", "tf in memory, batch 256", ">= 0.8x"),
    ("face, batch 256, 2 worker processes", "tf in memory, batch 256", ">= 0.8x"),
    ("stream alone, batch 256", "tf in memory, batch 256", ""),
    ("face's tf.data part alone, batch 256", "tf in memory, batch 256", ""),
    ("both halves at once, in two threads", "tf in memory, batch 256", ""),
    ("face, records", "tf in memory, records", ">= 0.9x"),
    ("torch 256 KiB, batch 32, 2 workers", "torch 256 KiB, batch 32, 0 workers", ">= 1.0x"),
    (
        "torch 256 KiB, batch 32, 2 workers not persistent",
        "torch 256 KiB, batch 32, 0 workers",
        "",
    ),
]


def _overlap(times: dict[str, list[float]]) -> None:
    """Whether the face's two halves can run at once in one process: the time of both side by
    side against the longer of the two alone (they overlap) and their sum (they take turns)."""
    stream = min(times["stream alone, batch 256"])
    part = min(times["face's tf.data part alone, batch 256"])
    both = min(times["both halves at once, in two threads"])
    print(
        f"the two halves: {stream:.3f} s and {part:.3f} s alone; side by side {both:.3f} s, "
        f"against {max(stream, part):.3f} s if they overlapped and {stream + part:.3f} s if they "
        f"take turns: {(both - max(stream, part)) / min(stream, part):.0%} of the shorter is not "
        "overlapped. The face in one process cannot beat the side-by-side time; its bound "
        f"against tf.data in memory is {min(times['tf in memory, batch 256']) / both:.2f}x.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=smoke(100_000, 1_000))
    parser.add_argument("--big", type=int, default=smoke(2_000, 64))
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="ydl-faces-")
    try:
        small, large, x, label = build(folder, args.records, args.big)
        rows = {**tf_rows(small, x, label), **torch_rows(large)}
        times: dict[str, list[float]] = {name: [] for name in rows}
        for make, expected in rows.values():  # untimed: workers start, tf traces
            epoch_time(make, expected)
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(reversed(rows))
            for name in order:
                make, expected = rows[name]
                times[name].append(epoch_time(make, expected))
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} CPUs, best epoch of {args.rounds} rounds, load {load:.2f}\n")
    _overlap(times)
    print("| row | items/s (best) | baseline | ratio (best) | ratio per round | target |")
    print("| --- | ---: | --- | ---: | ---: | --- |")
    report = []
    for name, base, target in PAIRS:
        best, base_best = min(times[name]), min(times[base])
        per_round = [b / t for t, b in zip(times[name], times[base])]
        rate = rows[name][1] / best
        print(
            f"| {name} | {rate:,.0f} | {base} | {base_best / best:.2f}x | "
            f"{min(per_round):.2f}-{max(per_round):.2f} | {target} |"
        )
        report.append({"row": name, "baseline": base, "times": times[name], "base": times[base]})
    write_json(args.json, {"rows": report})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
