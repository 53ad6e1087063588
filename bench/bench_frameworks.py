"""Framework benchmark: yogadl_plus's tf.data and PyTorch faces against yogadl 0.1.4, plain
tf.data and Petastorm 0.13.1, on the same data, in one run.

    python bench/bench_frameworks.py [--quick] [--json out.json]

Data: N records {"x": float32[64], "label": int64} (the foundation benchmark's, same seed).
Every file is read once (page cache warm) before it is timed; every figure is the BEST (minimum
time) of ``--repeats`` runs (3 by default). A run includes making the stream / dataset / loader.
tf.data datasets are iterated in Python, eagerly (``for _ in ds``), on both sides of a row; the
``_reduce`` rows (for information) iterate with ``ds.reduce`` instead. See bench/README.md.
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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from _common import target_cell, warm  # noqa: E402
from bench_foundation import best_of, machine, make_data  # noqa: E402

import yogadl_plus as ydl  # noqa: E402

N_DEFAULT = 100_000
# yogadl 0.1.4's tf.data path runs at ~2k records/s: 10^5 records would be ~50 s a run, so the
# record-by-record tf row uses the first 20,000 records, on both sides.
TF_RECORDS_N_DEFAULT = 20_000
QUICK_N = 20_000
BATCH = 256
SHUFFLE_QUEUE = 10_000
RECORDS_REPEATS = 5  # the record-by-record tf rows (eager), both sides: see bench_tf
YOGADL_PYTHON = os.path.join(ROOT, ".baselines", "yogadl", "bin", "python")
PETASTORM_PYTHON = os.path.join(ROOT, ".baselines", "petastorm", "bin", "python")
VENV_HELP = "create it with: bash bench/baselines/venvs.sh .baselines  (from the repo root)"
SIDE_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")

# (metric, baseline) -> (target text, check(ratio) -> bool)
TARGETS: dict[tuple[str, str], tuple[str, Callable[[float], bool]]] = {
    ("ydl_tf_records", "yogadl014_tf_records"): (">= 10x", lambda r: r >= 10.0),
    ("ydl_tf_batch256", "tf_inmem_shuffle_batch256"): (">= 0.5x", lambda r: r >= 0.5),
    ("ydl_torch_batch256_w0", "petastorm_batch_reader"): (">= 2x", lambda r: r >= 2.0),
    ("ydl_torch_batch256_w2", "petastorm_batch_reader"): (">= 2x", lambda r: r >= 2.0),
    ("ydl_torch_batch256_w0", "petastorm_reader"): (">= 2x", lambda r: r >= 2.0),
    ("ydl_torch_batch256_w2", "petastorm_reader"): (">= 2x", lambda r: r >= 2.0),
}


def build_cache(storage: Any, name: str, x: np.ndarray, label: np.ndarray) -> Any:
    """Caches the arrays with yogadl_plus (not timed); returns the open, warm DataRef."""
    xs, labels = list(x), list(label)

    def generator_function() -> Any:
        for xi, li in zip(xs, labels):
            yield {"x": xi, "label": li}

    ydl.cache_dataset(generator_function, name, "v1", storage, progress=False)
    xs.clear()
    labels.clear()
    dataref = storage.fetch(name, "v1")
    assert len(dataref) == len(label)
    warm(storage.path(name, "v1"))
    sample = dataref[len(label) // 2]
    assert np.array_equal(sample["x"], x[len(label) // 2])
    assert sample["label"] == label[len(label) // 2]
    return dataref


def side_script(python: str, script: str, args: list[str], timeout: int = 900) -> dict | str:
    """Runs a helper in a side venv; returns its JSON (last stdout line) or why not."""
    if not os.path.exists(python):
        return f"side venv missing ({python}); {VENV_HELP}"
    cmd = [python, os.path.join(HERE, script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=SIDE_ENV, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{script} timed out after {timeout} s"
    if proc.returncode != 0:
        return f"{script} failed (rc {proc.returncode}): {proc.stderr.strip()[-800:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- PyTorch


def bench_torch(dataref: Any, x: np.ndarray, label: np.ndarray, repeats: int) -> dict:
    import torch

    n = len(label)
    want_label, want_x = int(label.sum()), float(x.astype(np.float64).sum())
    out: dict[str, Any] = {}
    for workers in (0, 2):

        def epoch(workers: int = workers, check: bool = False) -> None:
            loader = ydl.torch.make_dataloader(
                dataref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH),
                num_workers=workers,
            )
            count, label_sum, x_sum = 0, 0, 0.0
            if not check:
                for batch in loader:  # as on the Petastorm side: count records, nothing else
                    count += len(batch["label"])
                assert count == n, (count, n)
                return
            for batch in loader:  # the untimed check, the same as on the Petastorm side
                xb, lb = batch["x"], batch["label"]
                assert xb.dtype == torch.float32 and tuple(xb.shape[1:]) == (64,)
                assert lb.dtype == torch.int64 and lb.shape[0] == xb.shape[0]
                count += len(lb)
                label_sum += int(lb.sum())
                x_sum += float(xb.double().sum())
            assert count == n and label_sum == want_label, (count, label_sum)
            assert abs(x_sum - want_x) < 1e-6 * max(1.0, abs(want_x)) + 1e-3, (x_sum, want_x)

        epoch(check=True)
        out[f"ydl_torch_batch256_w{workers}"] = best_of(epoch, repeats)
    return out


def save_arrays(folder: str, x: np.ndarray, label: np.ndarray) -> tuple[str, str]:
    """The data as .npy files, for a side-venv script to load."""
    xp, lp = os.path.join(folder, "x.npy"), os.path.join(folder, "label.npy")
    np.save(xp, x)
    np.save(lp, label)
    return xp, lp


def arrays_side_script(
    python: str, script: str, x: np.ndarray, label: np.ndarray, tmp: str, args: list[str]
) -> dict | str:
    """Runs a side-venv baseline on the same arrays (saved under ``tmp``, removed after);
    ``{workdir}`` in ``args`` is a fresh folder for its files."""
    work = tempfile.mkdtemp(prefix=script.strip("_").split(".")[0] + "-", dir=tmp)
    xp, lp = save_arrays(work, x, label)
    args = [a.replace("{workdir}", os.path.join(work, "wd")) for a in args]
    try:
        return side_script(python, script, ["--x", xp, "--label", lp, *args])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_petastorm(
    x: np.ndarray, label: np.ndarray, tmp: str, repeats: int, python: str, queue: int
) -> dict | str:
    return arrays_side_script(
        python, "_petastorm_torch_baseline.py", x, label, tmp,
        ["--workdir", "{workdir}", "--repeats", str(repeats), "--shuffle-queue", str(queue)],
    )  # fmt: skip


# --------------------------------------------------------------------------- TensorFlow


def tf_adapter() -> Callable[..., Any] | str:
    try:
        return ydl.tensorflow.make_tf_dataset
    except Exception as e:
        return f"ydl.tensorflow.make_tf_dataset unavailable: {type(e).__name__}: {e}"


def bench_tf(dataref: Any, small: Any, x: np.ndarray, label: np.ndarray, repeats: int) -> dict:
    import tensorflow as tf

    make_tf_dataset = ydl.tensorflow.make_tf_dataset
    n = len(label)
    n_batches = -(-n // BATCH)
    out: dict[str, Any] = {}

    def python_loop(make: Callable[[], Any], expected: int) -> Callable[[], None]:
        def run() -> None:
            count = 0
            for _ in make():  # eager, element by element, in Python
                count += 1
            assert count == expected, (count, expected)

        return run

    def reduce_loop(make: Callable[[], Any], expected: int) -> Callable[[], None]:
        def run() -> None:
            count = int(make().reduce(np.int64(0), lambda c, _: c + 1))
            assert count == expected, (count, expected)

        return run

    # Untimed check: one shuffled batched epoch holds exactly the arrays' records.
    label_sum, x_sum, count = 0, 0.0, 0
    for b in make_tf_dataset(dataref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)):
        assert b["x"].dtype == tf.float32 and b["label"].dtype == tf.int64
        count += int(b["label"].shape[0])
        label_sum += int(tf.reduce_sum(b["label"]))
        x_sum += float(tf.reduce_sum(tf.cast(b["x"], tf.float64)))
    assert count == n and label_sum == int(label.sum()), (count, label_sum)
    assert abs(x_sum - float(x.astype(np.float64).sum())) < 1e-3 + 1e-6 * abs(x_sum)

    n_small = len(small)
    xs, labels = x[:n_small], label[:n_small]

    def ydl_records(**kwargs: Any) -> Callable[[], Any]:
        return lambda: make_tf_dataset(small.stream(shuffle=True, shuffle_seed=0), **kwargs)

    # The default reads blocks of records and unbatches them in tf.data; read_ahead=False is
    # the one-record-per-Python-call path (exact stream.offset, no prefetch). tf.data's
    # from_generator runs that path at one of two speeds per epoch here (~1.95k or ~2.7-3.3k
    # records/s, whatever the generator): the eager record rows are best of RECORDS_REPEATS,
    # on both sides.
    for name, kwargs in (
        ("ydl_tf_records", {}),
        ("ydl_tf_records_per_record", {"read_ahead": False}),
    ):
        out[name] = best_of(
            python_loop(ydl_records(**kwargs), n_small), max(repeats, RECORDS_REPEATS)
        )
        out[f"{name}_reduce"] = best_of(reduce_loop(ydl_records(**kwargs), n_small), repeats)

    # Floors, for information: what tf.data costs per element with no cache behind it.
    records = [{"x": xi, "label": li} for xi, li in zip(xs, labels)]
    signature = {"x": tf.TensorSpec((64,), tf.float32), "label": tf.TensorSpec((), tf.int64)}

    def generator_floor() -> Any:
        return tf.data.Dataset.from_generator(lambda: iter(records), output_signature=signature)

    def inmem_records() -> Any:
        return tf.data.Dataset.from_tensor_slices({"x": xs, "label": labels})

    out["tf_from_generator_records"] = best_of(python_loop(generator_floor, n_small), repeats)
    out["tf_inmem_records"] = best_of(python_loop(inmem_records, n_small), repeats)
    out["tf_inmem_records_reduce"] = best_of(reduce_loop(inmem_records, n_small), repeats)

    def ydl_batches() -> Any:
        return make_tf_dataset(dataref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH))

    def inmem(shuffle: bool) -> Callable[[], Any]:
        def make() -> Any:
            ds = tf.data.Dataset.from_tensor_slices({"x": x, "label": label})
            if shuffle:
                ds = ds.shuffle(n, seed=0)
            return ds.batch(BATCH)

        return make

    out["ydl_tf_batch256"] = best_of(python_loop(ydl_batches, n_batches), repeats)
    out["tf_inmem_shuffle_batch256"] = best_of(python_loop(inmem(True), n_batches), repeats)
    out["tf_inmem_batch256"] = best_of(python_loop(inmem(False), n_batches), repeats)
    out["ydl_tf_batch256_reduce"] = best_of(reduce_loop(ydl_batches, n_batches), repeats)
    out["tf_inmem_shuffle_batch256_reduce"] = best_of(reduce_loop(inmem(True), n_batches), repeats)
    return out


def bench_yogadl_tf(
    x: np.ndarray, label: np.ndarray, tmp: str, repeats: int, python: str
) -> dict | str:
    return arrays_side_script(
        python, "_yogadl_tf_baseline.py", x, label, tmp,
        ["--workdir", "{workdir}", "--repeats", str(repeats),
         "--records-repeats", str(max(repeats, RECORDS_REPEATS))],
    )  # fmt: skip


# --------------------------------------------------------------------------- table


def figure(n: int, best: float | None, times: list[float], **extra: Any) -> dict[str, Any]:
    value = None if best is None else n / best
    return {"n": n, "value": value, "seconds": best, "times_s": times, **extra}


def build_rows(
    n: int,
    n_small: int,
    torch_res: dict | str,
    peta: dict | str,
    tf_res: dict | str,
    yog: dict | str,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    figs: dict[str, dict[str, Any]] = {}

    def missing(names: list[str], n_: int, why: str) -> None:
        for name in names:
            figs[name] = {"n": n_, "value": None, "note": why}

    torch_names = ["ydl_torch_batch256_w0", "ydl_torch_batch256_w2"]
    if isinstance(torch_res, dict):
        for name, (best, times) in torch_res.items():
            figs[name] = figure(n, best, times)
    else:
        missing(torch_names, n, torch_res)

    peta_names = ["petastorm_batch_reader", "petastorm_reader"]
    if isinstance(peta, dict):
        for kind in ("batch_reader", "reader"):
            runs = {k: v for k, v in peta["results"].items() if k.startswith(kind + "_w")}
            for key, r in runs.items():
                figs[f"petastorm_{key}"] = figure(n, r["best_s"], r["times_s"])
            best_key = min(runs, key=lambda k: runs[k]["best_s"])
            r = runs[best_key]
            figs[f"petastorm_{kind}"] = figure(
                n, r["best_s"], r["times_s"], method=f"fastest: workers_count={best_key[-1]}"
            )
    else:
        missing(peta_names, n, peta)

    small_names = (
        "ydl_tf_records",
        "ydl_tf_records_reduce",
        "ydl_tf_records_per_record",
        "ydl_tf_records_per_record_reduce",
        "tf_from_generator_records",
        "tf_inmem_records",
        "tf_inmem_records_reduce",
    )
    tf_names = [
        *small_names,
        "ydl_tf_batch256",
        "tf_inmem_shuffle_batch256",
        "tf_inmem_batch256",
        "ydl_tf_batch256_reduce",
        "tf_inmem_shuffle_batch256_reduce",
    ]
    if isinstance(tf_res, dict):
        for name, (best, times) in tf_res.items():
            size = n_small if name in small_names else n
            figs[name] = figure(size, best, times)
    else:
        missing(tf_names, n, tf_res)
    if isinstance(yog, dict):
        figs["yogadl014_tf_records"] = figure(yog["n"], yog["best_s"], yog["times_s"])
        figs["yogadl014_tf_records_reduce"] = figure(
            yog["n"], yog["reduce_best_s"], yog["reduce_times_s"]
        )
    else:
        missing(["yogadl014_tf_records", "yogadl014_tf_records_reduce"], n_small, yog)

    plan: list[tuple[str, str | None]] = [
        ("ydl_tf_records", "yogadl014_tf_records"),
        ("ydl_tf_records", "tf_from_generator_records"),
        ("ydl_tf_records", "tf_inmem_records"),
        ("ydl_tf_records_reduce", "yogadl014_tf_records_reduce"),
        ("ydl_tf_records_reduce", "tf_inmem_records_reduce"),
        ("ydl_tf_records_per_record", "yogadl014_tf_records"),
        ("ydl_tf_records_per_record", "tf_from_generator_records"),
        ("ydl_tf_records_per_record_reduce", "yogadl014_tf_records_reduce"),
        ("ydl_tf_batch256", "tf_inmem_shuffle_batch256"),
        ("ydl_tf_batch256", "tf_inmem_batch256"),
        ("ydl_tf_batch256_reduce", "tf_inmem_shuffle_batch256_reduce"),
        ("ydl_torch_batch256_w0", "petastorm_batch_reader"),
        ("ydl_torch_batch256_w2", "petastorm_batch_reader"),
        ("ydl_torch_batch256_w0", "petastorm_reader"),
        ("ydl_torch_batch256_w2", "petastorm_reader"),
        ("petastorm_batch_reader_w1", None),
        ("petastorm_batch_reader_w2", None),
        ("petastorm_reader_w1", None),
        ("petastorm_reader_w2", None),
    ]
    rows = []
    for metric, base in plan:
        if metric not in figs:
            continue
        fig = figs[metric]
        row: dict[str, Any] = {"metric": metric, **fig, "baseline": base}
        ratio = None
        if base is not None:
            bfig = figs[base]
            row["baseline_n"] = bfig["n"]
            row["baseline_value"] = bfig["value"]
            if "method" in bfig:
                row["baseline_method"] = bfig["method"]
            if fig["value"] is not None and bfig["value"] is not None:
                ratio = fig["value"] / bfig["value"]
        row["ratio"] = ratio
        target = TARGETS.get((metric, base or ""))
        if target is not None:
            row["target"] = target[0]
            row["target_met"] = None if ratio is None else bool(target[1](ratio))
        rows.append(row)
    return rows, figs


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| metric | N | records/s | baseline | baseline records/s | ratio | target |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        base = r["baseline"] or ""
        if "baseline_method" in r:
            base += f" ({r['baseline_method']})"
        ratio = (
            "" if r["baseline"] is None else "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        )
        target = target_cell(r.get("target", ""), r.get("target_met"))
        base_val = fmt(r.get("baseline_value")) if r["baseline"] is not None else ""
        lines.append(
            f"| {r['metric']} | {r['n']:,} | {fmt(r['value'])} | {base} | {base_val} | {ratio} "
            f"| {target} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=None, help=f"records (default {N_DEFAULT:,})")
    parser.add_argument(
        "--tf-records-n",
        type=int,
        default=None,
        help="records for the record-by-record tf row, both sides "
        f"(default {TF_RECORDS_N_DEFAULT:,})",
    )
    parser.add_argument("--quick", action="store_true", help=f"N = {QUICK_N:,} everywhere")
    parser.add_argument("--json", default=None, help="also write the table as JSON here")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    parser.add_argument("--shuffle-queue", type=int, default=SHUFFLE_QUEUE,
                        help="Petastorm shuffling_queue_capacity (default 10000)")  # fmt: skip
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows")
    parser.add_argument("--no-tf", action="store_true", help="skip the TensorFlow rows")
    parser.add_argument("--no-yogadl", action="store_true", help="skip yogadl 0.1.4")
    parser.add_argument("--no-petastorm", action="store_true", help="skip Petastorm 0.13.1")
    parser.add_argument("--yogadl-python", default=YOGADL_PYTHON)
    parser.add_argument("--petastorm-python", default=PETASTORM_PYTHON)
    parser.add_argument("--tmp", default=None, help="parent folder for temp files (default /tmp)")
    args = parser.parse_args(argv)
    n = args.n or (QUICK_N if args.quick else N_DEFAULT)
    n_small = min(n, args.tf_records_n or TF_RECORDS_N_DEFAULT)

    info = machine()
    print(
        f"# yogadl_plus framework benchmark: {info['cpus']} CPUs, {info['cpu_model']}, "
        f"Python {info['python']}, N = {n:,} (record-by-record tf row: {n_small:,})",
        flush=True,
    )
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ydl_bench_fw_", dir=args.tmp)
    sections: dict[str, float] = {}
    try:
        x, label = make_data(n)
        storage = ydl.LocalStorage(os.path.join(tmp, "ydl_store"))
        dataref = build_cache(storage, "bench", x, label)
        small = build_cache(storage, "bench_small", x[:n_small], label[:n_small])

        # PyTorch first: DataLoader workers fork, better before TensorFlow is imported here.
        t0 = time.perf_counter()
        torch_res: dict | str = (
            "skipped (--no-torch)"
            if args.no_torch
            else bench_torch(dataref, x, label, args.repeats)
        )
        sections["ydl_torch_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if args.no_petastorm or args.no_torch:
            peta: dict | str = "skipped"
        else:
            peta = bench_petastorm(
                x, label, tmp, args.repeats, args.petastorm_python, args.shuffle_queue
            )
        sections["petastorm_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        adapter = "skipped (--no-tf)" if args.no_tf else tf_adapter()
        if isinstance(adapter, str):
            tf_res: dict | str = adapter
        else:
            tf_res = bench_tf(dataref, small, x, label, args.repeats)
        sections["ydl_tf_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if args.no_yogadl or args.no_tf:
            yog: dict | str = "skipped"
        else:
            yog = bench_yogadl_tf(
                x[:n_small], label[:n_small], tmp, args.repeats, args.yogadl_python
            )
        sections["yogadl_tf_s"] = time.perf_counter() - t0
        dataref.close()
        small.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows, _ = build_rows(n, n_small, torch_res, peta, tf_res, yog)
    total = time.perf_counter() - start
    print(f"\n## Frameworks ({total:.0f} s in all; best of {args.repeats} runs)\n")
    print(markdown(rows))
    for what, res in (("PyTorch", torch_res), ("Petastorm", peta), ("tf", tf_res), ("yogadl", yog)):
        if isinstance(res, str):
            print(f"\n{what}: {res}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": info,
                    "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                    "statistic": "best (minimum time) of repeats",
                    "repeats": args.repeats,
                    "n": n,
                    "tf_records_n": n_small,
                    "total_seconds": total,
                    "section_seconds": sections,
                    "load_average_at_end": os.getloadavg(),
                    "rows": rows,
                    "petastorm": peta,
                    "yogadl014": yog,
                },
                f,
                indent=2,
            )
        print(f"\nJSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
