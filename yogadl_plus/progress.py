"""Progress bars on stderr, for long work (a build, a verify, a copy, a benchmark): shown only
when asked for and stderr is a terminal, since bars would litter logs and pipes."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

__all__ = ["progress_bar"]


@contextlib.contextmanager
def progress_bar(
    enabled: bool, desc: str, total: int | None, unit: str
) -> Iterator[Callable[[int], object]]:
    """An ``advance(n)`` for a tqdm bar on stderr, closed at the end of the block; a no-op when
    not ``enabled`` or stderr is no terminal."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n: None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr) as bar:
        yield bar.update
