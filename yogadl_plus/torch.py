"""``yogadl_plus.torch``, which is ``ydl.torch``: the PyTorch face (adapters/torch.py), imported
with PyTorch only when first used."""

from __future__ import annotations

from yogadl_plus.adapters import face

face("torch", __name__)  # its framework missing: a MissingExtra naming this module

from yogadl_plus.adapters.torch import *  # noqa: E402, F403
from yogadl_plus.adapters.torch import __all__ as __all__  # noqa: E402
