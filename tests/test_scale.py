"""The bookkeeping of a version with many chunks: a manifest of 10^4 chunks reads back exactly and
its damage is named down to the chunk; a DataRef sends its manifest to other processes without
encoding it again. (The figures: bench/bench_scale.py.)"""

from __future__ import annotations

import json
import pickle
import uuid

import numpy as np
import pytest

import yogadl_plus as ydl
from yogadl_plus.cache.manifest import ChunkInfo, Manifest

CHUNKS = 10_000
SCHEMA = ydl.Schema([ydl.Field("i", np.int64), ydl.Field("s", str)])


def many_chunks(format_version: int = 2, chunks: int = CHUNKS) -> Manifest:
    """A manifest naming ``chunks`` chunks in two parts, as a parallel build writes them."""
    half = max(chunks // 2, 1)
    infos = [
        ChunkInfo(
            file=f"b-0123456789abcdef/p{k // half:05d}-1a2b3c4d-chunk-{k % half:05d}.mdb",
            records=100 + k % 7,
            bytes=4096 * (1 + k % 5),
            sha256=uuid.uuid4().hex * 2,
            columns=("i",),
            id=uuid.uuid4().hex if format_version >= 2 else "",
        )
        for k in range(chunks)
    ]
    return Manifest("ds", "v1", SCHEMA, infos, "fp", "iterable", "0", format_version=format_version)


@pytest.mark.parametrize("format_version", [1, 2])
@pytest.mark.parametrize("chunks", [0, 1, CHUNKS])
def test_a_manifest_reads_back_what_was_written(format_version, chunks):
    manifest = many_chunks(format_version, chunks)
    text = manifest.to_json()
    back = Manifest.parse(text.encode(), "here")
    assert back == manifest
    assert back.num_records == manifest.num_records
    body = json.loads(text)
    assert [c["file"] for c in body["chunks"]] == [c.file for c in manifest.chunks]
    assert all(("id" in c) == (format_version >= 2) for c in body["chunks"])


def test_the_text_has_one_line_per_chunk():
    """Readable (and greppable) at any size: the fields, then each chunk on a line of its own."""
    manifest = many_chunks(chunks=20)
    lines = manifest.to_json().splitlines()
    chunk_lines = [line for line in lines if '"sha256"' in line]
    assert len(chunk_lines) == 20
    for line, info in zip(chunk_lines, manifest.chunks):
        assert json.loads(line.strip().rstrip(","))["sha256"] == info.sha256


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda c, all_: c.update(records=-1), r"chunks\[7777\]\.records"),
        (lambda c, all_: c.update(records=True), r"chunks\[7777\]\.records"),
        (lambda c, all_: c.update(bytes=0), r"chunks\[7777\]\.bytes"),
        (lambda c, all_: c.update(sha256=c["sha256"].upper()), r"chunks\[7777\]\.sha256"),
        (lambda c, all_: c.update(id=c["id"][:-1]), r"chunks\[7777\]\.id"),
        (lambda c, all_: c.update(file="../x.mdb"), r"chunks\[7777\]\.file"),
        (lambda c, all_: c.update(columns=["i", "i"]), r"chunks\[7777\]\.columns"),
        (lambda c, all_: c.update(columns=["s"]), r"chunks\[7777\]\.columns"),
        (lambda c, all_: c.update(columns="i"), r"chunks\[7777\]\.columns"),
        (lambda c, all_: c.update(offset=0), r"chunks\[7777\] has fields"),
        (lambda c, all_: c.pop("sha256"), r"chunks\[7777\] has fields"),
        (lambda c, all_: c.update(id=all_[3]["id"]), r"chunks\[3\] and chunks\[7777\]"),
        (lambda c, all_: c.update(file=c["file"].replace("-02777", "-02779")), "reordered"),
    ],
)
def test_damage_deep_in_a_long_chunk_list_is_named(damage, named):
    body = json.loads(many_chunks().to_json())
    damage(body["chunks"][7777], body["chunks"])
    counts = [c.get("records") for c in body["chunks"]]
    body["num_records"] = sum(n for n in counts if type(n) is int)
    with pytest.raises(ydl.CacheCorrupted, match=named):
        Manifest.parse(json.dumps(body).encode(), "here")


def test_chunks_with_different_columns_are_read_as_they_are():
    """Columns that change from one chunk to the next are checked chunk by chunk, and kept."""
    manifest = many_chunks(chunks=6)
    manifest.chunks[2:4] = [
        ChunkInfo(c.file, c.records, c.bytes, c.sha256, (), c.id) for c in manifest.chunks[2:4]
    ]
    back = Manifest.parse(manifest.to_json().encode(), "here")
    assert [c.columns for c in back.chunks] == [("i",), ("i",), (), (), ("i",), ("i",)]


def test_a_dataref_encodes_its_manifest_once_for_all_its_copies(tmp_path, monkeypatch):
    storage = ydl.LocalStorage(tmp_path)
    records = ({"i": np.int64(i), "s": f"s{i}"} for i in range(500))
    ref = ydl.cache_dataset(records, "ds", "v1", storage, chunk_bytes=800, progress=False)
    assert len(ref.manifest.chunks) > 3
    encoded = []
    to_json = Manifest.to_json
    monkeypatch.setattr(Manifest, "to_json", lambda self: encoded.append(1) or to_json(self))
    blobs = [pickle.dumps(ref) for _ in range(3)]
    copy = pickle.loads(blobs[0])
    again = pickle.loads(pickle.dumps(copy))
    assert len(encoded) == 1
    assert copy.manifest == ref.manifest == again.manifest
    for other in (copy, again):
        assert [int(other[i]["i"]) for i in (0, 250, 499)] == [0, 250, 499]
        other.close()


def test_a_version_with_more_chunks_than_the_soft_file_limit_reads(tmp_path):
    """Every open chunk holds a file descriptor: a shuffle over more chunks than a soft
    ``ulimit -n`` of 64 still reads every record (the reader raises the soft limit towards the
    hard one), where it used to fail with "Too many open files"."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        import yogadl_plus as ydl
        storage = ydl.LocalStorage({str(tmp_path)!r})
        records = ({{"i": i, "pad": b"x" * 3000}} for i in range(400))
        ref = ydl.cache_dataset(records, "files", "v1", storage, chunk_bytes=8_000, progress=False)
        assert len(ref.manifest.chunks) > 100, len(ref.manifest.chunks)
        seen = sorted(int(r["i"]) for r in ref.stream(shuffle=True, shuffle_seed=1))
        assert seen == list(range(400))
        print("ok", len(ref.manifest.chunks))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok")
