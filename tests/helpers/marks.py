"""Pytest plugin: a test that starts a server, Ray or Spark carries the mark that says so.

``nox -s quick`` leaves out the tests marked ``servers``, ``ray``, ``spark``, ``crash`` and
``slow`` (registered in pyproject.toml, described in docs/contributing.md). What starts a
server, a Ray cluster or a Spark session calls :func:`require_mark` first: a test without the
mark fails there, saying which mark to add, instead of slowing the quick run down unnoticed.
(Session fixtures start once: the quick run, which deselects every marked test, is where an
unmarked one is caught.)
"""

from __future__ import annotations

import pytest

_running: list[pytest.Item] = []  # the test being set up or run, if any


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[:] = [item]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _running.clear()


def require_mark(mark: str, what: str) -> None:
    """Fail the running test unless it is marked ``mark``; a no-op outside a test run (the
    bench/ scripts start these servers too)."""
    if _running and _running[0].get_closest_marker(mark) is None:
        pytest.fail(
            f"{_running[0].nodeid} starts {what}: mark it @pytest.mark.{mark} (a module of such "
            f"tests: pytestmark = pytest.mark.{mark}), so that `nox -s quick` leaves it out",
            pytrace=False,
        )
