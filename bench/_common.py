"""Helpers shared by the benchmarks, including those run in the side venvs: stdlib only."""

from __future__ import annotations

import os


def warm(path: str) -> None:
    """Reads a file (or every file under a folder) once so that it sits in the page cache."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
