"""lifecycle.py: the one owner of fork and exit hooks, checked in real processes."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest

from yogadl_plus import lifecycle


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_exit_hooks_run_last_registered_first_and_a_failing_one_skips_none() -> None:
    done = run(
        """
        from yogadl_plus import lifecycle
        def fails():
            raise RuntimeError("boom")
        lifecycle.at_exit(lambda: print("first registered"))
        lifecycle.at_exit(fails)
        lifecycle.at_exit(lambda: print("last registered"))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["last registered", "first registered"]
    assert "RuntimeError: boom" in done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_the_registries_hooks_for_the_live_objects_only() -> None:
    class Thing:
        def __init__(self, name: str) -> None:
            self.name = name

    seen: list[str] = []
    things = lifecycle.Registry(
        "test things",
        before_fork=lambda t: seen.append(f"before {t.name}"),
        after_fork_in_parent=lambda t: seen.append(f"parent {t.name}"),
        after_fork_in_child=lambda t: os.write(write, f"child {t.name}\n".encode()),
    )
    kept, dropped = Thing("kept"), Thing("dropped")
    things.add(kept)
    things.add(dropped)
    del dropped
    gc.collect()  # held weakly: gone with the object
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its hooks ran before fork() returned here
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as child:
        assert child.read() == "child kept\n"
    assert seen == ["before kept", "parent kept"]
    assert len(things) == 1 and list(things) == [kept]
    things.discard(kept)
    assert not list(things)


def test_a_strong_registry_holds_its_objects_until_discarded() -> None:
    strong = lifecycle.Registry("test strong", weak=False)
    thing = object()
    strong.add(thing)
    del thing
    gc.collect()
    assert len(strong) == 1
    strong.clear()
    assert len(strong) == 0
