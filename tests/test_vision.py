"""Image fields read as their stored bytes (``get_batch(decode=False)``, a transform's
``encoded_fields``) and ``ydl.vision``'s transforms: torchvision's boxes, Pillow's pixels within
a measured tolerance, the same crops after a resume and with any workers, shards or face."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.augment import generator
from yogadl_plus.dataref import DataRefOnDemand
from yogadl_plus.vision import boxes as vision_boxes
from yogadl_plus.vision import transforms as vision_transforms
from yogadl_plus.vision.boxes import Box, random_resized_box

PIL = pytest.importorskip("PIL.Image")

SIZES = [(60, 80), (80, 60), (47, 53), (120, 90), (33, 200), (90, 120)] * 4


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A picture with smooth gradients and some noise, as photos have (JPEG keeps it well)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    # (Features scale with the picture, as in a photo taken at a higher resolution.)
    wave = 127 + 100 * np.sin(x * 40.0 / width) * np.cos(y * 30.0 / height)
    smooth = np.stack([x * 255 // width, y * 255 // height, wave], -1)
    return np.clip(smooth + rng.integers(-12, 12, smooth.shape), 0, 255).astype(np.uint8)


def image_schema(fmt: str, nullable: bool = False) -> ydl.Schema:
    return ydl.Schema(
        [
            ydl.Field(
                "image", np.uint8, (None, None, 3), codec=ydl.codecs.Image(fmt), nullable=nullable
            ),
            ydl.Field("label", np.int64, ()),
            ydl.Field("name", str, ()),
        ]
    )


def records(fmt: str = "jpeg") -> list[dict[str, Any]]:
    return [
        {"image": photo(h, w, i), "label": i, "name": f"{fmt}-{i}"}
        for i, (h, w) in enumerate(SIZES)
    ]


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    return ydl.LocalStorage(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def jpegs(storage: ydl.LocalStorage) -> ydl.DataRef:
    schema = image_schema("jpeg")
    return ydl.cache_dataset(records("jpeg"), "jpegs", "v", storage, schema=schema, progress=False)


@pytest.fixture(scope="module")
def pngs(storage: ydl.LocalStorage) -> ydl.DataRef:
    schema = image_schema("png")
    return ydl.cache_dataset(records("png"), "pngs", "v", storage, schema=schema, progress=False)


def encoded(array: np.ndarray, fmt: str = "JPEG", **options: Any) -> bytes:
    out = io.BytesIO()
    PIL.fromarray(array).save(out, format=fmt, **options)
    return out.getvalue()


# --- stored bytes on the read path ---


class LocalChunks:
    """A ChunkProvider whose chunks are already in place: the on-demand read path, no bucket."""

    keep_open_bytes = max_open_bytes = 1 << 30

    def acquire(self, number: int) -> Any:
        return self

    def release(self) -> None:
        pass

    def read_ahead(self, numbers: Any) -> None:
        pass

    def close(self) -> None:
        pass


def test_get_batch_decode_false_hands_out_the_stored_bytes(jpegs: ydl.DataRef) -> None:
    field = jpegs.schema["image"]
    indices = [3, 0, 7]
    on_demand = DataRefOnDemand(jpegs.directory, jpegs.manifest, None, LocalChunks())
    mixture = ydl.mix({"a": jpegs, "b": jpegs})
    wanted = [field.codec.encode(field, records()[i]["image"]) for i in indices]
    for source in (jpegs, on_demand):
        batch = source.get_batch(indices, decode=False)
        assert batch["image"] == wanted  # the JPEG files byte for byte
        assert batch["label"].tolist() == indices and batch["name"] == [
            f"jpeg-{i}" for i in indices
        ]
        decoded = source.get_batch(indices)["image"]
        assert all(np.array_equal(a, field.codec.decode(field, b)) for a, b in zip(decoded, wanted))
    mixed = mixture.get_batch(np.arange(len(mixture)), ["image"], decode=False)["image"]
    assert all(type(value) is bytes for value in mixed)
    assert sorted(mixed) == sorted(
        jpegs.get_batch(np.arange(len(jpegs)), decode=False)["image"] * 2
    )


def test_a_null_image_s_stored_bytes_are_none(tmp_path: Path) -> None:
    rows = [
        {"image": photo(8, 8), "label": 0, "name": "a"},
        {"image": None, "label": 1, "name": "b"},
    ]
    schema = image_schema("png", nullable=True)
    ref = ydl.cache_dataset(
        rows, "d", "v", ydl.LocalStorage(tmp_path), schema=schema, progress=False
    )
    stored = ref.get_batch([0, 1], "image", decode=False)["image"]
    assert stored[0][:8] == b"\x89PNG\r\n\x1a\n" and stored[1] is None
    with pytest.raises(ydl.TransformError, match=r"record 1, field 'image': got None"):
        list(ref.stream(transform=ydl.vision.Decode()))


def test_an_image_folder_s_files_come_back_byte_for_byte_and_crop(tmp_path: Path) -> None:
    files = {}
    for i, (name, fmt) in enumerate(
        [("cat/a.jpg", "JPEG"), ("cat/b.png", "PNG"), ("dog/c.jpg", "JPEG")]
    ):
        path = tmp_path / "photos" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded(photo(40 + 10 * i, 60, i), fmt))
        files[name] = path.read_bytes()
    source = ydl.sources.ImageFolder(tmp_path / "photos")
    ref = ydl.cache_dataset(source, "folder", "v", ydl.LocalStorage(tmp_path / "s"), progress=False)
    stored = ref.get_batch(np.arange(3), decode=False)
    assert dict(zip(stored["path"], stored["image"])) == files
    crop = ydl.vision.RandomResizedCrop(24, layout="CHW")
    batch = next(iter(ref.stream(transform=crop, batch_size=3)))
    assert batch["image"].shape == (3, 3, 24, 24) and batch["label"].tolist() == [0, 0, 1]


class Kinds:
    """A transform that takes the image field encoded and says what it got."""

    encoded_fields = ("image",)

    def __call__(self, record: dict[str, Any]) -> tuple[str, int, str]:
        return type(record["image"]).__name__, int(record["label"]), type(record["name"]).__name__


@pytest.mark.parametrize(("workers", "worker_type"), [(0, "thread"), (2, "thread"), (2, "process")])
def test_a_transform_with_encoded_fields_gets_the_stored_bytes(
    jpegs: ydl.DataRef, workers: int, worker_type: str
) -> None:
    stream = jpegs.stream(transform=Kinds(), num_workers=workers, worker_type=worker_type)
    assert list(stream) == [("bytes", i, "str") for i in range(len(SIZES))]
    mixed = ydl.mix({"a": jpegs, "b": jpegs}).stream(transform=Kinds(), batch_size=4)
    assert {kind for batch in mixed for kind, _, _ in batch} == {"bytes"}


def test_stats_count_the_bytes_handed_over(jpegs: ydl.DataRef) -> None:
    stream = jpegs.stream(transform=Kinds())
    list(stream)
    stored = jpegs.get_batch(np.arange(len(jpegs)), ["image", "name"], decode=False)
    expected = sum(map(len, stored["image"])) + sum(map(len, stored["name"])) + 8 * len(jpegs)
    assert stream.stats().bytes == expected


def test_encoded_fields_that_a_stream_cannot_honour_are_value_errors(jpegs: ydl.DataRef) -> None:
    ngram = ydl.NGram({0: ["image"], 1: ["image"]}, delta_threshold=10, timestamp_field="label")
    with pytest.raises(ValueError, match=r"takes fields \['image'\] encoded.*n-gram windows"):
        jpegs.stream(transform=Kinds(), ngram=ngram)

    class Named(Kinds):
        encoded_fields = "image"  # type: ignore[assignment]

    with pytest.raises(ValueError, match=r"encoded_fields='image': expected a tuple of field"):
        jpegs.stream(transform=Named())


# --- the box: torchvision's RandomResizedCrop.get_params, with the same draws ---


def torchvision_box(height, width, scale, ratio, uniform, randint) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, line for line, with its random
    draws made by ``uniform(low, high)`` and ``randint(low, high_exclusive)``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * uniform(scale[0], scale[1])
        aspect_ratio = math.exp(uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = randint(0, height - h + 1)
            j = randint(0, width - w + 1)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = round(w / min(ratio))
    elif in_ratio > max(ratio):
        h = height
        w = round(h * max(ratio))
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


bounds = st.tuples(st.floats(0.01, 3.0), st.floats(0.0, 3.0)).map(lambda b: (b[0], b[0] + b[1]))


@settings(max_examples=150, deadline=None)
@given(
    height=st.integers(1, 3000),
    width=st.integers(1, 3000),
    scale=bounds,
    ratio=bounds,
    seed=st.integers(0, 2**32),
)
def test_the_box_is_torchvision_s_with_the_same_draws(height, width, scale, ratio, seed) -> None:
    ours = random_resized_box(height, width, scale, ratio, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    theirs = torchvision_box(
        height, width, scale, ratio, rng.uniform, lambda lo, hi: int(rng.integers(lo, hi))
    )
    assert (ours.top, ours.left, ours.height, ours.width) == theirs
    assert ours.top >= 0 and ours.top + ours.height <= height
    assert ours.left >= 0 and ours.left + ours.width <= width


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(1, 2000),
    width=st.integers(1, 2000),
    size=st.integers(1, 600),
    resize=st.one_of(st.none(), st.integers(1, 700)),
)
def test_the_centre_box_is_resize_then_centre_crop(height, width, size, resize) -> None:
    box = vision_boxes.center_box(height, width, (size, size), resize)
    # torchvision's Resize(resize) then CenterCrop(size), the crop mapped back.
    short, long = sorted((height, width))
    new_short, new_long = (resize, int(resize * long / short)) if resize else (short, long)
    new_h, new_w = (new_long, new_short) if width <= height else (new_short, new_long)
    if size <= min(new_h, new_w):
        top = round((new_h - size) / 2.0)
        left = round((new_w - size) / 2.0)
        assert box.top == round(top * height / new_h) and box.left == round(left * width / new_w)
        assert (
            abs(box.height - size * height / new_h) <= 1
            and abs(box.width - size * width / new_w) <= 1
        )
    assert box.top >= 0 and box.left >= 0 and box.height >= 1 and box.width >= 1
    assert box.top + box.height <= height and box.left + box.width <= width


# --- the pixels: Pillow's crop and bilinear resize, within a measured tolerance ---


def pillow_reference(data: bytes, box: Box, size: int, flip: bool) -> np.ndarray:
    """What torchvision's Pillow path does: decode whole, crop, bilinear resize, flip."""
    with PIL.open(io.BytesIO(data)) as image:
        crop = image.convert("RGB").crop(
            (box.left, box.top, box.left + box.width, box.top + box.height)
        )
    out = crop.resize((size, size), PIL.Resampling.BILINEAR)
    if flip:
        out = out.transpose(PIL.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def drawn_box(height: int, width: int, transform: Any, index: int) -> tuple[Box, bool]:
    rng = generator(transform.seed, 0, index, "")
    box = random_resized_box(height, width, transform.scale, transform.ratio, rng)
    return box, bool(rng.random() < transform.flip)


def differences(data: bytes, height: int, width: int, transform: Any, count: int) -> np.ndarray:
    """|ours - Pillow's| over ``count`` records' crops of the image in ``data``."""
    size = transform.size[0]
    out = []
    for index in range(count):
        ours = transform.apply({"image": data}, 0, 0, index, "")["image"]
        box, flip = drawn_box(height, width, transform, index)
        out.append(np.abs(ours.astype(int) - pillow_reference(data, box, size, flip)))
    return np.stack(out)


def test_jpeg_crops_are_pillow_s_within_a_level(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = record_scales(monkeypatch)
    data = encoded(photo(300, 400), quality=90)
    diff = differences(data, 300, 400, ydl.vision.RandomResizedCrop(96, seed=1), 12)
    assert set(scales) == {1, 2}  # crops of 192 pixels or more are decoded at half size
    # libjpeg-turbo through simplejpeg and through Pillow, torch's resize and Pillow's: measured
    # within 1 level without DCT scaling. Scaled, libjpeg averages blocks where the bilinear
    # filter weighs a wider window, and the box's edges round to the scaled picture's pixels:
    # measured mean 0.6, max 15 levels on this noisy picture.
    assert diff.mean() < 1.5 and diff.max() <= 24
    exact = ydl.vision.RandomResizedCrop(96, scale=(0.05, 0.1), seed=1)  # boxes under 192
    scales.clear()
    assert differences(data, 300, 400, exact, 12).max() <= 2 and set(scales) == {1}


def test_a_big_jpeg_decoded_at_a_quarter_is_near_pillow_s(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = record_scales(monkeypatch)
    data = encoded(photo(1200, 1600), quality=90)
    crop = ydl.vision.RandomResizedCrop(224, scale=(0.6, 1.0), seed=2)
    diff = differences(data, 1200, 1600, crop, 3)
    assert set(scales) == {4}  # 1200x1600 to 224: decoded at 300x400
    # As above, at a quarter: measured mean 0.8, max 8 levels.
    assert diff.mean() < 1.5 and diff.max() <= 16


def test_png_crops_are_pillow_s_within_a_level() -> None:
    data = encoded(photo(120, 160), "PNG")
    assert differences(data, 120, 160, ydl.vision.RandomResizedCrop(48, seed=3), 10).max() <= 1


def record_scales(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The DCT scales the transforms decode at, from now on."""
    scales: list[int] = []
    decode = vision_transforms.decode_image

    def recorded(data: Any, channels: int | None = 3, scale: int = 1, **rest: Any) -> np.ndarray:
        scales.append(scale)
        return decode(data, channels=channels, scale=scale, **rest)

    monkeypatch.setattr(vision_transforms, "decode_image", recorded)
    return scales


def test_centre_crop_after_a_resize_is_torchvision_s(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = record_scales(monkeypatch)
    data = encoded(photo(300, 400), "PNG")
    ours = ydl.vision.CenterCrop(100, resize=114)({"image": data})["image"]
    with PIL.open(io.BytesIO(data)) as image:
        resized = image.convert("RGB").resize((152, 114), PIL.Resampling.BILINEAR)
    theirs = np.asarray(resized)[7:107, 26:126]
    # One crop and one resize of the region, where torchvision resizes the whole and crops:
    # the region's edges round to whole pixels (here 0.4 of one), and the filter does not
    # reach past them. Measured on this noisy picture: mean 1.5, max 9 levels.
    diff = np.abs(ours.astype(int) - theirs)
    assert diff.mean() < 2.5 and diff.max() <= 16
    jpeg = encoded(photo(600, 800))
    assert ydl.vision.CenterCrop(64, resize=80)({"image": jpeg})["image"].shape == (64, 64, 3)
    assert scales[-1] == 4  # a region of 480 (64 of 80 of 600) to 64: 480 >= 4 * 64


def test_layouts_flips_and_other_fields() -> None:
    data = encoded(photo(90, 120))
    record = {"image": data, "label": np.int64(4), "name": "x", "extra": [1, 2]}
    hwc = ydl.vision.RandomResizedCrop(32, flip=0.0, seed=5).apply(record, 0, 1, 3, "")
    chw = ydl.vision.RandomResizedCrop(32, flip=0.0, layout="CHW", seed=5).apply(
        record, 0, 1, 3, ""
    )
    flipped = ydl.vision.RandomResizedCrop(32, flip=1.0, seed=5).apply(record, 0, 1, 3, "")
    assert hwc["image"].shape == (32, 32, 3) and hwc["image"].dtype == np.uint8
    assert chw["image"].flags.c_contiguous and np.array_equal(
        chw["image"], hwc["image"].transpose(2, 0, 1)
    )
    assert np.array_equal(flipped["image"], hwc["image"][:, ::-1])
    for out in (hwc, chw, flipped):
        assert (
            out["label"] is record["label"]
            and out["name"] == "x"
            and out["extra"] is record["extra"]
        )
    assert record["image"] is data  # the record given is left as it was
    decoded = ydl.vision.Decode(layout="CHW")(record)["image"]
    assert np.array_equal(decoded, ydl.vision.Decode()(record)["image"].transpose(2, 0, 1))


def test_decoded_arrays_crop_as_their_lossless_files() -> None:
    picture = photo(70, 90)
    crop = ydl.vision.RandomResizedCrop((24, 40), seed=9)
    for index in range(5):
        from_array = crop.apply({"image": picture}, 0, 2, index, "s")["image"]
        from_png = crop.apply({"image": encoded(picture, "PNG")}, 0, 2, index, "s")["image"]
        assert from_array.shape == (24, 40, 3) and np.array_equal(from_array, from_png)
    grey = crop.apply({"image": picture[:, :, 0]}, 0, 0, 0, "")["image"]
    assert np.array_equal(grey[:, :, 0], grey[:, :, 2])


# --- bad records and bad arguments ---


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (lambda data: data[:-60], r"the JPEG does not decode"),
        (lambda data: data[:200], r"(the JPEG does not decode|not an image Pillow reads)"),
        (lambda data: b"", r"no bytes at all"),
        (lambda data: b"not an image at all", r"not an image"),
        (lambda data: "a str", r"got a str"),
        (lambda data: np.zeros((4, 4), np.float32), r"got a float32 array of shape \(4, 4\)"),
    ],
)
def test_a_record_without_a_picture_is_a_transform_error(value, message) -> None:
    data = encoded(photo(40, 50))
    for transform in (
        ydl.vision.RandomResizedCrop(16),
        ydl.vision.CenterCrop(16),
        ydl.vision.Decode(),
    ):
        with pytest.raises(
            ydl.TransformError, match=r"record 7 of source 'web', field 'image': " + message
        ):
            transform.apply({"image": value(data)}, 0, 0, 7, "web")
    with pytest.raises(ydl.TransformError, match=r"field 'photo': the record has no such field"):
        ydl.vision.Decode(field="photo").apply({"image": data}, 0, 0, 7, "")


def test_truncated_bytes_in_a_stream_name_the_record_and_field(jpegs: ydl.DataRef) -> None:
    cut = jpegs.get_batch([2], decode=False)["image"][0][:-200]
    with pytest.raises(
        ydl.TransformError, match=r"record 2, field 'image': the JPEG does not decode"
    ):
        ydl.vision.RandomResizedCrop(16).apply({"image": cut, "label": 2}, 0, 0, 2, "")
    with pytest.raises(TypeError, match=r"stream\(transform=\.\.\.\)"):
        ydl.vision.RandomResizedCrop(16)({"image": cut})


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: ydl.vision.RandomResizedCrop(0), "size"),
        (lambda: ydl.vision.RandomResizedCrop((224, -1)), "size"),
        (lambda: ydl.vision.RandomResizedCrop((1, 2, 3)), "size"),
        (lambda: ydl.vision.RandomResizedCrop(8, scale=(1.0, 0.5)), "scale"),
        (lambda: ydl.vision.RandomResizedCrop(8, scale=(0.0, 0.5)), "scale"),
        (lambda: ydl.vision.RandomResizedCrop(8, ratio=(2.0, 1.0)), "ratio"),
        (lambda: ydl.vision.RandomResizedCrop(8, ratio="wide"), "ratio"),
        (lambda: ydl.vision.RandomResizedCrop(8, flip=1.5), "flip"),
        (lambda: ydl.vision.RandomResizedCrop(8, layout="NCHW"), "layout"),
        (lambda: ydl.vision.RandomResizedCrop(8, seed=-1), "seed"),
        (lambda: ydl.vision.CenterCrop(8, resize=0), "resize"),
        (lambda: ydl.vision.CenterCrop(-8), "size"),
        (lambda: ydl.vision.Decode(field=""), "field"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(make, argument) -> None:
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        make()


# --- the same crops after a resume, with workers, shards and faces ---

CROP = ydl.vision.RandomResizedCrop(20, layout="CHW")
ARGS: dict[str, Any] = dict(shuffle=True, shuffle_seed=7, transform=CROP, batch_size=4)


def crops(items) -> list[tuple[int, bytes]]:
    """(label, the crop's pixels) of each record, in order, from batches."""
    out = []
    for batch in items:
        for label, image in zip(np.asarray(batch["label"]).tolist(), np.asarray(batch["image"])):
            out.append((label, image.tobytes()))
    return out


@pytest.fixture(scope="module")
def reference(jpegs: ydl.DataRef) -> list[list[tuple[int, bytes]]]:
    stream = jpegs.stream(**ARGS)
    return [crops(stream), crops(stream)]


def test_each_record_gets_its_own_crop_in_each_epoch(reference) -> None:
    first, second = dict(reference[0]), dict(reference[1])
    assert sorted(first) == list(range(len(SIZES))) and len(set(first.values())) == len(SIZES)
    assert all(first[k] != second[k] for k in first)


def test_a_resumed_stream_crops_as_the_first_run(jpegs: ydl.DataRef, reference) -> None:
    stream = jpegs.stream(**ARGS)
    it = iter(stream)
    seen = crops(next(it) for _ in range(3))
    resumed = jpegs.stream(**ARGS)
    resumed.load_state(stream.state().to_dict())
    assert seen + crops(resumed) == reference[0] and crops(resumed) == reference[1]


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_workers_crop_as_reading_inline(jpegs: ydl.DataRef, reference, worker_type: str) -> None:
    stream = jpegs.stream(**ARGS, num_workers=2, worker_type=worker_type)
    assert [crops(stream), crops(stream)] == reference


def test_shards_crop_as_one_stream(jpegs: ydl.DataRef, reference) -> None:
    shards = []
    for rank in range(2):
        shards += crops(jpegs.stream(**ARGS, num_shards=2, shard_rank=rank))
    assert sorted(shards) == sorted(reference[0])


def test_a_dataloader_resumed_mid_epoch_crops_as_the_stream(jpegs: ydl.DataRef, reference) -> None:
    torch_face = pytest.importorskip("torch") and ydl.torch
    loader = torch_face.make_dataloader(jpegs.stream(**ARGS), num_workers=2)
    it = iter(loader)
    seen = crops(next(it) for _ in range(2))  # (np.asarray takes the tensors)
    state = loader.state_dict()
    del it
    again = torch_face.make_dataloader(jpegs.stream(**ARGS), num_workers=2)
    again.load_state_dict(state)
    assert seen + crops(again) == reference[0]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_ray_workers_crop_as_reading_inline(jpegs: ydl.DataRef, reference) -> None:
    stream = jpegs.stream(**ARGS, num_workers=2, worker_type="ray")
    assert crops(stream) == reference[0]


def test_a_mixture_crops_each_source_s_records_apart(jpegs: ydl.DataRef, pngs: ydl.DataRef) -> None:
    mix = ydl.mix({"jpeg": jpegs, "png": pngs})
    inline = crops(mix.stream(**ARGS))
    assert crops(mix.stream(**ARGS, num_workers=2, worker_type="process")) == inline
    assert len(set(pixels for _, pixels in inline)) == len(inline) == 2 * len(SIZES)


def test_crops_do_not_share_the_memory_a_thread_decodes_into() -> None:
    """Each JPEG is decoded into memory the thread reuses: a crop handed out must own its
    pixels, also where it is the whole picture at the output's size (no resize at all)."""
    crop = ydl.vision.CenterCrop(32, layout="HWC")
    first, second = encoded(photo(32, 32), "JPEG"), encoded(photo(32, 32)[::-1], "JPEG")
    kept = crop.apply({"image": first}, 0, 0, 0, "")["image"]
    before = kept.copy()
    crop.apply({"image": second}, 0, 0, 1, "")
    np.testing.assert_array_equal(kept, before)
