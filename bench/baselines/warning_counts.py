"""Warnings counted instead of printed, for the side-venv baselines (stdlib only)."""

from __future__ import annotations

import re
import warnings


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
