"""tf.data record streams (issue 14): ``make_tf_dataset`` over a record stream, read in blocks
and unbatched in tf.data, against yogadl 0.1.4, in-memory tf.data and the code before the change,
in one run.

    python bench/bench_tf_records.py [--before CHECKOUT] [--n 100000] [--quick] [--json out.json]

Data: N records {"x": float32[64], "label": int64} (the foundation benchmark's, same seed),
cached once with yogadl_plus; every checkout reads that cache (same on-disk format). Each group
of rows runs in a fresh process: this checkout's yogadl_plus ("after"), ``--before``'s ("before",
a checkout of the code before the change, e.g. ``git worktree add --detach /tmp/before14
f9f9f41``), in-memory tf.data, and yogadl 0.1.4 in its side venv. Every file is read once (page
cache warm) before it is timed. A run includes making the stream and the dataset. Eager rows
iterate in Python (``for _ in ds``), graph rows with ``ds.reduce``; each figure is the BEST
(minimum time) of ``--repeats`` runs (3 by default; at least 5 for the eager record rows, 10
for the batched rows). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import target_cell, warm  # bench/ is on sys.path when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

N_DEFAULT = 100_000
QUICK_N = 20_000
BATCH = 256
# Eager record rows: tf.data's from_generator runs a one-record-per-call epoch at one of two
# speeds here (the slow one exactly 819 us a record), so 5 runs give every side the same chance.
RECORDS_REPEATS = 5
BATCH_REPEATS = 10  # batched rows: a run is 0.1-0.4 s, at the mercy of one scheduler hiccup
SIDE_TIMEOUT_S = 3600
YOGADL_PYTHON = os.path.join(ROOT, ".baselines", "yogadl", "bin", "python")
VENV_HELP = "create it with: bash bench/baselines/venvs.sh .baselines  (from the repo root)"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")

# row -> (what it reads, which process measures it); the order of the table.
ROWS: dict[str, str] = {
    "ydl_records": "make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=0)) (default)",
    "ydl_records_per_record": "the same, read_ahead=False",
    "before_records": "old code: the same (default: one record per Python call)",
    "before_records_read_ahead256": "old code: the same, read_ahead=256",
    "yogadl014_records": "yogadl 0.1.4: yogadl.tensorflow.make_tf_dataset(stream(shuffle=True))",
    "tf_inmem_records": "from_tensor_slices({x, label}), per element",
    "ydl_batch256": "make_tf_dataset(ref.stream(batch_size=256))",
    "before_batch256": "old code: the same",
    "tf_inmem_batch256": "from_tensor_slices(...).batch(256)",
    "ydl_shuffle_batch256": "make_tf_dataset(ref.stream(shuffle=True, batch_size=256))",
    "before_shuffle_batch256": "old code: the same",
    "tf_inmem_shuffle_batch256": "from_tensor_slices(...).shuffle(N, seed=0).batch(256)",
}

# (row, baseline row) -> (target text, check(ratio) -> bool); "" for information.
RATIOS: list[tuple[str, str, str, Callable[[float], bool] | None]] = [
    ("ydl_records eager", "yogadl014_records eager", ">= 3.5x", lambda r: r >= 3.5),
    ("ydl_records graph", "yogadl014_records graph", ">= 5x", lambda r: r >= 5.0),
    ("ydl_batch256 eager", "tf_inmem_batch256 eager", ">= 0.5x", lambda r: r >= 0.5),
    ("ydl_shuffle_batch256 eager", "tf_inmem_shuffle_batch256 eager", "", None),
    ("ydl_records eager", "tf_inmem_records eager", "", None),
    ("ydl_records graph", "tf_inmem_records graph", "", None),
    ("ydl_records_per_record eager", "yogadl014_records eager", "", None),
    ("ydl_records_per_record graph", "yogadl014_records graph", "", None),
    # after / before
    ("ydl_records eager", "before_records eager", "", None),
    ("ydl_records graph", "before_records graph", "", None),
    ("ydl_records eager", "before_records_read_ahead256 eager", "", None),
    ("ydl_records graph", "before_records_read_ahead256 graph", "", None),
    ("ydl_records_per_record eager", "before_records eager", "", None),
    ("ydl_records_per_record graph", "before_records graph", "", None),
    ("ydl_batch256 eager", "before_batch256 eager", "", None),
    ("ydl_shuffle_batch256 eager", "before_shuffle_batch256 eager", "", None),
]


# --------------------------------------------------------------------------- one process


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Times one group's rows in this (fresh) process; {"row mode": (best s, all s)}.

    Groups: "after" and "before" (the yogadl_plus that ``import yogadl_plus`` finds, via
    PYTHONPATH), "tf" (in-memory tf.data)."""
    import numpy as np

    group, n, repeats = spec["group"], spec["n"], spec["repeats"]
    if group in ("after", "before"):
        import yogadl_plus as ydl  # before bench_foundation, which puts this checkout first

        where = os.path.dirname(os.path.dirname(os.path.abspath(ydl.__file__)))
        assert os.path.samefile(where, spec["code"]), (where, spec["code"])
    import tensorflow as tf
    from bench_foundation import best_of

    n_batches = -(-n // BATCH)
    out: dict[str, Any] = {}

    def eager(make: Callable[[], Any], expected: int) -> Callable[[], None]:
        def run() -> None:
            count = 0
            for _ in make():  # eager, element by element, in Python
                count += 1
            assert count == expected, (count, expected)

        return run

    def graph(make: Callable[[], Any], expected: int) -> Callable[[], None]:
        def run() -> None:
            count = int(make().reduce(np.int64(0), lambda c, _: c + 1))  # tf.data's own loop
            assert count == expected, (count, expected)

        return run

    def time_records(name: str, make: Callable[[], Any]) -> None:
        out[f"{name} eager"] = best_of(eager(make, n), max(repeats, RECORDS_REPEATS))
        out[f"{name} graph"] = best_of(graph(make, n), repeats)

    def time_batches(name: str, make: Callable[[], Any]) -> None:
        out[f"{name} eager"] = best_of(eager(make, n_batches), max(repeats, BATCH_REPEATS))

    if group == "tf":
        x, label = np.load(spec["x"]), np.load(spec["label"])

        def inmem_records() -> Any:
            return tf.data.Dataset.from_tensor_slices({"x": x, "label": label})

        def inmem(shuffle: bool) -> Callable[[], Any]:
            def make() -> Any:
                ds = tf.data.Dataset.from_tensor_slices({"x": x, "label": label})
                if shuffle:
                    ds = ds.shuffle(n, seed=0)
                return ds.batch(BATCH)

            return make

        time_records("tf_inmem_records", inmem_records)
        time_batches("tf_inmem_batch256", inmem(False))
        time_batches("tf_inmem_shuffle_batch256", inmem(True))
        return out

    storage = ydl.LocalStorage(spec["store"])
    ref = storage.fetch("bench", "v1")
    assert len(ref) == n, (len(ref), n)
    make_tf_dataset = ydl.tensorflow.make_tf_dataset

    def records(**kwargs: Any) -> Callable[[], Any]:
        return lambda: make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=0), **kwargs)

    def batches(shuffle: bool) -> Callable[[], Any]:
        if shuffle:
            return lambda: make_tf_dataset(
                ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)
            )
        return lambda: make_tf_dataset(ref.stream(batch_size=BATCH))

    # Untimed check: one shuffled epoch of records and one of batches hold the cache's records.
    for dataset in (records()().batch(4096), batches(True)()):
        label_sum, x_sum, count = 0, 0.0, 0
        for item in dataset:
            assert item["x"].dtype == tf.float32 and item["label"].dtype == tf.int64
            count += int(item["label"].shape[0])
            label_sum += int(tf.reduce_sum(item["label"]))
            x_sum += float(tf.reduce_sum(tf.cast(item["x"], tf.float64)))
        assert count == n and label_sum == spec["label_sum"], (count, label_sum)
        assert abs(x_sum - spec["x_sum"]) < 1e-3 + 1e-6 * abs(spec["x_sum"]), x_sum

    prefix = "ydl" if group == "after" else "before"
    time_records(f"{prefix}_records", records())
    if group == "after":
        time_records("ydl_records_per_record", records(read_ahead=False))
    else:
        time_records("before_records_read_ahead256", records(read_ahead=BATCH))
    time_batches(f"{prefix}_batch256", batches(False))
    time_batches(f"{prefix}_shuffle_batch256", batches(True))
    ref.close()
    return out


