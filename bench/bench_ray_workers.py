"""Ray workers against thread workers, with an I/O-bound transform.

    python -m bench.bench_ray_workers [--batches 200] [--batch-size 32] [--rounds 3]
                                      [--actors 2,4,8] [--tmp DIR]

A version of ``--batches * --batch-size`` records ``{"i": int64, "x": float32[64]}`` is read in
shuffled batches with a transform that sleeps 20 ms per batch (``20 ms / batch_size`` per
record): a stand-in for a transform that waits on I/O (a remote decoder, a tokenizer service),
which two cores can show. Rows: one thread worker (the baseline), and ``worker_type="ray"`` with
each count of actors on a local Ray cluster of 2 CPUs on 127.0.0.1 (``ray.init(address=
"local", num_cpus=2)``). Each stream reads two epochs: the first starts its workers (a Ray
actor is a new process that imports yogadl_plus and opens the version), the second is the
steady state of a run's later epochs. A row's figures are its best over --rounds rounds; every
epoch is checked to hand out the baseline's batches. The target: 8 actors >= 4x one thread
worker, in the steady state.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.harness import ROOT, smoke, target_cell

SLEEP_PER_BATCH = 0.020
TARGET = 4.0


class Sleepy:
    """The transform: waits ``seconds`` per record, as if on I/O, and hands the record on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.seconds)
        return record


def epochs(
    ref: ydl.DataRef, batch_size: int, workers: int, kind: str
) -> tuple[list[float], list[list[int]]]:
    """Seconds of a stream's first epoch (its workers started in it) and of its second, and the
    first record of each batch of both."""
    transform = Sleepy(SLEEP_PER_BATCH / batch_size)
    began = time.perf_counter()
    stream = ref.stream(
        shuffle=True,
        shuffle_seed=0,
        batch_size=batch_size,
        transform=transform,
        num_workers=workers,
        worker_type=kind,
    )
    seconds, firsts = [], []
    for _ in range(2):
        firsts.append([int(batch["i"][0]) for batch in stream])
        seconds.append(time.perf_counter() - began)
        began = time.perf_counter()
    stream.close()
    return seconds, firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=smoke(200, 10))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument("--actors", default=smoke("2,4,8", "2"))
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args(argv)
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level="warning",
        # The actors import this checkout's yogadl_plus (and bench, for the transform).
        runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
    )
    root = tempfile.mkdtemp(prefix="bench-ray-", dir=args.tmp)
    try:
        n = args.batches * args.batch_size
        rng = np.random.default_rng(0)
        columns = {"i": np.arange(n), "x": rng.standard_normal((n, 64)).astype(np.float32)}
        ref = ydl.cache_dataset(columns, "ray", "v1", ydl.LocalStorage(root), progress=False)
        rows = [("1 thread worker", 1, "thread")]
        rows += [(f"{k} Ray actors", k, "ray") for k in map(int, args.actors.split(","))]
        best: dict[str, list[float]] = {}
        expected: list[list[int]] | None = None
        for round_ in range(args.rounds):
            for label, workers, kind in rows if round_ % 2 == 0 else rows[::-1]:
                seconds, firsts = epochs(ref, args.batch_size, workers, kind)
                expected = expected or firsts
                assert firsts == expected, f"{label}: not the thread worker's batches"
                kept = best.get(label, [float("inf")] * 2)
                best[label] = [min(a, b) for a, b in zip(kept, seconds)]
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        first, steady = (best[rows[0][0]][k] for k in (0, 1))
        print(
            f"{args.batches} batches of {args.batch_size}, {SLEEP_PER_BATCH * 1e3:.0f} ms of "
            "transform per batch; best of each row over the rounds\n"
        )
        print(
            "| workers | first epoch (s) | x 1 thread | next epoch (s) | batches/s | x 1 thread "
            "| target |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for label, workers, _ in rows:
            start, later = best[label]
            ratio = steady / later
            target = target_cell(f">= {TARGET:g}x", ratio >= TARGET) if workers == 8 else ""
            print(
                f"| {label} | {start:.2f} | {first / start:.2f}x | {later:.2f} | "
                f"{args.batches / later:.1f} | {ratio:.2f}x | {target} |"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
