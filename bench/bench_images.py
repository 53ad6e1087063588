"""A folder of photo-sized JPEGs: yogadl_plus's image path against a torchvision-style Pillow
loader, the ceiling the machine sets, and the peers (FFCV, DALI, SPDL, litdata, WebDataset),
all in one run; builds and a bucket too.

    bash bench/baselines/venvs.sh .baselines        # once: the peers' side venvs
    python -m bench.bench_images [--images 2000] [--repeats 3] [--json out.json]
                                 [--section bench/images_section.md] [--tmp DIR]

The data: ``--images`` JPEGs of 500x375 (ImageNet's usual size) at quality 90, photo-like
(smooth shapes, a texture, grain: about 95 KB each, the mean printed), in 10 class folders as
torchvision's ImageFolder expects, and the same files in 10 WebDataset shards (``<key>.jpg`` and
``<key>.cls``, written with tarfile). Every loader hands out the same thing: RandomResizedCrop(224)
(scale 0.08-1, ratio 3/4-4/3) and a horizontal flip, as uint8 CHW batches of 64, each epoch
checked (every image once, the batch's shape and dtype). A figure is the best of --repeats
epochs after one untimed epoch (workers started, page cache warm).

1. Loaders, 2 DataLoader workers and 0:
   - yogadl_plus: a cache of ``ydl.sources.ImageFolder(root)``, its stream
     (``shuffle=True, batch_size=64, transform=ydl.vision.RandomResizedCrop(224,
     layout="CHW")``) through ``ydl.torch.make_dataloader(stream, num_workers=2 | 0)``; and,
     labelled apart, 0 DataLoader workers over a stream with 2 thread workers of its own, and
     that stream iterated alone (numpy batches, no DataLoader);
   - the baseline: ``torch.utils.data.DataLoader`` over ``ImageFolderLike`` (files opened with
     Pillow, cropped, resized bilinear and flipped with Pillow, as torchvision's ImageFolder and
     transforms do), ``shuffle=True``, the same workers. Target: yogadl_plus >= 1.5x;
   - the ceiling: JPEGs holding only a crop's region (boxes drawn as RandomResizedCrop draws
     them, cut out with Pillow and saved at quality 90 beforehand), decoded by simplejpeg on one
     core (full size, and DCT-scaled to the smallest size still covering 224x224: the faster
     counts), times the cores. Nothing else: no file read, resize, flip or batch.
2. Peers, each in its side venv (``bench/baselines/image_peers.py`` says how each runs): FFCV,
   DALI (CPU), SPDL, litdata, WebDataset's own loader; a peer that is not installed or fails is
   reported with its reason, and the others still run.
3. Builds, in MB/s of input (the files' bytes; for shards, the tar files'): a cache of the
   folder and of the shards, serial and ``workers=2``, against ``shutil.copytree`` of the folder,
   litdata's ``optimize`` (2 workers) and FFCV's ``DatasetWriter`` (2 workers; it decodes and
   encodes every image again), timed in the peers' runs.
4. From a bucket (a SeaweedFS on 127.0.0.1): the cache pushed to it (built into the bucket
   storage, 8 MB chunks), read on demand from an empty local cache limited to half the version
   (``fetch(on_demand=True)``, ``shard_by="chunks"``, ``shuffle_window=4``, batches of 64, the
   image bytes not decoded: a transform with ``encoded_fields``), and pulled whole then read,
   against raw parallel boto3 GETs of the same chunk objects (8 threads, nothing written),
   the ceiling (those GETs with what a cache cannot skip: each object's bytes written to a file
   and hashed with sha256 as they arrive) and litdata's StreamingDataset over its own upload
   of the same files (cold cache, records not decoded); each taken in turns ``--repeats``
   times, the best kept. MB/s of the objects read; sha256's and a file write's MB/s on this
   machine. Target: yogadl_plus on demand >= 0.8x the raw GETs. ``--only bucket`` runs this
   part alone (a minute) and prints its table.

Prints a markdown section for docs/performance.md (``--section PATH`` also writes it). Takes
about 6-9 minutes on 2 cores with the defaults (1,500 images); smoke mode
(``YDL_BENCH_SMOKE=1``) uses 64 images and one epoch a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import random
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import yogadl_plus as ydl
from bench.baselines.pillow_images import ImageFolderLike, crop_box
from bench.bench_many_nodes import raw_gets
from bench.harness import (
    BASELINE_VENVS,
    SMOKE,
    VENVS_HINT,
    best_of,
    run_baseline,
    smoke,
    start_seaweedfs,
    target_cell,
    time_once,
    write_json,
)
from bench.headline import describe_machine, loader_rate

WIDTH, HEIGHT, QUALITY = 500, 375, 90
CLASSES, SHARDS, BATCH, SIZE = 10, 10, 64, 224
DISTINCT = 48  # distinct pictures; each file is one of them shifted, so every file differs
# peer -> (its side venv in bench/baselines/venvs.sh, its package)
PEER_VENVS = {
    "ffcv": ("ffcv", "ffcv"),
    "dali": ("dali", "nvidia-dali-cuda120"),
    "spdl": ("spdl", "spdl"),
    "litdata": ("images", "litdata"),
    "webdataset": ("images", "webdataset"),
}


@dataclass
class Results:
    """Every figure of the run, as the JSON and the markdown section show them."""

    data: dict[str, Any] = field(default_factory=dict)
    loaders: dict[str, float] = field(default_factory=dict)
    ceiling: dict[str, float] = field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    builds: dict[str, float] = field(default_factory=dict)
    bucket: dict[str, dict[str, float]] = field(default_factory=dict)
    not_measured: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- data


def photo(rng: np.random.Generator) -> np.ndarray:
    """A 500x375 RGB picture that JPEG compresses as it does a photo: smooth shapes of colour,
    a fine texture and sensor-like grain (about 95 KB at quality 90)."""
    from PIL import Image

    def smooth(rows: int, columns: int) -> np.ndarray:
        cells = rng.uniform(0, 255, (rows, columns, 3)).astype(np.uint8)
        return np.asarray(Image.fromarray(cells).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC))

    base = 0.6 * smooth(4, 5) + 0.4 * smooth(12, 16)
    texture = rng.normal(128, 40, (HEIGHT // 2, WIDTH // 2)).clip(0, 255).astype(np.uint8)
    texture = np.asarray(
        Image.fromarray(texture).resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR)
    )
    grain = rng.normal(0, 15, (HEIGHT, WIDTH, 1)) + rng.normal(0, 3, (HEIGHT, WIDTH, 3))
    picture = base + 0.3 * (texture[..., None] - 128.0) + grain
    return np.clip(picture, 0, 255).astype(np.uint8)


def make_images(root: Path, n: int) -> list[Path]:
    """``n`` JPEG files under ``root/<class>/``, each a distinct shift of one of DISTINCT
    photos; returns their paths in order."""
    from PIL import Image

    rng = np.random.default_rng(0)
    pictures = [photo(rng) for _ in range(min(n, DISTINCT))]
    paths = []
    for i in range(n):
        shifted = np.roll(pictures[i % len(pictures)], 7 * (i // len(pictures)), axis=1)
        path = root / f"class{i % CLASSES:02d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(shifted).save(path, "JPEG", quality=QUALITY)
        paths.append(path)
    return paths


def write_shards(root: Path, folder: Path) -> list[Path]:
    """The folder's files as SHARDS WebDataset shards (``<key>.jpg``, ``<key>.cls``)."""
    samples = ImageFolderLike(root).samples
    folder.mkdir(parents=True)
    shards = [folder / f"shard-{k:04d}.tar" for k in range(SHARDS)]
    for k, shard in enumerate(shards):
        with tarfile.open(shard, "w") as tar:
            for i in range(k, len(samples), SHARDS):
                path, label = samples[i]
                key = f"{i:06d}"
                tar.add(path, f"{key}.jpg")
                cls = str(label).encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(cls)
                tar.addfile(info, io.BytesIO(cls))
    return shards


