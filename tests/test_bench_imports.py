"""Every benchmark module imports (the benchmarks themselves run with ``python -m bench.smoke``,
not in this suite)."""

from __future__ import annotations

import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
# Modules that import at their top what only their side venv has.
SIDE_VENV_ONLY = {"baselines.litdata_s3"}


def _modules() -> list[str]:
    found = []
    for folder in ("", "baselines"):
        for name in sorted(os.listdir(os.path.join(BENCH, folder))):
            if name.endswith(".py") and name != "__init__.py":
                found.append(".".join(p for p in (folder, name[:-3]) if p))
    return found


@pytest.mark.parametrize("name", [m for m in _modules() if m not in SIDE_VENV_ONLY])
def test_bench_module_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # As `python -m bench.<name>` from the repository root sees it: pytest itself puts only
    # tests/ on the path.
    monkeypatch.syspath_prepend(ROOT)
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench/{name}.py says nothing about what it measures"