def run_worker(spec: dict[str, Any], pythonpath: str | None) -> dict[str, Any]:
    """``worker(spec)`` in a fresh process (this Python), yogadl_plus from ``pythonpath``."""
    env = dict(ENV)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        cwd=spec["tmp"],
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {spec['group']} rows failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_yogadl(python: str, xp: str, lp: str, tmp: str, repeats: int) -> dict[str, Any] | str:
    """yogadl 0.1.4's tf.data path (``_yogadl_tf_baseline.py``) in its side venv."""
    if not os.path.exists(python):
        return f"side venv missing ({python}); {VENV_HELP}"
    cmd = [
        python, os.path.join(HERE, "_yogadl_tf_baseline.py"), "--x", xp, "--label", lp,
        "--workdir", os.path.join(tmp, "yogadl"), "--repeats", str(repeats),
        "--records-repeats", str(max(repeats, RECORDS_REPEATS)),
    ]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=SIDE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"yogadl 0.1.4 timed out after {SIDE_TIMEOUT_S} s"
    if done.returncode != 0:
        return f"yogadl 0.1.4 failed (rc {done.returncode}): {done.stderr.strip()[-800:]}"
    res = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "yogadl014_records eager": (res["best_s"], res["times_s"]),
        "yogadl014_records graph": (res["reduce_best_s"], res["reduce_times_s"]),
    }