def folder_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


# --------------------------------------------------------------------------- the ceiling


def crop_jpegs(paths: list[Path], count: int) -> list[bytes]:
    """``count`` JPEGs holding only a crop's region of the files, at the same quality."""
    from PIL import Image

    draw = random.Random(1)
    made = []
    for k in range(count):
        with Image.open(paths[k % len(paths)]) as image:
            left, top, w, h = crop_box(image.width, image.height, draw)
            out = io.BytesIO()
            image.crop((left, top, left + w, top + h)).save(out, "JPEG", quality=QUALITY)
        made.append(out.getvalue())
    return made


def measure_ceiling(paths: list[Path], count: int, repeats: int) -> dict[str, float]:
    """Images/s of simplejpeg decoding the crop regions alone: one core, and times the cores."""
    import simplejpeg

    crops = crop_jpegs(paths, count)

    def full() -> None:
        for data in crops:
            simplejpeg.decode_jpeg(data)

    def scaled() -> None:  # DCT scaling: the smallest size that still covers SIZE x SIZE
        for data in crops:
            simplejpeg.decode_jpeg(data, min_height=SIZE, min_width=SIZE)

    per_core = {
        name: count / best_of(run, repeats)[0] for name, run in (("full", full), ("scaled", scaled))
    }
    cores = os.cpu_count() or 1
    return {
        "crop_decode_one_core": per_core["full"],
        "crop_decode_scaled_one_core": per_core["scaled"],
        "cores": cores,
        "ceiling": max(per_core.values()) * cores,
    }


