"""``ydl.vision``: transforms (``stream(transform=...)``) that take an image field's encoded
bytes and decode only what their output needs, seeded like ``ydl.random_map``. See
docs/vision.md."""

from __future__ import annotations

from yogadl_plus.vision.transforms import CenterCrop, Decode, RandomResizedCrop

__all__ = ["CenterCrop", "Decode", "RandomResizedCrop"]
