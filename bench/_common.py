"""Helpers shared by the benchmarks, including those run in the side venvs: stdlib only."""

from __future__ import annotations

import os
import re
import warnings


def warm(path: str) -> None:
    """Reads a file (or every file under a folder) once so that it sits in the page cache."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def target_cell(target: str, met: bool | None) -> str:
    """A table's target column: the target, and whether this run met it."""
    if not target:
        return ""
    return f"{target} — " + ("n/a" if met is None else "met" if met else "**MISSED**")


def collect_warnings() -> dict[str, int]:
    """From now on, count warnings by their first line instead of printing them (side-venv
    libraries warn thousands of times); the counts go into a benchmark's JSON."""
    seen: dict[str, int] = {}

    def on_warning(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        text = f"{category.__name__}: {str(message).splitlines()[0][:200]}"
        text = re.sub(r"name='[^']*'", "name=<a dataset file>", text)
        seen[text] = seen.get(text, 0) + 1

    warnings.showwarning = on_warning
    warnings.simplefilter("default")
    return seen