# --------------------------------------------------------------------------- loaders


def measure_loaders(ref: Any, root: Path, n: int, repeats: int) -> dict[str, float]:
    """Images/s of yogadl_plus's and the Pillow folder's DataLoaders, 2 workers and 0."""
    import torch

    crop = ydl.vision.RandomResizedCrop(SIZE, layout="CHW")

    def stream(threads: int) -> Callable[[], Any]:
        made = ref.stream(
            shuffle=True, shuffle_seed=0, batch_size=BATCH, fields=["image", "label"],
            transform=crop, num_workers=threads,
        )  # fmt: skip
        return lambda: made

    def ours(workers: int, threads: int = 0) -> Callable[[], Any]:
        return functools.partial(ydl.torch.make_dataloader, stream(threads)(), num_workers=workers)

    def pillow(workers: int) -> Callable[[], Any]:
        return functools.partial(
            torch.utils.data.DataLoader, ImageFolderLike(root), batch_size=BATCH, shuffle=True,
            num_workers=workers, persistent_workers=workers > 0,
        )  # fmt: skip

    check_batch(next(iter(ours(0)()))["image"])
    check_batch(next(iter(pillow(0)()))[0])
    rates = {}
    for name, make, key in (
        ("yogadl_plus, 2 DataLoader workers", ours(2), "image"),
        ("Pillow folder, 2 DataLoader workers", pillow(2), 0),
        ("yogadl_plus, 0 DataLoader workers", ours(0), "image"),
        ("Pillow folder, 0 DataLoader workers", pillow(0), 0),
        ("yogadl_plus, 0 DataLoader workers + 2 stream threads", ours(0, threads=2), "image"),
        ("yogadl_plus stream alone (no DataLoader), 2 stream threads", stream(2), "image"),
    ):
        rates[name] = loader_rate(n, make, key, repeats)
        print(f"{name}: {rates[name]:.0f} images/s", file=sys.stderr, flush=True)
    return rates


def check_batch(images: Any) -> None:
    shape, dtype = tuple(images.shape), str(images.dtype)
    if shape[1:] != (3, SIZE, SIZE) or dtype != "torch.uint8":
        raise RuntimeError(f"a batch of images is {shape} {dtype}, expected (N, 3, 224, 224) uint8")


# --------------------------------------------------------------------------- builds


def measure_builds(
    work: Path, root: Path, shards: list[Path], repeats: int
) -> tuple[dict[str, float], Any]:
    """Seconds of each build (the best of ``repeats``), and the folder's serial cache (kept)."""
    pattern = str(shards[0].parent / f"shard-{{0000..{len(shards) - 1:04d}}}.tar")
    sources = {
        "folder": lambda: ydl.sources.ImageFolder(str(root)),
        "shards": lambda: ydl.sources.WebDataset(pattern),
    }
    seconds: dict[str, list[float]] = {}
    kept: Any = None
    for k in range(repeats):
        for name, source in sources.items():
            for workers in (None, 2):
                label = f"yogadl_plus cache_dataset, {name}, " + (
                    "serial" if workers is None else f"workers={workers}"
                )
                folder = work / f"{name}-{workers}-{k}"
                build = functools.partial(
                    ydl.cache_dataset, source(), "images", "v1", ydl.LocalStorage(folder),
                    progress=False, workers=workers,
                )  # fmt: skip
                took, ref = time_once(build)
                seconds.setdefault(label, []).append(took)
                if kept is None:
                    kept = ref
                    continue
                ref.close()
                shutil.rmtree(folder, ignore_errors=True)
        copy = work / f"copy-{k}"
        took, _ = time_once(functools.partial(shutil.copytree, root, copy))
        seconds.setdefault("shutil.copytree of the folder", []).append(took)
        shutil.rmtree(copy)
    return {label: min(times) for label, times in seconds.items()}, kept


