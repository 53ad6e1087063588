"""``yogadl_plus.keras``, which is ``ydl.keras``: the Keras face (adapters/keras.py), imported
with Keras only when first used."""

from __future__ import annotations

from yogadl_plus.adapters import face

face("keras", __name__)  # its framework missing: a MissingExtra naming this module

from yogadl_plus.adapters.keras import *  # noqa: E402, F403
from yogadl_plus.adapters.keras import __all__ as __all__  # noqa: E402
