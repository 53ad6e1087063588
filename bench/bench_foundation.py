"""Foundation benchmark: yogadl_plus against raw py-lmdb and yogadl 0.1.4, on the same data.

    python bench/bench_foundation.py [--sizes 10000,100000,1000000] [--quick] [--json out.json]

Data: N records {"x": float32[64], "label": int64} (264 bytes each). Every file is read once
(page cache warm) before it is timed; every figure is the BEST (minimum time) of at least
``--repeats`` runs (3 by default; 5 for the time-to-first-record rows), repeated further, up to 20
runs, while less than 0.3 s has been timed (so small N are not one scheduler hiccup from wrong).
See bench/README.md for what each row measures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lmdb
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from _common import target_cell, warm  # noqa: E402  (bench/ is on sys.path when run as a script)

import yogadl_plus as ydl  # noqa: E402

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (10_000, 100_000)
BATCH = 256
RECORD_DTYPE = np.dtype([("x", "<f4", (64,)), ("label", "<i8")])
RECORD_BYTES = RECORD_DTYPE.itemsize  # 264
YOGADL_PYTHON = os.path.join(ROOT, ".baselines", "yogadl", "bin", "python")
YOGADL_HELP = "create it with: bash bench/baselines/venvs.sh .baselines  (from the repo root)"

# (metric, baseline) -> (target text, check(ratio) -> bool)
TARGETS: dict[tuple[str, str], tuple[str, Callable[[float], bool]]] = {
    ("ydl_shuffled_records", "raw_random_get_record"): (">= 0.5x (aim 0.8x)", lambda r: r >= 0.5),
    ("ydl_shuffled_records", "yogadl014_shuffled_records"): (">= 2x", lambda r: r >= 2.0),
    ("ydl_shuffled_batch256", "raw_random_get_batch256"): (">= 0.6x", lambda r: r >= 0.6),
    ("ydl_sequential_batch256", "raw_cursor_scan"): (
        "close to 1x (read as >= 0.8x)",
        lambda r: r >= 0.8,
    ),
    ("ydl_first_record_at_0.9N", "ydl_first_record_at_0"): (
        "<= 1.5x (time ratio; binding at N=1M)",
        lambda r: r <= 1.5,
    ),
    ("ydl_build", "raw_put"): (">= 0.2x", lambda r: r >= 0.2),
}


# --------------------------------------------------------------------------- helpers


# Small N: keep repeating until this much was timed (at most MAX_REPEATS), so that a 10 ms
# figure is not one scheduler hiccup away from wrong. Large N: exactly ``repeats``.
MIN_TOTAL_S = 0.3
MAX_REPEATS = 20


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """Runs ``fn`` at least ``repeats`` times (more while under MIN_TOTAL_S in all, up to
    MAX_REPEATS); returns (best seconds, all seconds)."""
    times: list[float] = []
    while len(times) < repeats or (sum(times) < MIN_TOTAL_S and len(times) < MAX_REPEATS):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), times


def machine() -> dict[str, Any]:
    model = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "load_average_at_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "lmdb": lmdb.__version__,
        "numpy": np.__version__,
        "yogadl_plus": ydl.__version__,
        "git_commit": commit,
        "platform": platform.platform(),
    }


def make_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 64), dtype=np.float32)
    label = rng.integers(0, 1000, n, dtype=np.int64)
    return x, label


# --------------------------------------------------------------------------- raw py-lmdb


def raw_write(path: str, keys: list[bytes], values: list[bytes], multi: bool) -> None:
    """One transaction of N appends into a fresh LMDB file (lmdb defaults: commit fsyncs)."""
    env = lmdb.open(
        path,
        subdir=False,
        map_size=max(64 << 20, 3 * len(values) * (RECORD_BYTES + 16)),
        lock=False,
        meminit=False,
        max_dbs=0,
    )
    with env.begin(write=True) as txn:
        if multi:
            txn.cursor().putmulti(zip(keys, values), append=True)
        else:
            put = txn.put
            for k, v in zip(keys, values):
                put(k, v, append=True)
    env.close()


def bench_raw(n: int, x: np.ndarray, label: np.ndarray, tmp: str, repeats: int) -> dict:
    rec = np.empty(n, RECORD_DTYPE)
    rec["x"] = x
    rec["label"] = label
    blob = rec.tobytes()
    values = [blob[i * RECORD_BYTES : (i + 1) * RECORD_BYTES] for i in range(n)]
    del blob, rec
    key_blob = np.arange(n, dtype=">u4").tobytes()
    keys = [key_blob[4 * i : 4 * i + 4] for i in range(n)]
    out: dict[str, Any] = {}

    counter = iter(range(10**9))

    def put(multi: bool) -> Callable[[], None]:
        def run() -> None:
            path = os.path.join(tmp, f"raw_put_{next(counter)}.mdb")
            raw_write(path, keys, values, multi)

        return run

    for name, multi in (("raw_put", False), ("raw_put_putmulti", True)):
        out[name] = best_of(put(multi), repeats)
        for f in os.listdir(tmp):
            if f.startswith("raw_put_"):
                os.remove(os.path.join(tmp, f))

    path = os.path.join(tmp, "raw.mdb")
    raw_write(path, keys, values, multi=False)
    warm(path)
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, max_dbs=0)
    perm = np.random.default_rng(1).permutation(n)
    pkeys = [keys[i] for i in perm.tolist()]  # key bytes made outside the timing
    frombuffer = np.frombuffer
    f4, i8 = np.dtype("<f4"), np.dtype("<i8")

    def random_get_record() -> None:
        with env.begin(buffers=True) as txn:
            get = txn.get
            for k in pkeys:
                v = get(k)
                frombuffer(v, f4, 64)
                frombuffer(v, i8, 1, 256)

    def random_get_batch() -> None:
        with env.begin(buffers=True) as txn:
            get = txn.get
            for j in range(0, n, BATCH):
                frombuffer(b"".join([get(k) for k in pkeys[j : j + BATCH]]), RECORD_DTYPE)

    def cursor_scan() -> None:
        with env.begin(buffers=True) as txn:
            count = 0
            for v in txn.cursor().iternext(keys=False, values=True):
                frombuffer(v, f4, 64)
                frombuffer(v, i8, 1, 256)
                count += 1
            assert count == n

    # Sanity: the raw file holds the same bytes yogadl_plus will store.
    with env.begin(buffers=True) as txn:
        got = frombuffer(bytes(txn.get(keys[n // 2])), RECORD_DTYPE)[0]
        assert np.array_equal(got["x"], x[n // 2]) and got["label"] == label[n // 2]

    out["raw_random_get_record"] = best_of(random_get_record, repeats)
    out["raw_random_get_batch256"] = best_of(random_get_batch, repeats)
    out["raw_cursor_scan"] = best_of(cursor_scan, repeats)
    env.close()
    os.remove(path)
    return out


# --------------------------------------------------------------------------- yogadl_plus


def bench_ydl(n: int, x: np.ndarray, label: np.ndarray, tmp: str, repeats: int) -> dict:
    storage = ydl.LocalStorage(os.path.join(tmp, "ydl_store"))
    # The numpy rows are made before the timing; the generator only wraps them in dicts (as a
    # user's generator would), so no million live dicts slow every GC pass of the build.
    xs, labels = list(x), list(label)

    def generator_function() -> Any:
        for xi, li in zip(xs, labels):
            yield {"x": xi, "label": li}

    out: dict[str, Any] = {}
    versions = iter(range(10**9))
    built: list[str] = []

    def build() -> None:
        version = f"n{n}-{next(versions)}"
        built.append(version)
        ydl.cache_dataset(generator_function, "bench", version, storage, progress=False)

    out["ydl_build"] = best_of(build, repeats)
    xs.clear()
    labels.clear()
    for version in built[:-1]:
        storage.delete("bench", version)
    version = built[-1]
    gc.collect()

    dataref = storage.fetch("bench", version)
    assert len(dataref) == n
    warm(storage.path("bench", version))
    sample = dataref[n // 2]
    assert np.array_equal(sample["x"], x[n // 2]) and sample["label"] == label[n // 2]

    def epoch(**kwargs: Any) -> Callable[[], None]:
        expected = -(-n // kwargs["batch_size"]) if "batch_size" in kwargs else n

        def run() -> None:
            count = 0
            for _ in dataref.stream(**kwargs):  # stream construction included
                count += 1
            assert count == expected, (count, expected)

        return run

    out["ydl_shuffled_records"] = best_of(epoch(shuffle=True, shuffle_seed=0), repeats)
    out["ydl_shuffled_batch256"] = best_of(
        epoch(shuffle=True, shuffle_seed=0, batch_size=BATCH), repeats
    )
    out["ydl_sequential_batch256"] = best_of(epoch(batch_size=BATCH), repeats)

    for name, k in (("ydl_first_record_at_0", 0), ("ydl_first_record_at_0.9N", int(0.9 * n))):

        def first(k: int = k) -> None:
            next(iter(dataref.stream(shuffle=True, shuffle_seed=0, start_offset=k)))

        first()  # untimed: the same code path once, so both offsets start equally warm
        out[name] = best_of(first, max(repeats, 5))

    order = np.random.default_rng(1).permutation(n).tolist()

    def random_getitem() -> None:
        for i in order:
            dataref[i]

    out["ydl_random_getitem"] = best_of(random_getitem, repeats)
    dataref.close()
    storage.delete("bench", version)
    return out


# --------------------------------------------------------------------------- yogadl 0.1.4


def bench_yogadl(
    n: int, x: np.ndarray, label: np.ndarray, tmp: str, repeats: int, python: str
) -> dict | str:
    """Runs bench/_yogadl_baseline.py in the side venv; returns its JSON or why not."""
    if not os.path.exists(python):
        return f"side venv missing ({python}); {YOGADL_HELP}"
    work = os.path.join(tmp, f"yogadl_{n}")
    os.makedirs(work)
    xp, lp = os.path.join(work, "x.npy"), os.path.join(work, "label.npy")
    np.save(xp, x)
    np.save(lp, label)
    cmd = [
        python,
        os.path.join(HERE, "_yogadl_baseline.py"),
        "--x",
        xp,
        "--label",
        lp,
        "--workdir",
        os.path.join(work, "storage"),
        "--repeats",
        str(repeats),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return "yogadl baseline timed out after 900 s"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        return f"yogadl baseline failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- table


def rows_for(n: int, raw: dict, ydl_: dict, yog: dict | str) -> list[dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}

    def add(metric: str, seconds: float, times: list[float], unit: str = "records/s") -> None:
        if unit == "records/s":
            figures[metric] = {
                "value": n / seconds,
                "unit": unit,
                "seconds": seconds,
                "times_s": times,
            }
        else:
            figures[metric] = {
                "value": seconds * 1e3,
                "unit": "ms",
                "seconds": seconds,
                "times_s": times,
            }

    for name, (best, times) in {**raw, **ydl_}.items():
        add(name, best, times, "ms" if name.startswith("ydl_first_record") else "records/s")
    if isinstance(yog, dict):
        add("yogadl014_shuffled_records", min(yog["shuffled_times_s"]), yog["shuffled_times_s"])
        add("yogadl014_build", yog["build_s"], [yog["build_s"]])
        figures["yogadl014_build"]["method"] = yog["build_method"]
        figures["yogadl014_build"]["repeats"] = 1
    else:
        for name in ("yogadl014_shuffled_records", "yogadl014_build"):
            figures[name] = {"value": None, "unit": "records/s", "note": yog}

    plan = [
        ("raw_put", None),
        ("raw_put_putmulti", "raw_put"),
        ("raw_random_get_record", None),
        ("raw_random_get_batch256", "raw_random_get_record"),
        ("raw_cursor_scan", None),
        ("ydl_shuffled_records", "raw_random_get_record"),
        ("ydl_shuffled_records", "yogadl014_shuffled_records"),
        ("ydl_shuffled_batch256", "raw_random_get_batch256"),
        ("ydl_sequential_batch256", "raw_cursor_scan"),
        ("ydl_build", "raw_put"),
        ("ydl_build", "raw_put_putmulti"),
        ("ydl_first_record_at_0", None),
        ("ydl_first_record_at_0.9N", "ydl_first_record_at_0"),
        ("ydl_random_getitem", "raw_random_get_record"),
        ("yogadl014_shuffled_records", "raw_random_get_record"),
        ("yogadl014_build", "raw_put"),
    ]
    rows = []
    for metric, base in plan:
        fig = figures[metric]
        row: dict[str, Any] = {"n": n, "metric": metric, **fig, "baseline": base}
        ratio = None
        if base is not None:
            bfig = figures[base]
            row["baseline_value"] = bfig["value"]
            if fig["value"] is not None and bfig["value"] is not None:
                ratio = fig["value"] / bfig["value"]
        row["ratio"] = ratio
        target = TARGETS.get((metric, base or ""))
        if target is not None:
            row["target"] = target[0]
            row["target_met"] = None if ratio is None else bool(target[1](ratio))
        rows.append(row)
    return rows


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.0f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| N | metric | records/s | baseline | baseline records/s | ratio | target |",
        "|---:|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        if r["baseline"] is not None and (r.get("baseline_value") is None or r["value"] is None):
            ratio = "n/a"
        target = target_cell(r.get("target", ""), r.get("target_met"))
        base_val = (
            fmt_value(r.get("baseline_value"), r["unit"]) if r["baseline"] is not None else ""
        )
        method = f" ({r['method']})" if "method" in r else ""
        lines.append(
            f"| {r['n']:,} | {r['metric']}{method} | {fmt_value(r['value'], r['unit'])} | "
            f"{r['baseline'] or ''} | {base_val} | {ratio} | {target} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=None, help="comma-separated N (default 10^4,10^5,10^6)")
    parser.add_argument("--quick", action="store_true", help="N = 10^4 and 10^5 only")
    parser.add_argument("--json", default=None, help="also write the table as JSON here")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    parser.add_argument("--yogadl-python", default=YOGADL_PYTHON, help="side venv's python")
    parser.add_argument("--no-yogadl", action="store_true", help="skip the yogadl 0.1.4 rows")
    parser.add_argument("--tmp", default=None, help="parent folder for temp files (default /tmp)")
    args = parser.parse_args(argv)
    if args.sizes:
        sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    else:
        sizes = list(QUICK_SIZES if args.quick else DEFAULT_SIZES)

    info = machine()
    print(
        f"# yogadl_plus foundation benchmark: {info['cpus']} CPUs, {info['cpu_model']}, "
        f"Python {info['python']}, lmdb {info['lmdb']}, numpy {info['numpy']}",
        flush=True,
    )
    if not args.no_yogadl and not os.path.exists(args.yogadl_python):
        print(
            f"# yogadl 0.1.4 rows: n/a, side venv missing at {args.yogadl_python}; {YOGADL_HELP}",
            flush=True,
        )
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ydl_bench_", dir=args.tmp)
    rows: list[dict[str, Any]] = []
    try:
        for n in sizes:
            t_n = time.perf_counter()
            x, label = make_data(n)
            size_dir = os.path.join(tmp, f"n{n}")
            os.makedirs(size_dir)
            raw = bench_raw(n, x, label, size_dir, args.repeats)
            ours = bench_ydl(n, x, label, size_dir, args.repeats)
            if args.no_yogadl:
                yog: dict | str = "skipped (--no-yogadl)"
            else:
                yog = bench_yogadl(n, x, label, size_dir, args.repeats, args.yogadl_python)
            new = rows_for(n, raw, ours, yog)
            rows.extend(new)
            print(f"\n## N = {n:,} ({time.perf_counter() - t_n:.0f} s)\n", flush=True)
            print(markdown(new), flush=True)
            if isinstance(yog, str):
                print(f"\nyogadl 0.1.4: {yog}", flush=True)
            del x, label
            shutil.rmtree(size_dir, ignore_errors=True)
            gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - start
    print(
        f"\n## All sizes ({total:.0f} s in all; best of >= {args.repeats} runs, first-record "
        f"rows >= {max(args.repeats, 5)}; small N repeated up to {MAX_REPEATS} times until "
        f"{MIN_TOTAL_S} s was timed)\n"
    )
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                    "statistic": "best (minimum time) of repeats",
                    "repeats": args.repeats,
                    "first_record_repeats": max(args.repeats, 5),
                    "total_seconds": total,
                    "load_average_at_end": os.getloadavg(),
                    "min_total_s_per_figure": MIN_TOTAL_S,
                    "max_repeats": MAX_REPEATS,
                    "rows": rows,
                },
                f,
                indent=2,
            )
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
