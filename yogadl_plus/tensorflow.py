"""``yogadl_plus.tensorflow``, which is ``ydl.tensorflow``: the tf.data face
(adapters/tensorflow.py), imported with TensorFlow only when first used."""

from __future__ import annotations

from yogadl_plus.adapters import face

face("tensorflow", __name__)  # its framework missing: a MissingExtra naming this module

from yogadl_plus.adapters.tensorflow import *  # noqa: E402, F403
from yogadl_plus.adapters.tensorflow import __all__ as __all__  # noqa: E402
