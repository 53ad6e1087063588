"""Framework faces (tf.data, PyTorch, Keras, Grain) over Stream and DataRef; each imports its
framework lazily, only when used."""

from __future__ import annotations

import importlib
from types import ModuleType

from yogadl_plus.errors import missing_extra

__all__ = ["FACES", "face"]

#: The faces, by the name users import them under: ``yogadl_plus.<name>`` and ``ydl.<name>``.
FACES = ("tensorflow", "torch", "keras", "grain")


def face(name: str, needed_by: str) -> ModuleType:
    """The framework face ``name`` (the module here that ``yogadl_plus.<name>`` re-exports),
    imported now with its framework.

    Its framework missing: a MissingExtra naming ``needed_by`` and the pip install.
    """
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, needed_by) from None
