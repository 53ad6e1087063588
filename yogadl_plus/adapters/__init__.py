"""Framework faces (tf.data, PyTorch, Keras, Grain) over Stream and DataRef; each imports its
framework lazily, only when used."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from yogadl_plus.errors import missing_extra

__all__ = ["FACES", "face"]

#: The faces, by the name users import them under: ``yogadl_plus.<name>`` and ``ydl.<name>``.
FACES = ("tensorflow", "torch", "keras", "grain")


def face(name: str, needed_by: str) -> ModuleType:
    """The framework face ``name``, imported now with its framework, and registered as
    ``yogadl_plus.<name>`` too, so that every way of importing it gives this one module.

    Its framework missing: a MissingExtra naming ``needed_by`` and the pip install.
    """
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, needed_by) from None
    sys.modules[f"yogadl_plus.{name}"] = module
    return module
