"""How ``head`` shows a field's value: short text for people (arrays as dtype[shape] and their
first numbers, images by format and size), or whole as JSON."""

from __future__ import annotations

import base64
import io
import math
import warnings
from typing import Any

import numpy as np

__all__ = ["json_value", "show_value"]


def show_value(value: Any, width: int = 60) -> str:
    """A short text for one field value: arrays as dtype[shape] and their first numbers."""
    if isinstance(value, np.ndarray):
        body = np.array2string(value.ravel()[:4], precision=4, separator=", ")
        more = ", ..." if value.size > 4 else ""
        return f"{value.dtype}{list(value.shape)} {body[:-1]}{more}]"[:width]
    if isinstance(value, np.datetime64):
        return str(value)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _show_bytes(bytes(value))[:width]
    return (value if isinstance(value, str) else repr(value))[:width]


# The first bytes of the image formats ``head`` names: PNG, JPEG, GIF, WebP (a RIFF file).
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"RIFF")


_BYTES_SHOWN = 8  # first bytes shown of a value that is no image, in hex (twice as many of text)


def _show_bytes(value: bytes) -> str:
    """What a bytes value is: an image's format and size (from its header alone), else its
    length and first bytes in hex."""
    image = _image_header(value)
    if image is not None:
        return f"<{image}, {len(value):,} bytes>"
    if not value:
        return "<0 bytes>"
    text = value[: 2 * _BYTES_SHOWN]
    if text.isascii() and text.decode("ascii").isprintable():  # text: as text
        more = "..." if len(value) > len(text) else ""
        return f"<{len(value):,} bytes: {text!r}{more}>"
    more = " ..." if len(value) > _BYTES_SHOWN else ""
    return f"<{len(value):,} bytes: {value[:_BYTES_SHOWN].hex(' ')}{more}>"


def _image_header(value: bytes) -> str | None:
    """An image's format and size, as "PNG image 32x32", from the header Pillow reads
    (nothing is decoded); None for anything else."""
    if not value.startswith(_IMAGE_MAGIC):
        return None
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a huge image's size is all that is asked)
            with Image.open(io.BytesIO(value)) as image:  # reads the header only
                width, height = image.size
                return f"{image.format} image {width}x{height}"
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError):
        return None  # a header that only looks like one (SyntaxError: Pillow's for some)


# Floats JSON has no number for (as protobuf's JSON mapping writes them).
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_value(value: Any) -> Any:
    """One field value as JSON, whole: arrays as nested lists of numbers, bytes in base64,
    datetimes as ISO 8601 text, timedeltas as counts of their unit (the schema names it),
    complex numbers as [real, imaginary], NaN and infinities as "NaN", "Infinity",
    "-Infinity"."""
    if isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind == "M":
            return value.astype(str).tolist()
        if value.dtype.kind == "m":
            return value.astype(np.int64).tolist()
        if value.dtype.kind == "c":  # [real, imaginary], as numpy's view of it
            return json_value(np.stack([value.real, value.imag], axis=-1).tolist())
        return json_value(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value
