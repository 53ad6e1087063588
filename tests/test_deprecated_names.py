"""The import paths and names of the last release keep working, each with a DeprecationWarning
that points at the line using it and says what to use instead."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import yogadl_plus  # noqa: F401  (it makes the old paths importable)
from yogadl_plus.deprecation import MOVED, RENAMED


def _forget(monkeypatch: pytest.MonkeyPatch, old: str) -> None:
    """Import ``old`` afresh: as a user's first import of it in a process."""
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        monkeypatch.delitem(sys.modules, name)
    parent, _, child = old.rpartition(".")
    monkeypatch.delattr(sys.modules[parent], child, raising=False)


@pytest.mark.parametrize("old", [*MOVED, "yogadl_plus.build.starts", "yogadl_plus.build.spark"])
def test_an_old_module_path_gives_the_module_at_its_new_one_and_warns(old, monkeypatch):
    _forget(monkeypatch, old)
    new = old.replace(".build", ".building").replace("localcache", "mirror")
    new = new.replace("cachefiles", "mirrorfiles").replace("cachepins", "mirrorpins")
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated.*: import {new} instead"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # the same module, not a copy of its names


def test_a_value_set_through_the_old_path_is_the_one_the_package_reads(monkeypatch):
    _forget(monkeypatch, "yogadl_plus.build")
    with pytest.warns(DeprecationWarning) as caught:
        import yogadl_plus.build.starts as old
    from yogadl_plus.building import starts

    monkeypatch.setattr(old, "SERIAL_UNDER_SECONDS", 123.0)
    assert starts.SERIAL_UNDER_SECONDS == 123.0
    assert {w.filename for w in caught} == {__file__}  # the user's line, not importlib's


@pytest.mark.parametrize(
    "module, old", [(module, old) for module, names in RENAMED.items() for old in names]
)
def test_an_old_name_is_the_new_one_and_warns(module, old):
    new = RENAMED[module][old]
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"^{module}\.{old} is deprecated.*use {new}") as w:
        assert getattr(imported, old) is getattr(imported, new)
    assert w[0].filename == __file__
    with pytest.raises(AttributeError, match=f"has no attribute 'Nothing{old}'"):
        getattr(imported, f"Nothing{old}")


def test_the_old_imports_a_user_wrote_still_run():
    script = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import yogadl_plus\n"  # the new paths warn of nothing
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from yogadl_plus.build.front import cache_dataset\n"
        "from yogadl_plus.storage.localcache import LocalCache, RemoteManifest\n"
        "from yogadl_plus.mixture import Source\n"
        "from yogadl_plus.storage.mirror import Mirror\n"
        "assert LocalCache is Mirror and cache_dataset is yogadl_plus.cache_dataset\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
