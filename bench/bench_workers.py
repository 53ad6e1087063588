"""Worker benchmark: what worker processes add, on big records, small records and a JPEG-decode
transform, for ``ydl.torch.make_dataloader`` and for a stream's own process workers.

    python -m bench.bench_workers [--records 20000] [--small-records 1000000]
                                  [--jpeg-records 4000] [--rounds 3] [--epochs 2]
                                  [--against CHECKOUT]
                                  [--only big,small,jpeg] [--json out.json]

Data (built once per run in a temporary folder, page cache warm before timing):

- big: ``{"x": uint8[96 KiB], "y": int64}``, --records of them, batches of 256, shuffled;
- small: ``{"x": float32[64], "label": int64}`` (264 bytes), --small-records, batches of 256;
- jpeg: ``{"jpeg": bytes, "label": int64}``, 256x256 RGB JPEGs (quality 90), batches of 64, a
  ``transform=`` decoding each with Pillow to uint8[256, 256, 3].

Rows: ``make_dataloader(stream, num_workers=0 | 2, persistent_workers=True)`` and
``ref.stream(..., num_workers=0 | 2, worker_type="process")``. A row's figure is the best of
--epochs whole epochs (2 by default), after one untimed epoch (workers started, page cache
warm); the consumer takes each batch and drops it. Every figure is a ratio against
num_workers=0 measured in the same round. Each round runs in a fresh process; with
``--against CHECKOUT`` every round runs that checkout too (rounds alternate: it, then this
one), so before/after comes from one session. The table gives the range over rounds.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from bench.harness import (
    ROOT,
    SMOKE,
    alternate,
    call_in_tree,
    smoke,
    smoke_tree,
    time_once,
    write_json,
)

BIG_BYTES = 96 << 10
JPEG_SIDE = 256
CASES = ("big", "small", "jpeg")
ROWS = (
    ("loader", 0, "make_dataloader, num_workers=0"),
    ("loader", 2, "make_dataloader, num_workers=2"),
    ("stream", 0, "stream, num_workers=0"),
    ("stream", 2, "stream, 2 process workers"),
)


# --- data ---


def big_records(n: int) -> Iterable[dict[str, Any]]:
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, BIG_BYTES, dtype=np.uint8)
    for i in range(n):
        yield {"x": np.roll(block, i), "y": np.int64(i)}


def small_records(n: int) -> Iterable[dict[str, Any]]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 64), dtype=np.float32)
    for i in range(n):
        yield {"x": x[i], "label": np.int64(i)}


def jpeg_records(n: int) -> Iterable[dict[str, Any]]:
    from PIL import Image

    rng = np.random.default_rng(2)
    # Smooth pictures with some noise: JPEG's usual diet, not incompressible static.
    ramp = np.linspace(0, 255, JPEG_SIDE, dtype=np.float32)
    base = np.stack([*np.meshgrid(ramp, ramp[::-1]), np.outer(ramp, ramp) / 255], axis=-1)
    encoded = []
    for k in range(16):
        noisy = base + rng.normal(0, 12, base.shape) + 8 * k
        out = io.BytesIO()
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
        encoded.append(out.getvalue())
    for i in range(n):
        yield {"jpeg": encoded[i % len(encoded)], "label": np.int64(i)}


def decode_jpeg(record: dict[str, Any]) -> dict[str, Any]:
    from PIL import Image

    with Image.open(io.BytesIO(record["jpeg"])) as image:
        pixels = np.asarray(image.convert("RGB"))
    return {"image": pixels, "label": record["label"]}


MAKERS: dict[str, Callable[[int], Iterable[dict[str, Any]]]] = {
    "big": big_records,
    "small": small_records,
    "jpeg": jpeg_records,
}
BATCH = {"big": 256, "small": 256, "jpeg": 64}


# --- one round, in a fresh process that imports yogadl_plus from the checkout under test ---


def drain(items: Iterable[Any]) -> int:
    count = 0
    for batch in items:
        count += len(batch["label" if "label" in batch else "y"])
    return count


def epoch_seconds(make: Callable[[], Any], expected: int, epochs: int) -> float:
    """The shortest of ``epochs`` timed epochs, after an untimed one."""
    source = make()
    times = []
    try:
        assert drain(source) == expected  # warm-up epoch: workers started, pages cached
        for _ in range(epochs):
            seconds, got = time_once(functools.partial(drain, source))
            times.append(seconds)
            assert got == expected, (got, expected)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
        del source
    return min(times)


def source(ref: Any, kind: str, workers: int, batch: int, transform: Any) -> Any:
    """One of the ROWS: a resumable DataLoader, or a stream with process workers."""
    import yogadl_plus as ydl

    if kind == "loader":
        stream = ref.stream(shuffle=True, shuffle_seed=0, batch_size=batch, transform=transform)
        return ydl.torch.make_dataloader(
            stream, num_workers=workers, persistent_workers=workers > 0
        )
    return ref.stream(
        shuffle=True,
        shuffle_seed=0,
        batch_size=batch,
        transform=transform,
        num_workers=workers,
        worker_type="process",
    )


def run_round(data: str, sizes: dict[str, int], epochs: int = 1) -> dict[str, dict[str, float]]:
    import yogadl_plus as ydl

    storage = ydl.LocalStorage(os.path.join(data, "store"))
    out: dict[str, dict[str, float]] = {}
    for case, n in sizes.items():
        ref = ydl.cache_dataset(MAKERS[case](n), case, f"n{n}", storage, progress=False)
        transform = decode_jpeg if case == "jpeg" else None
        rates = {}
        for kind, workers, label in ROWS:
            make = functools.partial(source, ref, kind, workers, BATCH[case], transform)
            rates[label] = n / epoch_seconds(make, n, epochs)
        out[case] = rates
        ref.close()
    return out


def build_all(data: str, sizes: dict[str, int]) -> None:
    import yogadl_plus as ydl

    storage = ydl.LocalStorage(os.path.join(data, "store"))
    for case, n in sizes.items():
        ydl.cache_dataset(MAKERS[case](n), case, f"n{n}", storage, progress=False).close()


# --- the table ---


def span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    if len(values) == 1 or f"{low:{fmt}}" == f"{high:{fmt}}":
        return f"{low:{fmt}}"
    return f"{low:{fmt}}-{high:{fmt}}"


def table(rounds: dict[str, list[dict[str, Any]]], sizes: dict[str, int]) -> str:
    sides = list(rounds)
    both = len(sides) == 2
    lines = [
        "| data | row | "
        + " | ".join(f"{s}: records/s | {s}: vs num_workers=0" for s in sides)
        + (" | after / before |" if both else " |"),
        "| --- | --- | "
        + " | ".join("---: | ---:" for _ in sides)
        + (" | ---: |" if both else " |"),
    ]
    for case in sizes:
        for kind, _, label in ROWS:
            base_label = next(lb for k, w, lb in ROWS if k == kind and w == 0)
            cells = []
            for side in sides:
                rates = [r[case][label] for r in rounds[side]]
                ratios = [r[case][label] / r[case][base_label] for r in rounds[side]]
                cells.append(f"{span(rates, ',.0f')} | {span(ratios, '.2f')}x")
            line = f"| {case} | {label} | " + " | ".join(cells)
            if both:
                a, b = sides
                cross = [r2[case][label] / r1[case][label] for r1, r2 in zip(rounds[a], rounds[b])]
                line += f" | {span(cross, '.2f')}x"
            lines.append(line + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records", type=int, default=smoke(20_000, 300), help="big records (96 KiB)"
    )
    parser.add_argument(
        "--small-records", type=int, default=smoke(1_000_000, 2_000), help="264-byte records"
    )
    parser.add_argument(
        "--jpeg-records", type=int, default=smoke(4_000, 128), help="records with a JPEG"
    )
    parser.add_argument("--only", default=",".join(CASES), help="cases: big,small,jpeg")
    parser.add_argument(
        "--rounds", type=int, default=smoke(3, 1), help="rounds, each a fresh process"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=smoke(2, 1),
        help="timed epochs per row and round (the best counts)",
    )
    parser.add_argument(
        "--against",
        help="a checkout to run in every round too (the 'before'; smoke mode: a copy of this one)",
    )
    parser.add_argument("--tmp", default=None, help="parent of the temporary data folder")
    parser.add_argument(
        "--data", help="keep the caches in this folder (and reuse them) instead of a temporary one"
    )
    parser.add_argument("--json", help="also write every round's figures here")
    args = parser.parse_args(argv)
    wanted = [c for c in args.only.split(",") if c]
    unknown = set(wanted) - set(CASES)
    if unknown:
        parser.error(f"--only: unknown cases {sorted(unknown)}; choose from {CASES}")
    counts = {"big": args.records, "small": args.small_records, "jpeg": args.jpeg_records}
    sizes = {case: counts[case] for case in wanted}
    if args.against is None and SMOKE:
        args.against = smoke_tree()
    sides = (
        {"this": ROOT}
        if not args.against
        else {
            "before": os.path.abspath(args.against),
            "after": ROOT,
        }
    )
    data_root = args.data or tempfile.mkdtemp(prefix="ydl-bench-workers-", dir=args.tmp)
    try:
        datas = {}
        for side, library in sides.items():
            # Each checkout builds (and reads) its own cache: formats may differ between them.
            datas[side] = os.path.join(data_root, side)
            print(f"building {sizes} with {library}", file=sys.stderr)
            call_in_tree(library, "bench_workers", "build_all", datas[side], sizes)
        rounds = alternate(
            sides,
            args.rounds,
            lambda side, library: call_in_tree(
                library, "bench_workers", "run_round", datas[side], sizes, args.epochs
            ),
        )
    finally:
        if not args.data:
            shutil.rmtree(data_root, ignore_errors=True)
    print(
        f"\n{os.cpu_count()} CPUs, {args.rounds} rounds of best-of-{args.epochs} epochs, load "
        f"average at the end {os.getloadavg()[0]:.2f}; sizes {sizes}; ranges are min-max over "
        "rounds\n"
    )
    print(table(rounds, sizes))
    write_json(args.json, {"trees": sides, "sizes": sizes, "rounds": rounds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