# --------------------------------------------------------------------------- table


def tables(n: int, results: dict[str, Any]) -> str:
    def rate(key: str) -> float | None:  # records/s, batched rows included
        return n / results[key][0] if key in results else None

    def cell(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.0f}"

    lines = [
        "| row | what | eager records/s | graph records/s | eager runs | graph runs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row, what in ROWS.items():
        e, g = f"{row} eager", f"{row} graph"
        runs_e = len(results[e][1]) if e in results else ""
        runs_g = len(results[g][1]) if g in results else ""
        graph_cell = cell(rate(g)) if "records" in row else ""
        lines.append(f"| {row} | {what} | {cell(rate(e))} | {graph_cell} | {runs_e} | {runs_g} |")
    lines += [
        "",
        "| comparison | ratio | target |",
        "|---|---:|---|",
    ]
    for metric, base, target, check in RATIOS:
        a, b = rate(metric), rate(base)
        ratio = None if a is None or b is None else a / b
        met = None if ratio is None or check is None else check(ratio)
        text = "n/a" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"| {metric} / {base} | {text} | {target_cell(target, met)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=None, help=f"records (default {N_DEFAULT:,})")
    parser.add_argument("--quick", action="store_true", help=f"N = {QUICK_N:,}")
    parser.add_argument("--before", default=None, help="checkout of the code before the change")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    parser.add_argument("--no-yogadl", action="store_true", help="skip yogadl 0.1.4")
    parser.add_argument("--yogadl-python", default=YOGADL_PYTHON)
    parser.add_argument("--json", default=None, help="also write every timing here")
    parser.add_argument("--tmp", default=None, help="parent folder for temp files (default /tmp)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0

    sys.path.insert(0, ROOT)
    import numpy as np
    from bench_foundation import machine, make_data

    import yogadl_plus as ydl

    n = args.n or (QUICK_N if args.quick else N_DEFAULT)
    info = machine()
    print(
        f"# tf.data record streams: {info['cpus']} CPUs, {info['cpu_model']}, Python "
        f"{info['python']}, N = {n:,}, load average at start "
        f"{info['load_average_at_start'][0]:.2f}",
        flush=True,
    )
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ydl_bench_tf_records_", dir=args.tmp)
    results: dict[str, Any] = {}
    sections: dict[str, float] = {}
    notes: list[str] = []
    try:
        x, label = make_data(n)
        xp, lp = os.path.join(tmp, "x.npy"), os.path.join(tmp, "label.npy")
        np.save(xp, x)
        np.save(lp, label)
        store = os.path.join(tmp, "ydl_store")
        storage = ydl.LocalStorage(store)
        xs, labels = list(x), list(label)
        ref = ydl.cache_dataset(
            lambda: ({"x": a, "label": b} for a, b in zip(xs, labels)),
            "bench", "v1", storage, progress=False,
        )  # fmt: skip
        ref.close()
        warm(storage.path("bench", "v1"))
        spec = {
            "n": n,
            "repeats": args.repeats,
            "store": store,
            "x": xp,
            "label": lp,
            "tmp": tmp,
            "label_sum": int(label.sum()),
            "x_sum": float(x.astype(np.float64).sum()),
        }
        groups: list[tuple[str, str | None]] = [("after", ROOT), ("tf", None)]
        if args.before:
            groups.insert(1, ("before", os.path.abspath(args.before)))
        else:
            notes.append("before rows: skipped (no --before CHECKOUT)")
        for group, code in groups:
            t0 = time.perf_counter()
            print(f"{group} rows...", file=sys.stderr, flush=True)
            results.update(run_worker({**spec, "group": group, "code": code}, code))
            sections[group] = time.perf_counter() - t0
        if args.no_yogadl:
            notes.append("yogadl 0.1.4: skipped (--no-yogadl)")
        else:
            t0 = time.perf_counter()
            print("yogadl 0.1.4 rows...", file=sys.stderr, flush=True)
            yog = run_yogadl(args.yogadl_python, xp, lp, tmp, args.repeats)
            sections["yogadl014"] = time.perf_counter() - t0
            if isinstance(yog, str):
                notes.append(yog)
            else:
                results.update(yog)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - start
    print(
        f"\n## tf.data record streams (N = {n:,}; {total:.0f} s in all; best of "
        f"{args.repeats}, eager record rows best of {max(args.repeats, RECORDS_REPEATS)}, "
        f"batched rows of {max(args.repeats, BATCH_REPEATS)}; "
        f"load average at end {os.getloadavg()[0]:.2f})\n"
    )
    print(tables(n, results))
    for note in notes:
        print(f"\n{note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "n": n,
                    "before": args.before,
                    "statistic": "best (minimum time) of repeats",
                    "results": results,
                    "section_seconds": sections,
                    "total_seconds": total,
                    "load_average_at_end": os.getloadavg(),
                },
                f,
                indent=1,
            )
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
