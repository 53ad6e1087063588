"""How the worker processes of a parallel build start, and whether they are worth starting.

A worker needs what reading its part imports: a torch Dataset's part imports torch (seconds),
its class's module, and whatever that imports. Started afresh, every worker imports it all
again: on 200 small images, workers=2 took a hundred times as long as a serial build. So:

- **forked from this process**, which holds all of it already, where that is safe: on Linux,
  for a source whose framework forks its own loader's workers from the user's process (a
  torch DataLoader does), while no other Python thread runs here, no TensorFlow or JAX runtime
  is loaded and CUDA is not initialized (none of those survive a fork);
- otherwise **from a forkserver**, a fresh interpreter that imports the build code and the
  source's framework once, when it starts, and forks the workers (elsewhere: spawned);
- and **not at all** when the records the build reads first (to learn the schema) show that
  reading and encoding the whole source here takes less than ``SERIAL_UNDER_SECONDS``: no
  pool pays off.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from yogadl_plus.errors import YogaError
from yogadl_plus.sources.base import Source

__all__ = ["SERIAL_UNDER_SECONDS", "WorkerStart", "serial_time", "worker_start"]

#: A parallel build whose source would take less than this to read and encode here, as far
#: as its first records tell, is built serially.
SERIAL_UNDER_SECONDS = 0.5

# Runtimes whose threads and devices a forked child cannot use (they say so, or hang).
_NOT_FORKABLE = ("tensorflow", "jax")
# Threads of this package that a fork waits for or a child forgets (cache/readahead.py,
# cache/rowcopy.py): they stay after reading a stream, and are no reason not to fork.
_FORK_AWARE_THREADS = ("yogadl-readahead", "yogadl-plus-copy")


@dataclass(frozen=True)
class WorkerStart:
    """The multiprocessing context a pool's workers start with, and how, in words."""

    context: BaseContext
    how: str


def worker_start(src: Source) -> WorkerStart:
    """How the workers of a pool reading ``src``'s parts start, now: forked from this process
    where that is safe, else from a forkserver (spawned where there is none)."""
    unsafe = _why_not_fork(src)
    if unsafe is None:
        holds = f" (it holds {src.framework} already)" if src.framework else ""
        return WorkerStart(multiprocessing.get_context("fork"), f"forked from this process{holds}")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return WorkerStart(multiprocessing.get_context("spawn"), f"spawned ({unsafe})")
    context = multiprocessing.get_context("forkserver")
    preload = ["yogadl_plus.building.pool", "pyarrow.parquet", *filter(None, [src.framework])]
    context.set_forkserver_preload(preload)
    return WorkerStart(
        context,
        f"started from a forkserver, which imports {', '.join(preload)} once as it starts "
        f"(not forked from this process: {unsafe})",
    )


def _why_not_fork(src: Source) -> str | None:
    """Why the workers cannot be forked from this process, or None when they can."""
    if not src.forked_by_its_framework:
        return (
            f"the {src.kind or type(src).__name__} source's framework does not fork its own workers"
        )
    if not sys.platform.startswith("linux"):
        return f"forking is not safe on {sys.platform}"
    others = [
        t.name
        for t in threading.enumerate()
        if t is not threading.current_thread() and not t.name.startswith(_FORK_AWARE_THREADS)
    ]
    if others:
        return f"other threads run here ({', '.join(others[:3])})"
    loaded = [name for name in _NOT_FORKABLE if name in sys.modules]
    if loaded:
        return f"{loaded[0]} is loaded"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialized"
    return None


def serial_time(read_seconds: float, records_read: int, length: int | None) -> float | None:
    """About how long reading (and encoding) all ``length`` records here takes, from the
    ``records_read`` first ones taking ``read_seconds``; None when the length is not known."""
    if length is None or records_read == 0:
        return None
    return read_seconds * max(length, records_read) / records_read


def refuse_while_a_worker_starts() -> None:
    """A YogaError where this process is a worker process still importing the script that
    started it: under the "spawn" and "forkserver" start methods (a parallel build's workers
    start so) each worker runs the script's top level again, and a build there would wait for
    the very build its process is part of, for ever."""
    if multiprocessing.current_process().name == "MainProcess":
        return
    starting = any(
        frame.name in ("prepare", "_fixup_main_from_path")
        and frame.filename.endswith(os.path.join("multiprocessing", "spawn.py"))
        for frame in traceback.extract_stack()
    )
    if starting:
        raise YogaError(
            "cache_dataset was called while a worker process imports the script that started "
            "it: each worker of a process pool started by 'spawn' or 'forkserver' (a parallel "
            "build's are) runs the script's top level again. Put the script's work under "
            '`if __name__ == "__main__":`'
        )
