"""``yogadl_plus.grain``, which is ``ydl.grain``: the Grain face (adapters/grain.py), imported
with Grain only when first used."""

from __future__ import annotations

from yogadl_plus.adapters import face

face("grain", __name__)  # its framework missing: a MissingExtra naming this module

from yogadl_plus.adapters.grain import *  # noqa: E402, F403
from yogadl_plus.adapters.grain import __all__ as __all__  # noqa: E402
