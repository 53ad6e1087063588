"""Progress bars for long work (a build, a verify, a copy, a benchmark): shown only when asked
for, and where someone watches: stderr is a terminal, or the code runs in a Jupyter notebook
(a widget bar there, through tqdm.auto). Bars would litter logs and pipes."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(
    enabled: bool, desc: str, total: int | None, unit: str, *, scale: bool = True
) -> Iterator[Callable[[int], object]]:
    """An ``advance(n)`` for a tqdm bar, closed at the end of the block; a no-op when not
    ``enabled`` or nobody watches. ``scale``: show big counts as 1.2M (records, bytes); False
    for counts of a few things (chunks), shown whole."""
    notebook = _in_notebook()
    if not enabled or not (notebook or sys.stderr.isatty()):
        yield lambda n: None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, file=sys.stderr) as bar:
        yield bar.update


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython imported by it; nothing imported here)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
