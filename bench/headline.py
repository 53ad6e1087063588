"""The headline table of docs/performance.md: yogadl_plus against its peers, one run, one machine.

    bash bench/baselines/venvs.sh .baselines        # once: the peers' side venvs
    python -m bench.headline [--quick] [--json out.json] [--repeats 3] [--baselines DIR]

Prints the machine, then one markdown table ready to paste: a row per workload, a column per
library, each cell the throughput and, for a peer, yogadl_plus's throughput divided by the
peer's (2.00x: yogadl_plus twice as fast), both from this run. "—" where a library does not
apply or was not measured; a row that cannot run (a missing venv, no SeaweedFS) says why
under the table. Every figure is the best of --repeats epochs after the data were read once
(page cache warm), unless the row says otherwise. The peers run in the side venvs as
subprocesses (``bench.baselines.headline_peers``, and ``grain_big``, ``litdata_s3``,
``yogadl_foundation`` and ``peer_writers`` that other scripts use too), timed inside their own
process. The run takes about 4 minutes on 2 cores (longer on a loaded machine); --quick is a
check that everything runs (about 2 minutes), not a measurement; smoke mode
(``YDL_BENCH_SMOKE=1``) is smaller still, one epoch a figure.

Rows (what each column times is in ROWS below):

- small records: ``{"x": float32[64], "label": int64}`` (264 bytes), a shuffled epoch in
  batches of 256;
- big records: ``{"x": uint8[256 KiB], "y": int64}``, a true global shuffle record by record;
- images: a folder of 500x375 JPEGs -> RandomResizedCrop(224) + horizontal flip, uint8 CHW
  batches of 64 through a torch DataLoader with 2 worker processes: an ImageFolder cache and
  ``ydl.vision.RandomResizedCrop`` against the folder read by Pillow as torchvision does
  (bench/bench_images.py measures it whole, with the peers);
- tokens: variable-length int32 token arrays (8-512 tokens), shuffled batches of 256 rows;
- building: a cache of the small records from their columns in memory;
- from a bucket: a cold shuffled epoch of the small records from a local SeaweedFS S3 server;
- faces: torch ``make_dataloader`` (2 workers), tf.data ``make_tf_dataset``, Keras
  ``model.fit`` over ``StreamSequence`` and a Grain ``MapDataset`` over ``ydl.grain.source``,
  each over the small records in shuffled batches of 256.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import io
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.baselines.pillow_images import ImageFolderLike
from bench.bench_build_columns import peer as write_peer
from bench.bench_foundation import bench_yogadl, make_data
from bench.bench_peers_big import ours as big_records_rate
from bench.harness import (
    BASELINE_VENVS,
    SMOKE,
    VENVS_HINT,
    best_of,
    local_servers,
    machine,
    run_baseline,
    smoke,
    time_once,
    write_json,
)

# Before TensorFlow and Keras are imported (lazily, in the tf.data and Keras rows).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

COLUMNS = (
    "yogadl_plus",
    "Grain",
    "litdata",
    "Lance",
    "tf.data",
    "torchvision-style folder",
    "yogadl 0.1.4",
)
BATCH = 256
SMALL_NOTES = [
    "Grain: ArrayRecord (group_size:1, uncompressed), record numbers shuffled by "
    "MapDataset.range(n).shuffle(seed=0).batch(256), each batch read with the source's "
    "__getitems__ (MapDataset.source(...).batch(256) reads record by record, ~40x slower)",
    "litdata: StreamingDataset(shuffle=True) over a local optimize() output, "
    "StreamingDataLoader(batch_size=256), no workers; it shuffles chunks, then records "
    "within a window of chunks",
    "Lance: dataset.take() of 256 shuffled row numbers at a time",
    "tf.data: the arrays in memory, from_tensor_slices(...).shuffle(N).batch(256), eager",
    "yogadl 0.1.4: its own shuffled stream iterator, record by record (it has no batches)",
]
BUILD_NOTES = [
    "Grain: ArrayRecordWriter(group_size:1, uncompressed), a record at a time; Lance: "
    "write_dataset(table); litdata: optimize() with 2 workers; yogadl 0.1.4: "
    "LFSStorage.cacheable over tf.data from_tensor_slices (one run)",
]


@dataclass(frozen=True)
class Sizes:
    """How much data each row reads: the full run and --quick."""

    small: int
    big: int
    images: int
    tokens: int
    bucket: int
    big_seconds: float
    bucket_chunk_bytes: int

    @staticmethod
    def pick(quick: bool) -> Sizes:
        """The full run's sizes, --quick's, or smoke mode's (smaller still: every row runs)."""
        if SMOKE:
            return Sizes(
                2_000,
                50,
                32,
                1_000,
                2_000,
                big_seconds=0.2,
                bucket_chunk_bytes=64 << 10,
            )
        if quick:
            return Sizes(
                20_000,
                200,
                128,
                5_000,
                20_000,
                big_seconds=1.0,
                bucket_chunk_bytes=256 << 10,
            )
        return Sizes(
            200_000,
            2_000,
            1_000,
            50_000,
            200_000,
            big_seconds=4.0,
            bucket_chunk_bytes=4 << 20,
        )


