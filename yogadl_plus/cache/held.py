"""What keeps a chunk file on disk while a reader may still reach into it: the pin a version
read on demand takes for each chunk it opens (demand.py), which the opened chunks (opening.py)
and the working set (workingset.py) hold until the chunk is unmapped."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Held"]


class Held(Protocol):
    """What keeps one chunk file on disk (a pin); released once the chunk is unmapped."""

    def release(self) -> None: ...
