"""ydl.sources.WebDataset: tar shards read by streaming, samples grouped by WebDataset's key
rule, each extension a typed field, and every malformed shard a clear error naming it."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.remote_helpers import filesystem_of
from PIL import Image

import yogadl_plus as ydl
from yogadl_plus.sources.locations import expand_braces

Members = list[tuple[str, bytes]]


def image_bytes(fmt: str = "PNG", size: int = 10, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size + 3, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def tar_bytes(members: Members, directories: tuple[str, ...] = ()) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in directories:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def samples(first: int, count: int) -> Members:
    """WebDataset samples as its writers make them: an image, a class, a caption, metadata."""
    members: Members = []
    for i in range(first, first + count):
        key = f"train/{i:05d}"
        members += [
            (f"{key}.jpg", image_bytes("JPEG", seed=i)),
            (f"{key}.cls", f"{i % 3}\n".encode()),
            (f"{key}.txt", f"a photo number {i} é".encode()),
            (f"{key}.json", json.dumps({"i": i}).encode()),
            (f"{key}.seg.PNG", image_bytes(seed=100 + i)),
            (f"{key}.npy", bytes([i, 0, 1])),
        ]
    return members


def shards(folder: Path, sizes: tuple[int, ...] = (3, 2, 4)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, first = [], 0
    for n, count in enumerate(sizes):
        path = folder / f"shard-{n:04d}.tar"
        path.write_bytes(tar_bytes(samples(first, count), directories=("train",)))
        paths.append(path)
        first += count
    return paths


def expected(first: int, count: int) -> list[dict[str, Any]]:
    """The records of ``samples(first, count)``, as WebDataset's rules make them."""
    return [
        {
            "__key__": f"train/{i:05d}",
            "jpg": image_bytes("JPEG", seed=i),
            "cls": i % 3,
            "txt": f"a photo number {i} é",
            "json": json.dumps({"i": i}),
            "seg.png": image_bytes(seed=100 + i),
            "npy": bytes([i, 0, 1]),
        }
        for i in range(first, first + count)
    ]


def plain(record: dict[str, Any]) -> dict[str, Any]:
    return {k: bytes(v) if isinstance(v, bytes) else v for k, v in record.items()}


def test_samples_become_typed_records_in_shard_order(tmp_path: Path) -> None:
    paths = shards(tmp_path / "wds")
    source = ydl.sources.WebDataset(str(tmp_path / "wds" / "shard-{0000..0002}.tar"))
    assert [s.path for s in source.shards] == [str(p) for p in paths]
    records = list(source.records())
    assert [plain(r) for r in records] == expected(0, 9)
    assert all(type(r["cls"]) is np.int64 for r in records)
    fields = {f.name: f for f in source.schema}
    assert list(fields) == ["__key__", "jpg", "cls", "txt", "json", "seg.png", "npy"]
    assert fields["cls"].dtype == np.int64 and fields["txt"].kind == "str"
    assert fields["npy"].kind == "bytes"
    assert isinstance(fields["jpg"].codec, ydl.codecs.Image)
    assert isinstance(fields["seg.png"].codec, ydl.codecs.Image)
    assert source.description() == ydl.sources.base.Description()  # reads no shard
    assert source.length is None


def test_urls_as_lists_globs_and_braces(tmp_path: Path) -> None:
    paths = [str(p) for p in shards(tmp_path / "wds")]
    folder = tmp_path / "wds"
    for urls in (
        paths,
        str(folder / "*.tar"),
        str(folder / "shard-000[0-2].tar"),
        str(folder / "shard-{0000,0001,0002}.tar"),
        [str(folder / "shard-0000.tar"), str(folder / "shard-{0001..0002}.tar")],
    ):
        assert [s.path for s in ydl.sources.WebDataset(urls).shards] == paths
    with pytest.raises(ydl.YogaError, match=r"shard-0003\.tar' does not exist"):
        ydl.sources.WebDataset(str(folder / "shard-{0000..0003}.tar"))
    with pytest.raises(ydl.YogaError, match="matches no file"):
        ydl.sources.WebDataset(str(folder / "*.tgz"))
    with pytest.raises(ydl.YogaError, match="is a folder"):
        ydl.sources.WebDataset(str(folder))


@pytest.mark.parametrize(
    "pattern, names",
    [
        ("s-{0000..0002}.tar", ["s-0000.tar", "s-0001.tar", "s-0002.tar"]),
        ("s-{8..11}", ["s-8", "s-9", "s-10", "s-11"]),
        ("s-{08..10}", ["s-08", "s-09", "s-10"]),
        ("{train,val}/{0..1}.tar", ["train/0.tar", "train/1.tar", "val/0.tar", "val/1.tar"]),
        ("a{b,c{d,e}}f", ["abf", "acdf", "acef"]),
        ("{x}-{1,2}", ["{x}-1", "{x}-2"]),
        ("plain.tar", ["plain.tar"]),
    ],
)
def test_braces_expand_as_a_shell_does(pattern: str, names: list[str]) -> None:
    assert expand_braces(pattern) == names


