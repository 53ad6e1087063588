"""Helpers for tests that damage caches the way users meet it: find a chunk file, flip a byte,
compare manifests across builds."""

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
