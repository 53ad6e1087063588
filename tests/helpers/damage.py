"""Helpers for tests that look at caches on disk or damage them the way users meet it: find a
chunk file, list a version's files, flip a byte, compare manifests across builds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yogadl_plus as ydl


def chunk_path(ref: ydl.DataRef, number: int = 0) -> Path:
    """The file of chunk ``number`` of the version ``ref`` reads."""
    return Path(ref.directory, ref.manifest.chunks[number].file)


def flip_byte(path: str | os.PathLike[str], offset: int | None = None) -> int:
    """Flip the bits of one byte in place (same size, same inode); the offset flipped."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        where = size // 2 if offset is None else offset % size
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0xFF]))
    return where


def without_builds(manifest: Any) -> dict[str, Any]:
    """A manifest as JSON with its chunks' build folders left out: two copies of one version
    (pushed, pulled, copied) are equal but for where their files are."""
    body = json.loads(manifest.to_json())
    for chunk in body["chunks"]:
        chunk["file"] = os.path.basename(chunk["file"])
    return body


def version_files(storage: ydl.LocalStorage, dataset_id: str, version: str) -> set[str]:
    """The manifest and the chunk files of a version (paths inside its folder): nothing else a
    build left behind (verification stamps and the build's pin aside)."""
    folder = storage.path(dataset_id, version)
    found = set()
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if not name.endswith((".verified", "+pin")):
                found.add(os.path.relpath(os.path.join(dirpath, name), folder))
    return found


def written_names(ref: ydl.DataRef) -> set[str]:
    """The names a version's chunks were written under (without the build folder)."""
    return {os.path.basename(c.file) for c in ref.manifest.chunks}
