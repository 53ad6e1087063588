"""The peers' side of bench.bench_images: other loaders on the same JPEG folder (or the same
WebDataset shards), each in its side venv. Does not import yogadl_plus.

    .baselines/<venv>/bin/python -m bench.baselines.image_peers PEER --root DIR --shards DIR \
        --work DIR [--repeats 3] [--batch 64] [--workers 2] [--size 224]

Every peer hands out what the Pillow baseline does: RandomResizedCrop(224) (scale 0.08-1,
ratio 3/4-4/3) and a horizontal flip, as uint8 batches of 64 in CHW, with 2 worker processes
or its own parallelism on the same 2 cores (each PEER says which). Each figure is the best of
``--repeats`` epochs after one untimed epoch (workers started, page cache warm); every epoch
is checked to hand out each image once (its count) and the first batch's shape and dtype.

PEER (venv):

- ``webdataset`` (images): ``wds.WebDataset(shards, shardshuffle=...)`` ``.shuffle(1000)
  .decode("pil").to_tuple("jpg", "cls")``, the Pillow crop and flip
  (``pillow_images.random_resized_crop_flip``), ``.batched(64)``, in a torch DataLoader with
  2 workers (each worker reads its own shards);
- ``litdata`` (images): ``litdata.optimize`` of the files (each record the file's bytes and its
  class, 64 MB chunks, 2 worker processes; timed: the build), then ``StreamingDataset(shuffle=
  True)`` whose items are decoded and augmented with the same Pillow code, through
  ``StreamingDataLoader(batch_size=64, num_workers=2)``;
- ``spdl`` (spdl): SPDL's pipeline (``PipelineBuilder``: source, ``pipe(load, concurrency=2)``,
  ``aggregate(64)``, ``pipe(collate)``, 2 threads), each image decoded by FFmpeg through
  ``spdl.io.load_image`` with a filter graph ``crop=w:h:x:y,scale=224:224:flags=bilinear[,hflip]
  ,format=rgb24`` (the box drawn as torchvision draws it), the batch stacked and turned CHW;
- ``dali`` (dali): a DALI pipeline on the CPU (``device_id=None``, ``num_threads=2``):
  ``fn.readers.file(random_shuffle=True)`` (an epoch: ceil(N / 64) full batches, as its reader
  fills the last one from the next epoch), ``fn.decoders.image_random_crop(device="cpu")``
  (the same scale and ratio ranges), ``fn.resize(224, 224)`` (linear, antialiased) and
  ``fn.crop_mirror_normalize(dtype=UINT8, output_layout="CHW", mirror=coin flip)``;
- ``ffcv`` (ffcv): ``DatasetWriter`` of the images (``RGBImageField(write_mode="jpg",
  jpeg_quality=90)``: FFCV decodes and encodes each file again; timed: its build) and FFCV's
  ``Loader(order=RANDOM, num_workers=2)`` with ``RandomResizedCropRGBImageDecoder((224, 224)),
  RandomHorizontalFlip(), ToTensor(), ToTorchImage()``.
- ``litdata-s3`` (images): see ``--s3-*``: the ``litdata`` peer's optimize output uploaded to
  ``s3://BUCKET/PREFIX`` (untimed), then one cold epoch of ``StreamingDataset`` over it with an
  empty cache, the records' bytes not decoded, through ``StreamingDataLoader(batch_size=64)``
  with ``--workers`` workers: MB/s of the chunks.

The last line of stdout is one JSON object: ``images_per_s`` (best epoch), ``epochs_s``,
``images``, and where the peer builds something, ``build_s`` and ``build_bytes``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.baselines.pillow_images import (
    ImageFolderLike,
    crop_box,
    decode_crop_flip,
    random_resized_crop_flip,
)

SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def best_epochs(
    epoch: Callable[[], Iterable[Any]], images: int, repeats: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One untimed epoch, then ``repeats`` timed ones, each checked: every image once (by
    count) and the first batch a uint8 (batch, 3, size, size) array or tensor."""
    times = []
    for k in range(repeats + 1):
        began = time.perf_counter()
        count = 0
        for i, batch in enumerate(epoch()):
            if i == 0:
                check_batch(batch, args)
            count += len(batch)
        seconds = time.perf_counter() - began
        if count != images:
            raise RuntimeError(f"an epoch gave {count} images, expected {images}")
        if k:
            times.append(seconds)
    return {"images_per_s": images / min(times), "epochs_s": times, "images": images}


def check_batch(batch: Any, args: argparse.Namespace) -> None:
    shape, dtype = tuple(batch.shape), str(batch.dtype).replace("torch.", "")
    if shape[1:] != (3, args.size, args.size) or dtype != "uint8" or shape[0] > args.batch:
        raise RuntimeError(f"unexpected batch: shape {shape}, dtype {dtype}")


