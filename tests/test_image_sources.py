"""ydl.sources.ImageFolder and ydl.sources.Files: what they read, in what order, and how they
fail, against plain-Python references (torchvision's rules written out)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.remote_helpers import filesystem_of
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import yogadl_plus as ydl

TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def image_bytes(fmt: str = "PNG", width: int = 12, height: int = 8, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def torchvision_samples(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision's find_classes + make_dataset, in plain Python (hidden names left out, as
    ImageFolder documents): the classes, and (path below root, label) in its order."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name[0] != ".")
    samples = []
    for label, name in enumerate(classes):
        for folder, _subfolders, files in sorted(os.walk(root / name, followlinks=True)):
            if any(part.startswith(".") for part in Path(folder).relative_to(root).parts):
                continue
            for file in sorted(files):
                if file.lower().endswith(TORCHVISION_EXTENSIONS) and not file.startswith("."):
                    samples.append(((Path(folder) / file).relative_to(root).as_posix(), label))
    return classes, samples


def a_folder(root: Path) -> Path:
    """Two classes, nested folders, upper-case extensions, and files to leave out."""
    write(root / "dog" / "b.JPG", image_bytes("JPEG", seed=1))
    write(root / "dog" / "sub" / "a.png", image_bytes(seed=2))
    write(root / "dog" / "sub-x" / "c.webp", image_bytes("WEBP", seed=3))
    write(root / "cat" / "z.bmp", image_bytes("BMP", seed=4))
    write(root / "cat" / "notes.txt", b"not an image")
    write(root / "cat" / ".thumb.png", b"hidden: left out")
    write(root / ".cache" / "x.png", b"a hidden folder: no class")
    write(root / "loose.png", image_bytes(seed=5))  # not in a class folder: left out
    return root


def test_imagefolder_reads_what_torchvision_would(tmp_path: Path) -> None:
    root = a_folder(tmp_path / "root")
    source = ydl.sources.ImageFolder(root)
    classes, samples = torchvision_samples(root)
    assert source.classes == classes == ["cat", "dog"]
    assert source.class_to_idx == {"cat": 0, "dog": 1}
    records = list(source.records())
    assert [(r["path"], int(r["label"])) for r in records] == samples
    assert [r["path"] for r in records] == [
        "cat/z.bmp",
        "dog/b.JPG",
        "dog/sub/a.png",
        "dog/sub-x/c.webp",
    ]
    assert all(bytes(r["image"]) == (root / r["path"]).read_bytes() for r in records)
    assert all(isinstance(r["label"], np.int64) for r in records)
    assert source.length == 4 and source.description().length == 4
    assert source.schema.names == ("image", "label", "path")


names = st.sampled_from(["a", "a-b", "B", "c_d", "ä"])


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(
            names,
            st.sampled_from(["", "s", "s-t", "s/u", "S"]),
            st.sampled_from(["x", "Y", "x-1", "_z", "x.y"]),
            st.sampled_from([".jpg", ".PNG", ".txt", ".webp", ".Tiff"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_imagefolder_order_and_labels_are_torchvisions(tmp_path_factory: Any, files: Any) -> None:
    root = tmp_path_factory.mktemp("tree")
    png = image_bytes(width=2, height=2)
    for name, folder, stem, ext in files:
        write(root / name / folder / f"{stem}{ext}", png)
    classes, samples = torchvision_samples(root)
    empty = {c for c in classes if not any(label == classes.index(c) for _, label in samples)}
    if empty:
        with pytest.raises(ydl.YogaError, match="hold no image file"):
            ydl.sources.ImageFolder(root)
        return
    source = ydl.sources.ImageFolder(root)
    assert source.classes == classes
    assert [(r["path"], int(r["label"])) for r in source.records()] == samples


def test_imagefolder_parts_are_the_whole_in_order(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for i in range(7):
        write(root / f"c{i % 3}" / f"{i}.png", image_bytes(seed=i, width=8 + i))
    source = ydl.sources.ImageFolder(root)
    whole = [(r["path"], bytes(r["image"])) for r in source.records()]
    parts = source.split(3)
    assert 1 < len(parts) <= 3
    assert [p.offset for p in parts] == [0, *np.cumsum([p.length for p in parts])[:-1]]
    import pickle

    pieces = [pickle.loads(pickle.dumps(p)) for p in parts]
    assert [(r["path"], bytes(r["image"])) for p in pieces for r in p.records()] == whole


def test_imagefolder_fingerprint_follows_the_files(tmp_path: Path) -> None:
    root = a_folder(tmp_path / "root")
    before = ydl.sources.ImageFolder(root).fingerprint()
    assert ydl.sources.ImageFolder(root).fingerprint() == before
    write(root / "cat" / "z.bmp", image_bytes("BMP", seed=9, width=13))
    assert ydl.sources.ImageFolder(root).fingerprint() != before


@pytest.mark.parametrize(
    "name, data, reason",
    [
        ("zero.jpg", b"", "empty file"),
        ("truncated.jpg", image_bytes("JPEG", 32, 32)[:200], "decode"),
        ("text.png", b"hello, not a picture at all", "not an image"),
    ],
)
def test_imagefolder_refuses_a_file_that_does_not_decode_naming_it(
    tmp_path: Path, name: str, data: bytes, reason: str
) -> None:
    root = a_folder(tmp_path / "root")
    write(root / "dog" / "sub" / name, data)
    source = ydl.sources.ImageFolder(root)
    with pytest.raises(ydl.YogaError, match=reason) as caught:
        list(source.records())
    assert f"dog/sub/{name}" in str(caught.value) and str(root) in str(caught.value)


def test_imagefolder_without_classes_or_images_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ydl.YogaError, match="holds no class folder"):
        ydl.sources.ImageFolder(tmp_path / "empty")
    write(tmp_path / "flat" / "a.png", image_bytes())
    with pytest.raises(ydl.YogaError, match=r"no class folder \(1 files directly in it\)"):
        ydl.sources.ImageFolder(tmp_path / "flat")
    with pytest.raises(ydl.YogaError, match="does not exist"):
        ydl.sources.ImageFolder(tmp_path / "nowhere")
    with pytest.raises(ydl.YogaError, match="is a file"):
        ydl.sources.ImageFolder(tmp_path / "flat" / "a.png")
    root = a_folder(tmp_path / "root")
    (root / "bird").mkdir()
    write(root / "fish" / "notes.txt", b"")
    with pytest.raises(ydl.YogaError, match=r"\['bird', 'fish'\] hold no image file"):
        ydl.sources.ImageFolder(root)
    # Only the extensions asked for count.
    with pytest.raises(ydl.YogaError, match=r"\['cat'\] hold no image file"):
        ydl.sources.ImageFolder(a_folder(tmp_path / "again"), extensions=[".png", "jpg", "webp"])


# --------------------------------------------------------------------------- Files


def clips(path: str) -> list[dict[str, Any]]:
    """A file of numbers -> one record per number (a top-level function: it pickles)."""
    numbers = [int(x) for x in Path(path).read_text().split()]
    return [{"file": Path(path).name, "n": np.int64(n)} for n in numbers]


CLIPS = ydl.Schema([ydl.Field("file", str), ydl.Field("n", np.int64)])


def number_files(folder: Path, count: int = 6) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"f-{i:02d}.txt").write_text(" ".join(str(10 * i + k) for k in range(i % 3)))
    return [str(folder / f"f-{i:02d}.txt") for i in range(count)]


def test_files_gives_the_files_records_in_order(tmp_path: Path) -> None:
    paths = number_files(tmp_path / "in")
    expected = [(Path(p).name, 10 * i + k) for i, p in enumerate(paths) for k in range(i % 3)]
    for named in (paths, str(tmp_path / "in" / "f-*.txt"), str(tmp_path / "in" / "f-{00..05}.txt")):
        source = ydl.sources.Files(named, clips)
        assert source.paths == paths
        assert [(r["file"], int(r["n"])) for r in source.records()] == expected
    parts = ydl.sources.Files(paths, clips).split(4)
    assert [(r["file"], int(r["n"])) for p in parts for r in p.records()] == expected
    one = ydl.sources.Files(paths[:2], lambda p: {"path": p})
    assert list(one.records()) == [{"path": paths[0]}, {"path": paths[1]}]


def test_files_names_the_file_fn_failed_on(tmp_path: Path) -> None:
    paths = number_files(tmp_path / "in", 3)

    def fails_on_the_second(path: str) -> dict[str, Any]:
        if path.endswith("01.txt"):
            raise KeyError("no such clip")
        return {"p": path}

    with pytest.raises(ydl.YogaError, match=r"f-01\.txt.*raised KeyError") as caught:
        list(ydl.sources.Files(paths, fails_on_the_second).records())
    assert isinstance(caught.value.__cause__, KeyError)
    with pytest.raises(ydl.SchemaError, match=r"fn\('.*f-00\.txt'\) returned str"):
        list(ydl.sources.Files(paths, lambda p: "text").records())
    with pytest.raises(ydl.SchemaError, match="returned list"):
        list(ydl.sources.Files(paths, lambda p: [{"a": 1}, 2]).records())
    with pytest.raises(ydl.YogaError, match="matches no file"):
        ydl.sources.Files(str(tmp_path / "*.wav"), clips)
    with pytest.raises(TypeError, match="fn must be callable"):
        ydl.sources.Files(paths, "clips")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- builds


def stored(ref: ydl.DataRef, field: str) -> list[Any]:
    return list(ref.get_batch(list(range(len(ref))), [field])[field])


def test_imagefolder_build_keeps_each_file_and_decodes_it_as_pillow(
    tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    root = a_folder(tmp_path / "root")
    ref = ydl.cache_dataset(ydl.sources.ImageFolder(root), "folder", "v1", local_storage)
    paths = stored(ref, "path")
    assert paths == ["cat/z.bmp", "dog/b.JPG", "dog/sub/a.png", "dog/sub-x/c.webp"]
    assert [int(x) for x in stored(ref, "label")] == [0, 1, 1, 1]
    for i, path in enumerate(paths):
        expected = np.asarray(Image.open(root / path).convert("RGB"), dtype=np.int16)
        got = ref[i]["image"]
        assert got.shape == expected.shape and got.dtype == np.uint8
        assert np.abs(got.astype(np.int16) - expected).max() <= 2  # libjpeg's rounding
    assert ref.manifest.source_kind == "imagefolder"


def test_a_broken_image_caches_nothing(tmp_path: Path, local_storage: ydl.LocalStorage) -> None:
    root = a_folder(tmp_path / "root")
    write(root / "cat" / "y.jpg", image_bytes("JPEG", 32, 32)[:-300])
    with pytest.raises(ydl.YogaError, match=r"cat/y\.jpg"):
        ydl.cache_dataset(ydl.sources.ImageFolder(root), "folder", "v1", local_storage)
    assert local_storage.list() == []


def build_twice(source: Any, storage: ydl.LocalStorage, **parallel: Any) -> tuple[Any, Any]:
    serial = ydl.cache_dataset(source, "d", "serial", storage)
    other = ydl.cache_dataset(source, "d", "parallel", storage, **parallel)
    return serial, other


def assert_same(a: ydl.DataRef, b: ydl.DataRef) -> None:
    """The same records, field by field (images as read: decoded)."""
    assert len(a) == len(b) and a.schema == b.schema
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert all(np.array_equal(x[name], y[name]) for name in a.schema.names), i


def test_two_worker_builds_equal_serial_ones(
    tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    root = tmp_path / "root"
    for i in range(9):
        write(root / f"c{i % 2}" / f"{i}.png", image_bytes(seed=i))
    serial, parallel = build_twice(ydl.sources.ImageFolder(root), local_storage, workers=2)
    assert_same(serial, parallel)
    assert len(parallel.manifest.chunks) > 1  # written by parts
    files = ydl.sources.Files(number_files(tmp_path / "in", 8), clips)
    # (schema= given: a build that times its first records would build these few serially)
    a = ydl.cache_dataset(files, "f", "serial", local_storage, schema=CLIPS)
    b = ydl.cache_dataset(files, "f", "parallel", local_storage, workers=2, schema=CLIPS)
    assert_same(a, b)
    assert len(b.manifest.chunks) > 1


@pytest.mark.ray
def test_a_ray_build_of_files_equals_the_serial_one(
    tmp_path: Path, local_storage: ydl.LocalStorage, ray_cluster: Any
) -> None:
    paths = number_files(tmp_path / "in", 8)
    files = ydl.sources.Files(paths, lambda p: clips(p))  # Ray pickles a lambda too
    serial, on_ray = build_twice(files, local_storage, engine="ray")
    assert_same(serial, on_ray)


def test_a_parallel_build_names_fn_that_does_not_pickle(
    tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    files = ydl.sources.Files(number_files(tmp_path / "in", 4), lambda p: clips(p))
    with pytest.raises(ydl.YogaError, match="lambda"):
        ydl.cache_dataset(files, "f", "v1", local_storage, workers=2, schema=CLIPS)


# --------------------------------------------------------------------------- buckets


@pytest.mark.servers
@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_imagefolder_in_a_bucket(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    filesystem, bucket = filesystem_of(kind, request)
    local = a_folder(tmp_path / "root")
    for path in local.rglob("*"):
        if path.is_file():
            name = path.relative_to(local).as_posix()
            with filesystem.open_output_stream(f"{bucket}/photos/{name}") as f:
                f.write(path.read_bytes())
    source = ydl.sources.ImageFolder(f"{kind}://{bucket}/photos", filesystem=filesystem)
    here = ydl.sources.ImageFolder(local)
    assert source.classes == here.classes
    assert [(r["path"], int(r["label"]), bytes(r["image"])) for r in source.records()] == [
        (r["path"], int(r["label"]), bytes(r["image"])) for r in here.records()
    ]
    ref = ydl.cache_dataset(source, "folder", "v1", local_storage)
    assert stored(ref, "path") == [r["path"] for r in here.records()]