@dataclass
class Row:
    """One line of the table: its name, unit, and records/s per column (or why not)."""

    name: str
    unit: str
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def cell(self, column: str) -> str:
        value = self.figures.get(column)
        if value is None:
            return "—"
        text = _short(value)
        if column != "yogadl_plus" and "yogadl_plus" in self.figures:
            text += f" ({self.figures['yogadl_plus'] / value:.2f}x)"
        return text


def _short(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


# --------------------------------------------------------------------------- the side venvs


def peer_run(python: Path, module: str, *args: str) -> dict[str, Any]:
    """Runs ``bench.baselines.<module>`` in the side venv of ``python``; its JSON, or a
    RuntimeError saying why there is none."""
    got = run_baseline("peers", module, list(args), python=str(python), timeout=1200)
    if isinstance(got, str):
        raise RuntimeError(got)
    return got


# --------------------------------------------------------------------------- data


def epoch_count(items: Iterable[Any], key: str) -> int:
    return sum(len(batch[key]) for batch in items)


def rate(n: int, run: Callable[[], Any], repeats: int) -> float:
    """``n`` / the best of ``repeats`` runs of ``run`` (``harness.best_of``), after one untimed."""
    run()  # untimed: pages warm, workers started, graphs traced
    best, _ = best_of(run, repeats)
    return n / best


def loader_rate(n: int, make: Callable[[], Any], key: Any, repeats: int) -> float:
    """``rate`` of epochs of the DataLoader ``make()`` returns; its workers end with it."""
    loader = make()
    return rate(n, lambda: sum(len(batch[key]) for batch in loader), repeats)


def jpeg_files(folder: Path, n: int) -> list[tuple[bytes, int]]:
    """``n`` JPEGs of 500x375 (ImageNet's usual size), smooth pictures with noise, written
    under ``folder/<class>/`` as an ImageFolder expects; returns (bytes, class) pairs."""
    from PIL import Image

    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[0:375, 0:500].astype(np.float32)
    made: list[tuple[bytes, int]] = []
    for k in range(32):
        base = np.stack([xx / 2, yy / 1.5, (xx + yy) / 3.5], axis=-1) + 8 * k
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(noisy).save(out, "JPEG", quality=90)
        made.append((out.getvalue(), k % 10))
    pairs = [made[i % len(made)] for i in range(n)]
    for i, (data, label) in enumerate(pairs):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        (folder / str(label) / f"{i:06d}.jpg").write_bytes(data)
    return pairs


# --------------------------------------------------------------------------- the run


class Headline:
    """Builds the data once and measures each row, torch rows before TensorFlow is imported
    (DataLoader workers fork the process)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.sizes = Sizes.pick(args.quick)
        self.repeats = args.repeats
        self.work = Path(tempfile.mkdtemp(prefix="ydl-headline-", dir=args.tmp))
        self.storage = ydl.LocalStorage(self.work / "cache")
        self.peers = Path(args.baselines) / "peers" / "bin" / "python"
        self.yogadl = Path(args.baselines) / "yogadl" / "bin" / "python"
        self.skipped: list[str] = []
        x, label = make_data(self.sizes.small)
        self.x, self.label = x, label
        self.arrays = self.work / "arrays"
        self.arrays.mkdir()
        np.save(self.arrays / "x.npy", x)
        np.save(self.arrays / "y.npy", label)
        self.small = ydl.cache_dataset(
            {"x": x, "label": label}, "small", "v1", self.storage, progress=False
        )

    def has(self, python: Path, what: str) -> bool:
        if python.exists():
            return True
        self.skipped.append(f"{what}: no side venv at {python}; {VENVS_HINT}")
        return False

    def peer(self, row: Row, column: str, run: Callable[[], float]) -> None:
        """A peer's figure, or why it is missing: one failing peer does not stop the run."""
        try:
            row.figures[column] = run()
        # SystemExit: bench_build_columns.peer ends its own script so when a writer fails.
        except (Exception, SystemExit) as error:  # reported under the table
            self.skipped.append(f"{row.name}, {column}: {error}".replace("\n", " ")[:400])

    def small_rows(self) -> list[Row]:
        n, ref = self.sizes.small, self.small
        reads = Row("small records, shuffled batches of 256", "records/s")
        build = Row("building from columns in memory", "records/s")

        def epoch() -> int:
            return epoch_count(ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), "label")

        reads.figures["yogadl_plus"] = rate(n, epoch, self.repeats)
        reads.notes += SMALL_NOTES
        build.notes += BUILD_NOTES
        columns = {"x": self.x, "y": self.label}
        builds: list[float] = []
        for k in range(self.repeats):
            storage = ydl.LocalStorage(self.work / f"build-{k}")
            seconds, _ = time_once(
                lambda s=storage: ydl.cache_dataset(columns, "d", "v", s, progress=False)
            )
            builds.append(seconds)
            shutil.rmtree(self.work / f"build-{k}")
        build.figures["yogadl_plus"] = n / min(builds)
        if self.has(self.peers, "Grain, litdata, Lance"):
            self.peer_small(reads, build)
        if self.has(self.yogadl, "yogadl 0.1.4"):
            self.peer(reads, "yogadl 0.1.4", lambda: self.yogadl014(build))
        return [reads, build]

    def peer_small(self, reads: Row, build: Row) -> None:
        folder = self.work / "peers-small"
        folder.mkdir()
        for column, kind in (("Grain", "array_record"), ("Lance", "lance")):
            self.peer(
                build,
                column,
                lambda kind=kind: (
                    self.sizes.small
                    / write_peer(str(self.peers), kind, str(self.arrays), str(folder))
                ),
            )
        data = (str(self.arrays), str(folder), str(self.repeats))
        for column, row in (("Grain", "grain-small"), ("Lance", "lance-small")):
            self.peer(
                reads,
                column,
                lambda row=row: peer_run(self.peers, "headline_peers", row, *data)["read"],
            )
        try:
            got = peer_run(self.peers, "headline_peers", "litdata-small", *data)
            build.figures["litdata"] = got["build"]
            reads.figures["litdata"] = got["read_w0"]
            self.litdata_w2 = got["read_w2"]
        except Exception as error:
            self.skipped.append(f"litdata: {error}"[:400])
        shutil.rmtree(folder)

    def yogadl014(self, build: Row) -> float:
        got = bench_yogadl(self.x, self.label, str(self.work), self.repeats, str(self.yogadl))
        if isinstance(got, str):
            raise RuntimeError(got)
        build.figures["yogadl 0.1.4"] = got["n"] / got["build_s"]
        if "tf.data" not in got["build_method"]:
            build.notes.append("yogadl 0.1.4 wrote with its own LMDB writer")
        return got["n"] / min(got["shuffled_times_s"])

    def big_row(self) -> Row:
        row = Row("big records (256 KiB), shuffled, record by record", "records/s")
        size, count, seconds = 256 << 10, self.sizes.big, self.sizes.big_seconds
        schema = ydl.Schema([ydl.Field("x", np.uint8, (size,)), ydl.Field("y", np.int64)])

        def records() -> Iterable[dict[str, Any]]:  # the records grain_big writes
            base = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            for i in range(count):
                yield {"x": np.roll(base, i % 997), "y": np.int64(i)}

        ref = ydl.cache_dataset(records, "big", "v1", self.storage, schema=schema, progress=False)
        big_records_rate(ref, seconds)  # untimed: pages warm
        row.figures["yogadl_plus"] = max(
            big_records_rate(ref, seconds) for _ in range(self.repeats)
        )
        if self.has(self.peers, "Grain, big records"):
            folder = self.work / "grain-big"
            folder.mkdir()
            args = (str(folder), str(count), str(size), str(seconds))
            self.peer(row, "Grain", lambda: peer_run(self.peers, "grain_big", *args)["map"])
            shutil.rmtree(folder)
        ref.close()
        return row

    def images_row(self) -> Row:
        import torch

        row = Row(
            "images: JPEG -> decode, RandomResizedCrop(224), flip; batches of 64, 2 workers",
            "images/s",
        )
        n = self.sizes.images
        jpeg_files(self.work / "images", n)
        ref = ydl.cache_dataset(
            ydl.sources.ImageFolder(self.work / "images"), "images", "v1", self.storage,
            progress=False,
        )  # fmt: skip
        crop = ydl.vision.RandomResizedCrop(224, layout="CHW")
        stream = ref.stream(shuffle=True, shuffle_seed=0, batch_size=64, transform=crop)
        ours = functools.partial(ydl.torch.make_dataloader, stream, num_workers=2)
        row.figures["yogadl_plus"] = loader_rate(n, ours, "label", self.repeats)
        folder = functools.partial(
            torch.utils.data.DataLoader, ImageFolderLike(self.work / "images"), batch_size=64,
            shuffle=True, num_workers=2, persistent_workers=True,
        )  # fmt: skip
        row.figures["torchvision-style folder"] = loader_rate(n, folder, 1, self.repeats)
        ref.close()
        return row

    def tokens_row(self) -> Row:
        row = Row("tokens: int32[8-512] per row, shuffled batches of 256", "rows/s")
        n = self.sizes.tokens
        rng = np.random.default_rng(3)
        lengths = rng.integers(8, 513, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        flat = rng.integers(0, 50_000, offsets[-1], dtype=np.int32)
        data = self.work / "tokens"
        data.mkdir()
        np.save(data / "tokens.npy", flat)
        np.save(data / "offsets.npy", offsets)
        schema = ydl.Schema([ydl.Field("tokens", np.int32, (None,))])
        ref = ydl.cache_dataset(
            ({"tokens": flat[offsets[i] : offsets[i + 1]]} for i in range(n)),
            "tokens",
            "v1",
            self.storage,
            schema=schema,
            progress=False,
        )

        def epoch() -> int:
            return epoch_count(ref.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), "tokens")

        row.figures["yogadl_plus"] = rate(n, epoch, self.repeats)
        if self.has(self.peers, "Grain, Lance: tokens"):
            args = (str(data), str(data), str(self.repeats))
            for column, kind in (("Grain", "grain-tokens"), ("Lance", "lance-tokens")):
                self.peer(
                    row,
                    column,
                    lambda kind=kind: peer_run(self.peers, "headline_peers", kind, *args)["read"],
                )
        ref.close()
        return row

    def bucket_row(self) -> Row:
        row = Row("from a bucket (S3, cold), shuffled batches of 256", "records/s")
        try:
            server_context = local_servers().seaweedfs(self.work / "weed")
            server = server_context.__enter__()
        except Exception as error:  # no SeaweedFS binary, no boto3
            self.skipped.append(f"{row.name}: no local S3 server ({error})"[:400])
            return row
        try:
            self.bucket_figures(server, row)
        finally:
            server_context.__exit__(None, None, None)
        return row

    def bucket_figures(self, server: Any, row: Row) -> None:
        n = self.sizes.bucket
        bucket = server.make_bucket()
        columns = {
            "i": np.arange(n),
            "x": np.random.default_rng(0).standard_normal((n, 64), np.float32),
        }
        built = ydl.cache_dataset(
            columns,
            "d",
            "v",
            server.storage(bucket, "team", self.work / "builder"),
            chunk_bytes=self.sizes.bucket_chunk_bytes,
            progress=False,
        )
        total = sum(c.bytes for c in built.manifest.chunks)
        built.close()
        times = []
        for k in range(self.repeats):
            cache = self.work / f"reader-{k}"

            def cold_epoch(cache: Path = cache) -> None:
                storage = ydl.S3Storage(
                    bucket,
                    "team",
                    local_cache=cache,
                    endpoint_url=server.endpoint_url,
                    aws_access_key_id=server.access_key,
                    aws_secret_access_key=server.secret_key,
                    region_name="us-east-1",
                    local_cache_limit=max(total // 2, 16 * self.sizes.bucket_chunk_bytes),
                )
                ref = storage.fetch("d", "v")
                stream = ref.stream(
                    shuffle=True, shuffle_seed=0, shuffle_window=8, batch_size=BATCH
                )
                assert epoch_count(stream, "i") == n
                ref.close()

            times.append(time_once(cold_epoch)[0])
            shutil.rmtree(cache)
        row.figures["yogadl_plus"] = n / min(times)
        if self.has(self.peers, "litdata from a bucket"):
            argv = [
                "--endpoint",
                server.endpoint_url,
                "--bucket",
                bucket,
                "--prefix",
                "litdata",
                "--access-key",
                server.access_key,
                "--secret-key",
                server.secret_key,
                "--records",
                str(n),
                "--work",
                str(self.work / "litdata-s3"),
            ]

            def litdata() -> float:
                peer_run(self.peers, "litdata_s3", *argv, "--mode", "prepare")
                return max(
                    peer_run(self.peers, "litdata_s3", *argv, "--mode", "read")["records_per_s"]
                    for _ in range(self.repeats)
                )

            self.peer(row, "litdata", litdata)

    def torch_face(self) -> Row:
        row = Row("torch make_dataloader, batches of 256, 2 workers", "records/s")
        stream = self.small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)
        loader = functools.partial(ydl.torch.make_dataloader, stream, num_workers=2)
        row.figures["yogadl_plus"] = loader_rate(self.sizes.small, loader, "label", self.repeats)
        if getattr(self, "litdata_w2", None):
            row.figures["litdata"] = self.litdata_w2
        return row

    def grain_face(self, reads: Row) -> Row:
        import grain

        row = Row("Grain: ydl.grain.source, shuffled batches of 256", "records/s")
        source = ydl.grain.source(self.small)
        batches = grain.MapDataset.range(len(source)).shuffle(seed=0).batch(BATCH)

        def epoch() -> int:  # Grain's batched read, as the Grain column reads ArrayRecord
            count = 0
            for indices in batches:
                items = source._getitems(indices.tolist())
                count += len(np.stack([item["x"] for item in items]))
            return count

        row.figures["yogadl_plus"] = rate(self.sizes.small, epoch, self.repeats)
        if "Grain" in reads.figures:
            row.figures["Grain"] = reads.figures["Grain"]
            row.notes.append("Grain: over ArrayRecord, the small-records figure")
        return row

    def tf_rows(self, reads: Row) -> list[Row]:
        import keras
        import tensorflow as tf

        n, x, label = self.sizes.small, self.x, self.label
        face = Row("tf.data make_tf_dataset, shuffled batches of 256", "records/s")
        fit = Row("Keras model.fit, one epoch, batches of 256", "records/s")

        def in_memory() -> Any:
            data = tf.data.Dataset.from_tensor_slices({"x": x, "label": label})
            return data.shuffle(n, seed=0).batch(BATCH)

        def drain(dataset: Any) -> int:
            return sum(int(batch["label"].shape[0]) for batch in dataset)

        stream = self.small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH)
        ours = ydl.tensorflow.make_tf_dataset(stream)
        face.figures["yogadl_plus"] = rate(n, lambda: drain(ours), self.repeats)
        memory = rate(n, lambda: drain(in_memory()), self.repeats)
        face.figures["tf.data"] = reads.figures["tf.data"] = memory

        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        sequence = ydl.keras.StreamSequence(
            self.small.stream(shuffle=True, shuffle_seed=0, batch_size=BATCH), x="x", y="label"
        )
        fit.figures["yogadl_plus"] = rate(
            n, lambda: model.fit(sequence, epochs=1, verbose=0, shuffle=False), self.repeats
        )
        pairs = in_memory().map(lambda d: (d["x"], d["label"]))
        fit.figures["tf.data"] = rate(
            n, lambda: model.fit(pairs, epochs=1, verbose=0, shuffle=False), self.repeats
        )
        return [face, fit]

    def run(self) -> list[Row]:
        reads, build = self.small_rows()
        print("small records and builds done", file=sys.stderr, flush=True)
        rows = [reads, self.big_row()]
        print("big records done", file=sys.stderr, flush=True)
        rows.append(self.images_row())
        print("images done", file=sys.stderr, flush=True)
        rows += [self.tokens_row(), build, self.bucket_row()]
        print("tokens and bucket done", file=sys.stderr, flush=True)
        faces = [self.torch_face(), self.grain_face(reads)]
        faces[1:1] = self.tf_rows(reads)
        return rows + faces

    def close(self) -> None:
        self.small.close()
        shutil.rmtree(self.work, ignore_errors=True)