def samples(args: argparse.Namespace) -> list[tuple[str, int]]:
    return ImageFolderLike(Path(args.root)).samples


# --------------------------------------------------------------------------- WebDataset


def webdataset_peer(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import webdataset as wds

    urls = sorted(str(p) for p in Path(args.shards).glob("*.tar"))
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(random_resized_crop_flip, int)
        .batched(args.batch)
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0
    )
    n = len(samples(args))
    got = best_epochs(lambda: (images for images, _ in loader), n, args.repeats, args)
    return {**got, "parallelism": f"torch DataLoader, {args.workers} worker processes"}


# --------------------------------------------------------------------------- litdata


def litdata_record(item: tuple[str, int]) -> dict[str, Any]:
    """``optimize``'s ``fn``: a file's bytes as they are, and its class."""
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def litdata_augment(record: dict[str, Any]) -> tuple[Any, int]:
    """StreamingDataset's ``transform``: the Pillow decode, crop and flip."""
    return decode_crop_flip(record["image"]), record["label"]


def litdata_build(args: argparse.Namespace) -> tuple[Path, float, int]:
    import litdata

    items = samples(args)
    out = Path(args.work, "litdata").resolve()
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    litdata.optimize(
        fn=litdata_record,
        inputs=items,
        output_dir=str(out),
        chunk_bytes="64MB",
        num_workers=2,
        verbose=False,
    )
    seconds = time.perf_counter() - began
    return out, seconds, sum(os.path.getsize(p) for p, _ in items)


