"""Images, image sources and ``ydl.vision`` as users break them: decompression bombs, tar shards
that WebDataset's own reader takes or that would cache wrong samples, centre crops larger than
the picture, and EXIF orientation (ignored, as torchvision's loader ignores it)."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import yogadl_plus as ydl
from yogadl_plus.imagefiles import NotAnImage, check_image, decode_image, read_header


def picture(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def encoded(pixels: np.ndarray, fmt: str = "JPEG", **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **options)
    return out.getvalue()


# --- decompression bombs: a few bytes declaring gigapixels ---


def png_declaring(width: int, height: int) -> bytes:
    """A small PNG whose header declares ``width`` x ``height`` grey pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 16))
        + chunk(b"IEND", b"")
    )


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small baseline JPEG whose frame header declares ``width`` x ``height``."""
    data = bytearray(encoded(picture(8, 8)))
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", height, width)
    return bytes(data)


BOMBS = {"png": png_declaring(40_000, 40_000), "jpeg": jpeg_declaring(60_000, 60_000)}


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_decompression_bomb_is_not_an_image_not_a_bare_pillow_error(kind: str) -> None:
    # Pillow raises its own DecompressionBombError (no OSError); libjpeg-turbo allocates
    # the declared picture without asking. Both are refused from the header alone.
    for read in (read_header, check_image):
        with pytest.raises(NotAnImage, match=r"decompression bombs.*MAX_IMAGE_PIXELS"):
            read(BOMBS[kind])


def test_an_image_folder_with_a_bomb_fails_its_build_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "ok.jpg").write_bytes(encoded(picture(6, 8)))
    (tmp_path / "photos" / "cat" / "huge.png").write_bytes(BOMBS["png"])
    storage = ydl.LocalStorage(str(tmp_path / "caches"))
    source = ydl.sources.ImageFolder(tmp_path / "photos")
    with pytest.raises(ydl.YogaError, match=r"cat/huge\.png.*decompression bombs"):
        ydl.cache_dataset(source, "photos", "v1", storage, progress=False)
    assert storage.list() == []


def test_a_bomb_given_as_bytes_is_a_schema_error(tmp_path: Path) -> None:
    schema = ydl.Schema([ydl.Field("image", np.uint8, (None, None, 3), codec=ydl.codecs.Image())])
    storage = ydl.LocalStorage(str(tmp_path))
    with pytest.raises(ydl.SchemaError, match=r"field 'image'.*decompression bombs"):
        ydl.cache_dataset([{"image": BOMBS["jpeg"]}], "b", "v1", storage, schema=schema)
    assert storage.list() == []


def test_a_vision_transform_meeting_a_bomb_names_the_record() -> None:
    crop = ydl.vision.RandomResizedCrop(8)
    with pytest.raises(ydl.TransformError, match=r"record 3, field 'image'.*decompression"):
        crop.apply({"image": BOMBS["png"]}, 0, 0, 3, "")


# --- WebDataset shards ---


def tar_of(path: Path, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def cached(source: ydl.sources.Source, tmp_path: Path) -> ydl.DataRef:
    storage = ydl.LocalStorage(str(tmp_path / "caches"))
    return ydl.cache_dataset(source, "shards", "v1", storage, progress=False)


def test_a_sample_whose_members_are_not_consecutive_is_an_error(tmp_path: Path) -> None:
    # With every field nullable, this shard cached four half samples under two keys.
    shard = tar_of(
        tmp_path / "s.tar",
        [("a.cls", b"1"), ("b.cls", b"2"), ("a.txt", b"x"), ("b.txt", b"y")],
    )
    schema = ydl.Schema(
        [
            ydl.Field("__key__", str),
            ydl.Field("cls", np.int64, nullable=True),
            ydl.Field("txt", str, nullable=True),
        ]
    )
    with pytest.raises(ydl.YogaError, match=r"s\.tar: member 'a\.txt': sample 'a' came earlier"):
        cached(ydl.sources.WebDataset(shard, schema=schema), tmp_path)


def test_shard_metadata_members_are_skipped_as_webdataset_skips_them(tmp_path: Path) -> None:
    shard = tar_of(
        tmp_path / "s.tar",
        [("__index__", b"meta"), ("__meta__/info.json", b"{}"), ("a.cls", b"1"), ("b.cls", b"2")],
    )
    ref = cached(ydl.sources.WebDataset(shard), tmp_path)
    assert ref.schema.names == ("__key__", "cls") and [r["__key__"] for r in ref] == ["a", "b"]


def test_a_member_named_like_the_key_field_is_an_error_naming_it(tmp_path: Path) -> None:
    shard = tar_of(tmp_path / "s.tar", [("a.cls", b"1"), ("a.__key__", b"other")])
    with pytest.raises(ydl.YogaError, match=r"s\.tar: member 'a\.__key__'.*rename"):
        cached(ydl.sources.WebDataset(shard), tmp_path)


# --- CenterCrop of a picture smaller than the crop: torchvision pads it with black ---


def torchvision_center_crop(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """torchvision's ``F.center_crop``, line for line: pad with zeros where the crop is larger
    (the odd pixel after), then crop the centre."""
    height, width = pixels.shape[:2]
    pad_h, pad_w = max(size[0] - height, 0), max(size[1] - width, 0)
    padded = np.pad(
        pixels, ((pad_h // 2, (pad_h + 1) // 2), (pad_w // 2, (pad_w + 1) // 2), (0, 0))
    )
    top = round((padded.shape[0] - size[0]) / 2.0)
    left = round((padded.shape[1] - size[1]) / 2.0)
    return padded[top : top + size[0], left : left + size[1]]


@pytest.mark.parametrize(
    ("shape", "size"), [((1, 1), (4, 4)), ((5, 7), (9, 4)), ((6, 3), (6, 8)), ((5, 8), (12, 11))]
)
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_centre_crop_larger_than_the_picture_pads_as_torchvision(shape, size, layout) -> None:
    pixels = picture(*shape, seed=sum(shape))
    ours = ydl.vision.CenterCrop(size, layout=layout)({"image": encoded(pixels, "PNG")})["image"]
    theirs = torchvision_center_crop(pixels, size)
    assert np.array_equal(ours, theirs.transpose(2, 0, 1) if layout == "CHW" else theirs)


def test_centre_crop_after_a_resize_to_less_than_the_crop_pads_too() -> None:
    # Resize(8) of 16x24 is 8x12; CenterCrop(10) pads its height by one row each side.
    out = ydl.vision.CenterCrop(10, resize=8)({"image": encoded(picture(16, 24), "PNG")})["image"]
    assert out.shape == (10, 10, 3)
    assert not out[0].any() and not out[-1].any() and out[1:-1].any()


# --- EXIF orientation: ignored, as torchvision's pil_loader ignores it ---


def test_an_exif_rotated_jpeg_comes_as_stored_as_torchvision_loads_it(tmp_path: Path) -> None:
    pixels = picture(12, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    data = encoded(pixels, exif=exif.tobytes(), quality=95)
    with Image.open(io.BytesIO(data)) as image:
        theirs = np.asarray(image.convert("RGB"))  # torchvision's pil_loader
    assert read_header(data).height == 12 and np.array_equal(decode_image(data), theirs)
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "turned.jpg").write_bytes(data)
    ref = cached(ydl.sources.ImageFolder(tmp_path / "photos"), tmp_path)
    assert ref[0]["image"].shape == (12, 20, 3)


def test_a_symlink_loop_in_an_image_folder_is_refused_naming_both_names(tmp_path):
    """A link from a class folder to the root makes a walk go round: each image would be
    cached once per turn (pyarrow follows it until the system says the path is too deep)."""
    root = tmp_path / "root"
    (root / "cat").mkdir(parents=True)
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, "PNG")
    (root / "cat" / "a.png").write_bytes(buffer.getvalue())
    (root / "cat" / "again").symlink_to(root / "cat")
    with pytest.raises(ydl.YogaError, match="'cat/again' and 'cat' are the same folder"):
        ydl.sources.ImageFolder(root)