# --------------------------------------------------------------------------- peers


def peer_reason(venv: str) -> str | None:
    """Why the side venv ``venv`` is missing (its install error), or None where it exists."""
    failed = Path(BASELINE_VENVS, f"{venv}.failed")
    if failed.exists():
        return "did not install: " + " ".join(failed.read_text().split())[:600]
    if not Path(BASELINE_VENVS, venv, "bin", "python").exists():
        return f"no side venv .baselines/{venv}; {VENVS_HINT}"
    return None


def measure_peers(work: Path, root: Path, shards: Path, repeats: int, results: Results) -> None:
    for peer, (venv, _) in PEER_VENVS.items():
        reason = peer_reason(venv)
        if reason is None:
            args = [peer, "--root", str(root), "--shards", str(shards),
                    "--work", str(work / f"peer-{peer}"), "--repeats", str(repeats)]  # fmt: skip
            got = run_baseline(venv, "image_peers", args, timeout=smoke(300, 240))
            if isinstance(got, dict):
                results.peers[peer] = got
                print(f"{peer}: {got['images_per_s']:.0f} images/s", file=sys.stderr, flush=True)
                continue
            reason = got
        results.not_measured.append(f"{peer}: {reason}")
        print(f"{peer}: not measured: {reason[:300]}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the bucket


def measure_bucket(work: Path, root: Path, repeats: int, results: Results) -> None:
    """MB/s of the chunks read on demand, pulled, raw GETs of them, the ceiling, litdata."""
    with contextlib.ExitStack() as stack:
        try:
            server = start_seaweedfs(stack, work / "weed")
        except SystemExit:  # harness.skip: no SeaweedFS binary or no boto3 here
            results.not_measured.append("bucket: no local SeaweedFS here (tests' extras)")
            return
        bucket = server.make_bucket()
        built = ydl.cache_dataset(
            ydl.sources.ImageFolder(str(root)), "images", "v1",
            server.storage(bucket, "team", work / "builder"),
            chunk_bytes=smoke(8 << 20, 256 << 10), progress=False,
        )  # fmt: skip
        chunks = built.manifest.chunks
        total = sum(c.bytes for c in chunks)
        keys = [f"team/images/v1/{c.file}" for c in chunks]
        images = len(built)
        built.close()
        common = {"bucket": bucket, "endpoint": server.endpoint_url,
                  "key": server.access_key, "secret": server.secret_key}  # fmt: skip
        # on demand: a cache of half the version, with room for the window's chunks and those
        # fetched ahead; pulled whole: no limit.
        limit = max(total // 2, 12 * max(c.bytes for c in chunks))
        runs: dict[str, Callable[[int], float]] = {
            "yogadl_plus, on demand": lambda k: cold_epoch(
                common, work / f"reader-{k}", True, limit
            )[0],
            "yogadl_plus, pulled whole, then read": lambda k: cold_epoch(
                common, work / f"reader-{k}", False, None
            )[0],
            RAW_GETS: lambda k: raw_gets({**common, "keys": keys, "start_at": 0})["seconds"],
            CEILING: lambda k: gets_written_and_hashed(common, keys, work / f"ceiling-{k}"),
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for k in range(repeats):  # taken in turns: a change of load touches them all alike
            for name, run in runs.items():
                seconds[name].append(run(k))
        for name, taken in seconds.items():
            results.bucket[name] = {"mb_per_s": total / 1e6 / min(taken)}
            if name.startswith("yogadl_plus"):
                results.bucket[name]["images_per_s"] = images / min(taken)
        results.data.update(
            bucket_mb=total / 1e6, bucket_chunks=len(chunks), **unavoidable_work(work)
        )
        litdata_bucket(work, root, common, repeats, results)


RAW_GETS = "raw boto3 GETs, 8 threads"
CEILING = "the ceiling: raw GETs written to disk and hashed (sha256) on the way, 8 threads"


def gets_written_and_hashed(common: dict[str, str], keys: list[str], folder: Path) -> float:
    """Seconds of the raw GETs plus what a cache cannot skip: each object's bytes written to
    a file and hashed as they arrive (no read-back, no checks, no reads)."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=common["endpoint"], aws_access_key_id=common["key"],
        aws_secret_access_key=common["secret"], region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16),
    )  # fmt: skip
    folder.mkdir(parents=True)

    def get(key: str) -> str:
        body = client.get_object(Bucket=common["bucket"], Key=key)["Body"]
        digest = hashlib.sha256()
        with open(folder / key.replace("/", "_"), "wb") as f:
            for piece in body.iter_chunks(1 << 20):
                digest.update(piece)
                f.write(piece)
        return digest.hexdigest()

    began = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(get, keys))
    took = time.perf_counter() - began
    shutil.rmtree(folder)
    return took


def unavoidable_work(work: Path) -> dict[str, float]:
    """MB/s of this machine's sha256 and of writing a file (8 MiB at a time, to the page
    cache), on one core: what a cache pays per byte beyond the GETs."""
    import hashlib

    block, times = os.urandom(8 << 20), 16
    path = work / "write-speed"

    def hash_all() -> None:
        for _ in range(times):
            hashlib.sha256(block).digest()

    def write_all() -> None:
        with open(path, "wb") as f:
            for _ in range(times):
                f.write(block)

    mb = len(block) * times / 1e6
    speeds = {
        "sha256_mb_per_s": mb / best_of(hash_all, 3, 0.0)[0],
        "disk_write_mb_per_s": mb / best_of(write_all, 3, 0.0)[0],
    }
    path.unlink()
    return speeds


def cold_epoch(
    common: dict[str, str], cache: Path, on_demand: bool, limit: int | None
) -> tuple[float, int]:
    """(seconds, images) of one epoch from the bucket on the empty local cache ``cache``,
    opening the version included: shuffled in a window of 4 chunks, batches of 64."""
    storage = ydl.S3Storage(
        common["bucket"], "team", local_cache=cache, endpoint_url=common["endpoint"],
        aws_access_key_id=common["key"], aws_secret_access_key=common["secret"],
        region_name="us-east-1", local_cache_limit=limit,
    )  # fmt: skip
    began = time.perf_counter()
    ref = storage.fetch("images", "v1", on_demand=on_demand)
    stream = ref.stream(
        shuffle=True, shuffle_seed=0, shuffle_window=4, shard_by="chunks",
        batch_size=BATCH, fields=["image", "label"], transform=EncodedBytes(),
    )  # fmt: skip
    count = sum(len(batch["label"]) for batch in stream)
    seconds = time.perf_counter() - began
    if count != len(ref):
        raise RuntimeError(f"an epoch from the bucket gave {count} images, expected {len(ref)}")
    ref.close()
    shutil.rmtree(cache, ignore_errors=True)
    return seconds, count


class EncodedBytes:
    """The bucket read's transform: the record as the stream hands it out, its image field as
    the stored bytes (``encoded_fields``, as ``ydl.vision``'s transforms take it), so that the
    read measures moving bytes, not decoding them."""

    encoded_fields = ("image",)

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        return record


def litdata_bucket(
    work: Path, root: Path, common: dict[str, str], repeats: int, results: Results
) -> None:
    reason = peer_reason("images")
    if reason is None:
        args = ["litdata-s3", "--root", str(root), "--work", str(work / "peer-litdata"),
                "--repeats", str(repeats), "--workers", "0",
                "--s3-endpoint", common["endpoint"], "--s3-bucket", common["bucket"],
                "--s3-prefix", "litdata-images", "--s3-key", common["key"],
                "--s3-secret", common["secret"]]  # fmt: skip
        got = run_baseline("images", "image_peers", args, timeout=smoke(300, 240))
        if isinstance(got, dict):
            results.bucket["litdata StreamingDataset"] = got
            return
        reason = got
    results.not_measured.append(f"litdata from the bucket: {reason}")


# --------------------------------------------------------------------------- the section


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def section(results: Results, about: dict[str, Any], seconds: float) -> str:
    """The markdown section for docs/performance.md."""
    d = results.data
    lines = [
        "## Images: a folder of JPEGs to RandomResizedCrop(224)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `python -m bench.bench_images"
        f"{' (smoke mode: the figures mean nothing)' if SMOKE else ''}` ({seconds / 60:.1f} "
        f"min) on {about['cpus']} CPUs ({about['cpu_model']}), {about.get('memory_gib', '?')} "
        f"GiB RAM, {about['platform']}; Python {about['python']}, yogadl_plus "
        f"{about['yogadl_plus']} ({about['git_commit']}); "
        + ", ".join(f"{k} {v}" for k, v in about["libraries"].items())
        + f". Load average {about['load_average_at_start'][0]:.2f} at the start, "
        f"{d.get('load_at_end', [0])[0]:.2f} at the end.",
        "",
        f"Data: {d['images']} JPEGs of {WIDTH}x{HEIGHT}, quality {QUALITY}, mean "
        f"{d['mean_kb']:.1f} KB ({d['mb']:.0f} MB), {CLASSES} class folders; the same files in "
        f"{SHARDS} WebDataset shards. Every loader: RandomResizedCrop(224) + flip, uint8 CHW "
        "batches of 64, shuffled; best of "
        f"{d['repeats']} epochs after one untimed epoch.",
        "",
    ]
    lines += [*loader_table(results), "", *peer_table(results), ""]
    lines += [*build_table(results), "", *bucket_table(results)]
    if results.not_measured:
        lines += ["", "Not measured:", ""]
        lines += [f"- {reason}" for reason in results.not_measured]
    return "\n".join(lines) + "\n"


def loader_table(results: Results) -> list[str]:
    c = results.ceiling
    pillow = {w: results.loaders.get(f"Pillow folder, {w} DataLoader workers") for w in (2, 0)}
    lines = [
        "| loader | images/s | vs the Pillow folder, same workers | of the ceiling | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, value in results.loaders.items():
        workers = 2 if "2 DataLoader" in name else 0
        vs = "" if name.startswith("Pillow") else ratio(value, pillow[workers])
        met = (
            None
            if name.startswith("Pillow") or "threads" in name
            else (value / pillow[workers] >= 1.5 if pillow[workers] else None)
        )
        target = "" if met is None else target_cell(">= 1.5x", met)
        lines.append(f"| {name} | {value:.0f} | {vs} | {value / c['ceiling']:.0%} | {target} |")
    lines += [
        f"| ceiling: simplejpeg decoding the crop region alone, x {c['cores']} cores "
        f"({c['crop_decode_one_core']:.0f}/s a core at full size, "
        f"{c['crop_decode_scaled_one_core']:.0f}/s DCT-scaled to cover 224) "
        f"| {c['ceiling']:.0f} | | 100% | |",
        "",
        "The ceiling is every core decoding; a loader with 0 workers decodes on one (its "
        "stream's threads aside), so half the ceiling is its own.",
    ]
    return lines


def peer_table(results: Results) -> list[str]:
    ours = results.loaders.get("yogadl_plus, 2 DataLoader workers")
    lines = [
        "| peer | how it runs on 2 cores | images/s | yogadl_plus (2 workers) / peer "
        "| of the ceiling |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for peer, got in results.peers.items():
        version = got.get("versions", {}).get(PEER_VENVS[peer][1], "")
        lines.append(
            f"| {peer} {version} | {got['parallelism']} | {got['images_per_s']:.0f} "
            f"| {ratio(ours, got['images_per_s'])} "
            f"| {got['images_per_s'] / results.ceiling['ceiling']:.0%} |"
        )
    return lines


def build_table(results: Results) -> list[str]:
    d = results.data
    copy = results.builds.get("shutil.copytree of the folder")
    lines = [
        "| build | MB/s of input | vs shutil.copytree |",
        "| --- | ---: | ---: |",
    ]
    rows = dict(results.builds)
    for peer, label in (("litdata", "litdata optimize, 2 workers"),
                        ("ffcv", "FFCV DatasetWriter (re-encodes), 2 workers")):  # fmt: skip
        if "build_s" in results.peers.get(peer, {}):
            rows[label] = results.peers[peer]["build_s"]
    for name, seconds in rows.items():
        size = d["shard_mb"] if ", shards," in name else d["mb"]
        lines.append(f"| {name} | {size / seconds:.0f} | {ratio(copy, seconds)} |")
    if "beton_bytes" in results.peers.get("ffcv", {}):
        beton = results.peers["ffcv"]["beton_bytes"] / 1e6
        lines += ["", f"FFCV's file holds {beton:.0f} MB for {d['mb']:.0f} MB of JPEGs "
                  "(it decodes each image and encodes it again at quality 90)."]  # fmt: skip
    return lines


def bucket_table(results: Results) -> list[str]:
    raw = results.bucket.get(RAW_GETS, {}).get("mb_per_s")
    ceiling = results.bucket.get(CEILING, {}).get("mb_per_s")
    lines = [
        "| from the bucket (cold) | MB/s | images/s | vs raw GETs | of the ceiling | target |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, got in results.bucket.items():
        images = f"{got['images_per_s']:.0f}" if "images_per_s" in got else ""
        met = got["mb_per_s"] / raw >= 0.8 if raw and name.endswith("on demand") else None
        target = "" if met is None else target_cell(">= 0.8x", met)
        of_ceiling = ratio(got["mb_per_s"], ceiling) if name.startswith("yogadl_plus") else ""
        lines.append(
            f"| {name} | {got['mb_per_s']:.0f} | {images} | {ratio(got['mb_per_s'], raw)} "
            f"| {of_ceiling} | {target} |"
        )
    d = results.data
    if "sha256_mb_per_s" in d:
        lines += [
            "",
            f"On this machine sha256 runs at {d['sha256_mb_per_s']:.0f} MB/s and a file is "
            f"written at {d['disk_write_mb_per_s']:.0f} MB/s on one core: every byte read "
            "from a bucket into a cache is written once and hashed once, and with the GETs "
            "and the server on the same cores that is the ceiling's row.",
        ]
    return lines


# --------------------------------------------------------------------------- the run


def run(args: argparse.Namespace, work: Path, results: Results) -> None:
    root = work / "images"
    paths = make_images(root, args.images)
    shards = write_shards(root, work / "shards")
    total = folder_bytes(paths)
    results.data.update(
        images=len(paths), mb=total / 1e6, mean_kb=total / len(paths) / 1e3,
        shard_mb=folder_bytes(shards) / 1e6, repeats=args.repeats,
    )  # fmt: skip
    print(f"{len(paths)} images, mean {total / len(paths) / 1e3:.1f} KB", file=sys.stderr)
    if args.only == "bucket":
        measure_bucket(work, root, args.repeats, results)
        return
    results.ceiling = measure_ceiling(paths, smoke(400, 32), args.repeats)
    results.builds, ref = measure_builds(work / "builds", root, shards, smoke(2, 1))
    results.loaders = measure_loaders(ref, root, len(paths), args.repeats)
    ref.close()
    measure_peers(work, root, work / "shards", args.repeats, results)
    try:
        measure_bucket(work, root, args.repeats, results)
    except Exception as error:  # the figures above still count; the section says why not
        results.not_measured.append(f"bucket: {type(error).__name__}: {error}"[:600])
        print(f"bucket: {error!r}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=smoke(1500, 64))
    parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="epochs per figure")
    parser.add_argument("--tmp", default=None, help="parent of the scratch folder")
    parser.add_argument("--json", help="also write every figure here")
    parser.add_argument("--section", help="also write the markdown section here")
    parser.add_argument(
        "--only", choices=["all", "bucket"], default="all",
        help="bucket: only the read from a bucket (4.), its table alone",
    )  # fmt: skip
    args = parser.parse_args(argv)
    random.seed(0)
    about = describe_machine()
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="ydl-images-", dir=args.tmp))
    results = Results()
    try:
        run(args, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results.data["load_at_end"] = os.getloadavg()
    if args.only == "bucket":
        text = "\n".join([f"{results.data}", "", *bucket_table(results)]) + "\n"
    else:
        text = section(results, about, time.perf_counter() - began)
    print(text)
    if args.section:
        Path(args.section).write_text(text)
    write_json(args.json, vars(results), info=about)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