def litdata_peer(args: argparse.Namespace) -> dict[str, Any]:
    import litdata

    out, build_s, build_bytes = litdata_build(args)

    loader = litdata.StreamingDataLoader(
        litdata.StreamingDataset(str(out), shuffle=True, seed=0, transform=litdata_augment),
        batch_size=args.batch,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    got = best_epochs(
        lambda: (images for images, _ in loader), len(samples(args)), args.repeats, args
    )
    return {
        **got,
        "build_s": build_s,
        "build_bytes": build_bytes,
        "parallelism": f"StreamingDataLoader, {args.workers} worker processes; optimize: 2",
    }


def as_list(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """litdata-s3's collate: the records as they are (bytes of many lengths do not stack)."""
    return records


def litdata_s3_peer(args: argparse.Namespace) -> dict[str, Any]:
    """One cold epoch of litdata's StreamingDataset over a bucket (the records not decoded)."""
    import litdata

    from bench.baselines import litdata_s3  # its obstore fix for http:// endpoints

    s3 = argparse.Namespace(
        endpoint=args.s3_endpoint, access_key=args.s3_key, secret_key=args.s3_secret,
        region="us-east-1",
    )  # fmt: skip
    litdata_s3.point_env_at(s3)
    out = Path(args.work, "litdata").resolve()
    if not (out / "index.json").exists():
        out = litdata_build(args)[0]
    client = litdata_s3.s3_client(s3)
    total = 0
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        client.upload_file(str(path), args.s3_bucket, f"{args.s3_prefix}/{path.name}")
        total += path.stat().st_size
    times = []
    for k in range(args.repeats):
        cache = Path(args.work, f"litdata-cache-{k}").resolve()
        began = time.perf_counter()
        dataset = litdata.StreamingDataset(
            f"s3://{args.s3_bucket}/{args.s3_prefix}",
            shuffle=True,
            seed=0,
            cache_dir=str(cache),
            max_cache_size="100GB",
            storage_options=litdata_s3.storage_options(s3),
        )
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=args.batch, num_workers=args.workers, collate_fn=as_list
        )
        count = sum(len(batch) for batch in loader)
        times.append(time.perf_counter() - began)
        shutil.rmtree(cache, ignore_errors=True)
        if count != len(samples(args)):
            raise RuntimeError(f"litdata read {count} records, expected {len(samples(args))}")
    return {
        "mb_per_s": total / 1e6 / min(times),
        "images_per_s": count / min(times),
        "epochs_s": times,
        "bytes": total,
        "parallelism": f"StreamingDataLoader, {args.workers} worker processes",
    }


# --------------------------------------------------------------------------- SPDL


def spdl_peer(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    items = samples(args)
    size = args.size

    def load(item: tuple[str, int]) -> tuple[Any, int]:
        path, label = item
        with open(path, "rb") as f:
            data = f.read()
        # the header's size, as a loader that has not decoded the file yet knows it
        packets = spdl.io.demux_image(data)
        width, height = packets.width, packets.height
        left, top, w, h = crop_box(width, height)
        flip = ",hflip" if random.random() < 0.5 else ""
        graph = f"crop={w}:{h}:{left}:{top},scale={size}:{size}:flags=bilinear{flip},format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=graph)
        return frames, label

    def collate(batch: list[tuple[Any, int]]) -> Any:
        hwc = spdl.io.to_numpy(spdl.io.convert_frames([frames for frames, _ in batch]))
        return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))

    def epoch() -> Iterable[Any]:
        order = list(items)
        random.shuffle(order)
        pipeline = (
            PipelineBuilder()
            .add_source(order)
            .pipe(load, concurrency=args.workers)
            .aggregate(args.batch)
            .pipe(collate)
            .add_sink(4)
            .build(num_threads=args.workers)
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()

    got = best_epochs(epoch, len(items), args.repeats, args)
    return {**got, "parallelism": f"SPDL pipeline, {args.workers} threads (FFmpeg decodes)"}


# --------------------------------------------------------------------------- DALI


def dali_peer(args: argparse.Namespace) -> dict[str, Any]:
    from nvidia.dali import fn, pipeline_def, types

    items = samples(args)
    size = args.size

    @pipeline_def(batch_size=args.batch, num_threads=args.workers, device_id=None, seed=0)
    def pipeline() -> Any:
        jpegs, labels = fn.readers.file(file_root=args.root, random_shuffle=True, name="files")
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB, random_area=list(SCALE),
            random_aspect_ratio=list(RATIO), num_attempts=10,
        )  # fmt: skip
        images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
        images = fn.crop_mirror_normalize(
            images, dtype=types.UINT8, output_layout="CHW", mirror=fn.random.coin_flip(),
            mean=[0.0], std=[1.0],
        )  # fmt: skip
        return images, labels

    pipe = pipeline()
    pipe.build()
    # DALI's reader fills an epoch's last batch from the next epoch, so an "epoch" here is
    # ceil(N / 64) full batches, every image in them counted.
    batches = -(-len(items) // args.batch)

    def epoch() -> Iterable[Any]:
        import numpy as np

        for _ in range(batches):
            images, _ = pipe.run()
            yield np.asarray(images.as_array())

    got = best_epochs(epoch, batches * args.batch, args.repeats, args)
    return {**got, "parallelism": f"DALI CPU pipeline, num_threads={args.workers}"}


# --------------------------------------------------------------------------- FFCV


def ffcv_peer(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from PIL import Image

    items = samples(args)

    class Files:
        def __len__(self) -> int:
            return len(items)

        def __getitem__(self, i: int) -> tuple[Any, int]:
            path, label = items[i]
            with Image.open(path) as image:
                return image.convert("RGB"), label

    beton = str(Path(args.work, "images.beton"))
    writer = DatasetWriter(
        beton,
        {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
        num_workers=2,
    )
    began = time.perf_counter()
    writer.from_indexed_dataset(Files())
    build_s = time.perf_counter() - began
    loader = Loader(
        beton,
        batch_size=args.batch,
        num_workers=args.workers,
        order=OrderOption.RANDOM,
        drop_last=False,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((args.size, args.size), SCALE, RATIO),
                RandomHorizontalFlip(),
                ToTensor(),
                ToTorchImage(channels_last=False),
            ],
            "label": [IntDecoder(), ToTensor()],
        },
    )
    got = best_epochs(lambda: (images for images, _ in loader), len(items), args.repeats, args)
    return {
        **got,
        "build_s": build_s,
        "build_bytes": sum(os.path.getsize(p) for p, _ in items),
        "beton_bytes": int(np.int64(os.path.getsize(beton))),
        "parallelism": f"FFCV Loader, num_workers={args.workers} (threads)",
    }


PEERS = {
    "webdataset": webdataset_peer,
    "litdata": litdata_peer,
    "litdata-s3": litdata_s3_peer,
    "spdl": spdl_peer,
    "dali": dali_peer,
    "ffcv": ffcv_peer,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--root", required=True, help="the image folder (root/<class>/<file>)")
    parser.add_argument("--shards", default="", help="the folder of WebDataset .tar shards")
    parser.add_argument("--work", required=True, help="a scratch folder this peer may fill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=int, default=224)
    for name in ("endpoint", "bucket", "prefix", "key", "secret"):
        parser.add_argument(f"--s3-{name}", default="", help="litdata-s3: the bucket")
    args = parser.parse_args(argv)
    random.seed(0)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    result = PEERS[args.peer](args)
    result["versions"] = versions()
    print(json.dumps(result), flush=True)
    return 0


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("torch", "pillow", "webdataset", "litdata", "spdl", "nvidia-dali-cuda120", "ffcv"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


if __name__ == "__main__":
    sys.exit(main())
