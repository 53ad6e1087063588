"""A small source built with workers=2 against the same source built serially, in one process
(alternately, a few rounds): a torch map-style Dataset of small images, where starting worker
processes can cost more than the whole build. Prints each round's times, the ratio
workers=2 / serial, and how the parallel build ran (the build's log line).

    python -m bench.bench_small_build                    # 200 images of 32x32x3
    python -m bench.bench_small_build --pool             # the worker processes, however small
    python -m bench.bench_small_build --items 1000 --slow-ms 2   # a source workers pay off on
    python -m bench.bench_small_build --tree /path/to/other/tree  # another checkout
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time

import numpy as np
import torch.utils.data as tud

import yogadl_plus as ydl
from bench.harness import rerun_in_tree, smoke, time_once


class Images(tud.Dataset):
    """``items`` images of 32x32x3 uint8 with a label; each takes ``slow_ms`` more to make."""

    def __init__(self, items: int, slow_ms: float) -> None:
        self.items, self.slow_ms = items, slow_ms

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int) -> dict[str, object]:
        if self.slow_ms:
            time.sleep(self.slow_ms / 1000)
        image = np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        return {"image": image, "label": i % 10}


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "yogadl_plus.building.pool":
            self.lines.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=smoke(200, 50))
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=smoke(3, 1))
    parser.add_argument(
        "--pool", action="store_true", help="never build serially despite workers= (the pool)"
    )
    parser.add_argument("--tree", help="measure this checkout's yogadl_plus (default: this one)")
    args = parser.parse_args()
    if args.tree:
        again = ["--items", str(args.items), "--slow-ms", str(args.slow_ms)]
        again += ["--rounds", str(args.rounds), *(["--pool"] if args.pool else [])]
        rerun_in_tree("bench_small_build", args.tree, again)
    if args.pool:
        try:
            from yogadl_plus.building import starts
        except ImportError:  # a tree from before: always the pool
            pass
        else:
            starts.SERIAL_UNDER_SECONDS = 0.0
    said = _Said()
    logger = logging.getLogger("yogadl_plus")
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-small-build-") as root:
        storage = ydl.LocalStorage(root)
        for r in range(args.rounds):
            times = {}
            for name, workers in (("serial", None), ("workers=2", 2)):
                source = Images(args.items, args.slow_ms)
                version = f"{name.replace('=', '')}-{r}"
                times[name], _ = time_once(
                    lambda source=source, version=version, workers=workers: ydl.cache_dataset(
                        source, "images", version, storage, workers=workers
                    )
                )
            ratios.append(times["workers=2"] / times["serial"])
            print(
                f"round {r}: serial {times['serial']:.3f} s, workers=2 {times['workers=2']:.3f} s,"
                f" ratio {ratios[-1]:.2f}",
                flush=True,
            )
    print(f"median ratio workers=2 / serial: {statistics.median(ratios):.2f}")
    for line in dict.fromkeys(said.lines):
        print("  " + line)


if __name__ == "__main__":
    main()