def test_the_parts_are_the_whole_in_order(tmp_path: Path) -> None:
    shards(tmp_path / "wds", sizes=(2, 0, 3, 1))  # an empty shard holds no sample: fine
    source = ydl.sources.WebDataset(str(tmp_path / "wds" / "*.tar"))
    parts = source.split(3)
    assert 1 < len(parts) <= 3 and all(p.offset is None for p in parts)
    assert [plain(r) for p in parts for r in p.records()] == expected(0, 6)
    assert all(p.schema == source.schema for p in parts)


def write_shard(tmp_path: Path, members: Members, name: str = "bad.tar") -> str:
    path = tmp_path / name
    path.write_bytes(tar_bytes(members))
    return str(path)


@pytest.mark.parametrize(
    "members, match",
    [
        ([("../x.jpg", b"")], r"'\.\./x\.jpg' has a path outside the shard"),
        ([("/abs/x.jpg", b"")], r"'/abs/x\.jpg' has a path outside the shard"),
        ([("a/../../x.cls", b"1")], "outside the shard"),
        ([("0001.cls", b"1"), ("README", b"hi")], r"'README' belongs to no sample"),
        ([("0001.cls", b"1"), ("0001.", b"")], r"'0001\.' belongs to no sample"),
        ([("0001.cls", b"1"), ("0001.CLS", b"2")], r"sample '0001' has a 'cls' member twice"),
        ([("0001.cls", b"one")], r"sample '0001', member \.cls: b'one' is not an integer"),
        ([("0001.txt", b"\xff\xfe")], r"member \.txt: not UTF-8"),
        ([("0001.jpg", b"")], r"member \.jpg: not an image that decodes \(no bytes"),
        ([("0001.jpg", image_bytes("JPEG")[:150])], r"member \.jpg: not an image that decodes"),
        ([("0001.png", b"text, not a picture")], r"member \.png: not an image that decodes"),
    ],
)
def test_a_malformed_shard_is_an_error_naming_it(
    tmp_path: Path, members: Members, match: str
) -> None:
    url = write_shard(tmp_path, members)
    with pytest.raises(ydl.YogaError, match=match) as caught:
        list(ydl.sources.WebDataset(url).records())
    assert url in str(caught.value)