# --------------------------------------------------------------------------- output


def describe_machine() -> dict[str, Any]:
    about = machine()
    with contextlib.suppress(ValueError, OSError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        about["memory_gib"] = round(memory / 2**30, 1)
    disk = shutil.disk_usage(tempfile.gettempdir())
    about["tmp_disk_gib"] = round(disk.total / 2**30)
    about["libraries"] = {}
    for name in ("torch", "tensorflow", "tensorflow-cpu", "keras", "grain", "pillow"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            about["libraries"][name] = importlib.metadata.version(name)
    return about


def markdown(
    rows: list[Row],
    about: dict[str, Any],
    load_after: tuple[float, ...],
    seconds: float,
    command: str,
) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}`"
        f"{' in smoke mode' if SMOKE else ''} ({seconds / 60:.1f} min) on {about['cpus']} CPUs "
        f"({about['cpu_model']}), {about.get('memory_gib', '?')} GiB RAM, {about['platform']}; "
        f"Python {about['python']}, numpy {about['numpy']}, py-lmdb {about['lmdb']}, "
        f"yogadl_plus {about['yogadl_plus']} ({about['git_commit']}); "
        + ", ".join(f"{k} {v}" for k, v in about["libraries"].items())
        + f"; a {about['tmp_disk_gib']} GiB disk under the temporary folder. Load average "
        f"{about['load_average_at_start'][0]:.2f} at the start, {load_after[0]:.2f} at the end.",
        "",
        "| workload | unit | " + " | ".join(COLUMNS) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in COLUMNS) + " |",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.unit} | " + " | ".join(row.cell(c) for c in COLUMNS) + " |"
        )
    lines.append("")
    lines.append(
        "In a peer's cell, (N.NNx) is yogadl_plus's throughput divided by the peer's, same run."
    )
    for row in rows:
        lines += [f"- {row.name}: {note}" for note in row.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a check, ~2 min")
    parser.add_argument(
        "--repeats", type=int, default=smoke(3, 1), help="epochs per figure (the best)"
    )
    parser.add_argument("--baselines", default=BASELINE_VENVS, help="the side venvs")
    parser.add_argument("--tmp", default=None, help="parent of the scratch folder")
    parser.add_argument("--json", help="also write every figure here")
    args = parser.parse_args(argv)
    random.seed(0)
    about = describe_machine()
    began = time.perf_counter()
    headline = Headline(args)
    try:
        rows = headline.run()
    finally:
        headline.close()
    seconds = time.perf_counter() - began
    load_after = os.getloadavg()
    command = "python -m bench.headline" + (" --quick" if args.quick else "")
    print(markdown(rows, about, load_after, seconds, command))
    for reason in headline.skipped:
        print(f"- not measured: {reason}")
    figures = {r.name: {"unit": r.unit, **r.figures} for r in rows}
    results = {"seconds": seconds, "rows": figures, "not_measured": headline.skipped}
    write_json(args.json, results, info=about)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
