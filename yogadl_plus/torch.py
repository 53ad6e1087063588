"""``yogadl_plus.torch``, the same module as ``ydl.torch``: the face in adapters/torch.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yogadl_plus.adapters.torch import *  # noqa: F403
else:
    import sys

    from yogadl_plus.adapters import face

    # Importing this name gives the face's own module, not a copy of its names: its settings
    # and the objects made through ``ydl.torch`` are the same ones.
    sys.modules[__name__] = face("torch", __name__)
