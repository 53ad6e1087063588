"""What the library says goes through ``logging`` (logger "yogadl_plus" and its children), never
to stdout: INFO for versions built, overwritten, pulled and evicted, naming them with their
records, bytes and seconds; WARNING for retries. Progress bars show in notebooks too."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from helpers.remote_helpers import make_storage, records, spec_for

import yogadl_plus as ydl
from yogadl_plus.errors import TransientStorageError
from yogadl_plus.progress import progress_bar
from yogadl_plus.storage.objects import Retries


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.name.startswith("yogadl_plus")
    ]


def test_a_build_and_an_overwrite_are_logged_and_nothing_is_printed(local_storage, caplog, capsys):
    columns = {"x": np.zeros((1000, 4), np.float32), "y": np.arange(1000)}
    with caplog.at_level(logging.INFO, logger="yogadl_plus"):
        ref = ydl.cache_dataset(columns, "logged", "v1", local_storage)
        ydl.cache_dataset(columns, "logged", "v1", local_storage)  # reused: nothing said
        ydl.cache_dataset(columns, "logged", "v1", local_storage, overwrite=True)
        for _ in ref.stream(shuffle=True, batch_size=100):
            pass
    said = _messages(caplog, logging.INFO)
    assert len(said) == 2, said
    assert said[0].startswith("built logged:v1 in LocalStorage(") and "1,000 records" in said[0]
    assert said[1].startswith("overwrote logged:v1") and " s" in said[1]
    assert "bytes" in said[0]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # no bar either: stderr is no terminal here


@pytest.mark.servers
def test_a_pull_is_logged_naming_the_version(s3_server, tmp_path: Path, caplog) -> None:
    spec = spec_for("s3", s3_server, s3_server.make_bucket())
    ydl.cache_dataset(records(500), "pulled", "v1", make_storage(spec, tmp_path / "a"))
    with caplog.at_level(logging.INFO, logger="yogadl_plus"):
        make_storage(spec, tmp_path / "b").fetch("pulled", "v1")
    (said,) = [m for m in _messages(caplog, logging.INFO) if m.startswith("pulled")]
    assert "pulled/v1/" in said and "500 records" in said


def test_a_retried_call_warns_once_then_says_it_went_through(caplog) -> None:
    failures = iter([TransientStorageError("connection reset")] * 3)

    def attempt() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "done"

    retries = Retries(timeout=10.0, first_delay=0.001, max_delay=0.002)
    with caplog.at_level(logging.DEBUG, logger="yogadl_plus"):
        assert retries.call(attempt) == "done"
    (warning,) = _messages(caplog, logging.WARNING)
    assert warning.startswith("connection reset: retrying (try 1") and "after 10 s" in warning
    assert len(_messages(caplog, logging.DEBUG)) == 2
    assert _messages(caplog, logging.INFO) == [_messages(caplog, logging.INFO)[0]]
    assert "succeeded after 4 tries" in _messages(caplog, logging.INFO)[0]


def test_bars_show_in_a_notebook_whose_stderr_is_no_terminal(monkeypatch) -> None:
    shown = []

    class Bar:
        def __init__(self, **kwargs):
            shown.append(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            shown.append(n)

    shell = types.SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    with progress_bar(True, "verifying", 3, " chunk", scale=False) as advance:
        advance(1)
    settings = {"total": 3, "desc": "verifying", "unit": " chunk", "unit_scale": False}
    assert shown == [{**settings, "file": sys.stderr}, 1]
    monkeypatch.delitem(sys.modules, "IPython")
    shown.clear()
    with progress_bar(True, "verifying", 3, " chunk") as advance:
        advance(1)
    assert shown == []  # no notebook, and pytest's stderr is no terminal