def test_damaged_tar_files_are_errors_naming_them(tmp_path: Path) -> None:
    whole = tar_bytes(samples(0, 3))
    for name, data, match in (
        ("truncated.tar", whole[: len(whole) // 2], "truncated or damaged"),
        ("cut-in-a-header.tar", whole[:700], "truncated or damaged"),
        ("zero.tar", b"", "cannot read it as a tar file"),
        ("text.tar", b"this is not a tar file" * 40, "cannot read it as a tar file"),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ydl.YogaError, match=match) as caught:
            list(ydl.sources.WebDataset(str(path)).records())
        assert str(path) in str(caught.value), name


def test_no_sample_in_any_shard_is_an_error(tmp_path: Path) -> None:
    empty = [write_shard(tmp_path, [], f"empty-{i}.tar") for i in range(2)]
    with pytest.raises(ydl.YogaError, match="none of its 2 shards holds a sample"):
        ydl.sources.WebDataset(empty).schema  # noqa: B018
    only_folders = tmp_path / "folders.tar"
    only_folders.write_bytes(tar_bytes([], directories=("a", "a/b")))
    schema = ydl.Schema([ydl.Field("__key__", str)])
    with pytest.raises(ydl.YogaError, match="none of its 1 shards"):
        list(ydl.sources.WebDataset(str(only_folders), schema=schema).records())


def test_fields_missing_or_extra_against_the_schema(tmp_path: Path) -> None:
    members = [("a.cls", b"1"), ("a.txt", b"x"), ("b.cls", b"2"), ("c.cls", b"3"), ("c.txt", b"z")]
    url = write_shard(tmp_path, members)
    with pytest.raises(ydl.YogaError, match=r"bad\.tar, sample 'b': has no 'txt' member"):
        list(ydl.sources.WebDataset(url).records())
    nullable = ydl.Schema(
        [
            ydl.Field("__key__", str),
            ydl.Field("cls", np.int64),
            ydl.Field("txt", str, nullable=True),
        ]
    )
    records = list(ydl.sources.WebDataset(url, schema=nullable).records())
    assert [r["txt"] for r in records] == ["x", None, "z"]
    extra = write_shard(tmp_path, [("a.cls", b"1"), ("b.cls", b"2"), ("b.npy", b"")], "extra.tar")
    with pytest.raises(ydl.SchemaError, match=r"extra\.tar, sample 'b': has the field 'npy'"):
        list(ydl.sources.WebDataset(extra).records())
    with pytest.raises(ValueError, match="__key__"):
        ydl.sources.WebDataset(url, schema=ydl.Schema([ydl.Field("cls", np.int64)]))


def test_hidden_members_and_directories_are_skipped(tmp_path: Path) -> None:
    members = [("._0001.jpg", b"macOS metadata"), ("x/0001.cls", b"7"), ("x/.DS_Store", b"")]
    url = write_shard(tmp_path, members)
    assert list(ydl.sources.WebDataset(url).records()) == [{"__key__": "x/0001", "cls": 7}]


def test_the_fingerprint_follows_the_shards(tmp_path: Path) -> None:
    paths = shards(tmp_path / "wds")
    before = ydl.sources.WebDataset([str(p) for p in paths]).fingerprint()
    assert ydl.sources.WebDataset([str(p) for p in paths]).fingerprint() == before
    paths[1].write_bytes(tar_bytes(samples(0, 1)))
    assert ydl.sources.WebDataset([str(p) for p in paths]).fingerprint() != before


# --------------------------------------------------------------------------- builds


def test_a_build_keeps_every_member_byte_for_byte(
    tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    shards(tmp_path / "wds")
    source = ydl.sources.WebDataset(str(tmp_path / "wds" / "*.tar"))
    ref = ydl.cache_dataset(source, "wds", "v1", local_storage)
    for got, want in zip((ref[i] for i in range(len(ref))), expected(0, 9), strict=True):
        assert got.keys() == want.keys()
        for name in ("jpg", "seg.png"):  # images read back as Pillow decodes the member
            pixels = np.asarray(Image.open(io.BytesIO(want.pop(name))).convert("RGB"))
            assert got[name].dtype == np.uint8 and got[name].shape == pixels.shape
            assert np.abs(got.pop(name).astype(int) - pixels).max() <= 2  # libjpeg's rounding
        assert plain(got) == want
    assert ref.manifest.source_kind == "webdataset"


def test_a_broken_member_caches_nothing(tmp_path: Path, local_storage: ydl.LocalStorage) -> None:
    members = [*samples(0, 2), ("train/00002.jpg", image_bytes("JPEG")[:-200])]
    url = write_shard(tmp_path, members)
    with pytest.raises(ydl.YogaError, match=r"bad\.tar, sample 'train/00002', member \.jpg"):
        ydl.cache_dataset(ydl.sources.WebDataset(url), "wds", "v1", local_storage)
    assert local_storage.list() == []


def test_a_two_worker_build_equals_the_serial_one(
    tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    shards(tmp_path / "wds", sizes=(3, 1, 2, 0, 3))
    source = ydl.sources.WebDataset(str(tmp_path / "wds" / "*.tar"))
    serial = ydl.cache_dataset(source, "wds", "serial", local_storage)
    parallel = ydl.cache_dataset(source, "wds", "parallel", local_storage, workers=2)
    assert len(serial) == len(parallel) == 9 and serial.schema == parallel.schema
    for i in range(9):
        a, b = serial[i], parallel[i]
        assert all(np.array_equal(a[name], b[name]) for name in serial.schema.names), i


# --------------------------------------------------------------------------- buckets


@pytest.mark.servers
@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_shards_in_a_bucket(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, local_storage: ydl.LocalStorage
) -> None:
    filesystem, bucket = filesystem_of(kind, request)
    for path in shards(tmp_path / "wds"):
        with filesystem.open_output_stream(f"{bucket}/wds/{path.name}") as f:
            f.write(path.read_bytes())
    for urls in (f"{kind}://{bucket}/wds/shard-{{0000..0002}}.tar", f"{kind}://{bucket}/wds/*.tar"):
        source = ydl.sources.WebDataset(urls, filesystem=filesystem)
        assert [plain(r) for r in source.records()] == expected(0, 9)
    with pytest.raises(ydl.YogaError, match=rf"{kind}://{bucket}/wds/shard-0003\.tar' does not"):
        ydl.sources.WebDataset(f"{kind}://{bucket}/wds/shard-0003.tar", filesystem=filesystem)
    ref = ydl.cache_dataset(source, "wds", "v1", local_storage)
    assert list(ref.get_batch(range(9), ["__key__"])["__key__"]) == [
        e["__key__"] for e in expected(0, 9)
    ]
