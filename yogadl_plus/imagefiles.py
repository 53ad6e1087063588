"""Image files' bytes: which format they hold, how big the picture is, whether it decodes, and
decoding it fast.

JPEG is decoded by libjpeg-turbo through simplejpeg where it is installed (it is a dependency):
it skips the copy Pillow makes to hand out an array, and scales by 1/2, 1/4 or 1/8 inside the
decoder (DCT scaling), which costs far less than decoding the whole picture and shrinking it.
Everything else, and JPEGs simplejpeg refuses (unusual subsampling), goes through Pillow, which
decodes them with the same libjpeg: the pixels are the same within the decoder's rounding.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DCT_SCALES",
    "ImageHeader",
    "NotAnImage",
    "check_image",
    "decode_image",
    "read_header",
    "sniff",
]

#: The factors a JPEG decoder divides both sides by at no extra cost.
DCT_SCALES = (1, 2, 4, 8)
#: Channels -> the Pillow mode that has them.
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_SIMPLEJPEG_SPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}


class NotAnImage(ValueError):
    """Bytes that are no image a decoder reads whole; the message says why. Callers turn it
    into a YogaError naming the file, record or field."""


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header tells: its format ("jpeg", "png", "webp", or Pillow's name
    for others, lower-case) and the picture's size."""

    format: str
    width: int
    height: int


def sniff(data: bytes | memoryview) -> str | None:
    """The format ``data`` starts like ("jpeg", "png", "webp"), or None; reads no further."""
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None


def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:  # a platform without its wheel: Pillow decodes JPEG too
        return None
    return simplejpeg


def read_header(data: bytes | memoryview) -> ImageHeader:
    """The format and size of the image in ``data``, from its header alone; NotAnImage for a
    picture larger than Pillow's limit against decompression bombs (see ``_check_pixels``)."""
    if not len(data):
        raise NotAnImage("no bytes at all (an empty file)")
    simplejpeg = _simplejpeg()
    if simplejpeg is not None and sniff(data) == "jpeg":
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            pass  # Pillow reads headers libjpeg-turbo's TurboJPEG API does not
        else:
            return _check_pixels(ImageHeader("jpeg", int(width), int(height)))
    with _opened(data) as image:
        return ImageHeader(str(image.format or "unknown").lower(), *image.size)


def _check_pixels(header: ImageHeader) -> ImageHeader:
    """``header``, or NotAnImage where its picture is over the pixel count at which Pillow
    refuses to open a file (twice ``PIL.Image.MAX_IMAGE_PIXELS``): a few bytes can declare a
    picture of gigabytes, and libjpeg-turbo, unlike Pillow, allocates it without asking."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and header.width * header.height > 2 * limit:
        pixels = header.width * header.height
        raise NotAnImage(
            _bomb(
                f"its header declares {header.width}x{header.height} = {pixels:,} pixels, "
                f"over the limit of {2 * limit:,}"
            )
        )
    return header


def _bomb(what: str) -> str:
    return (
        f"{what} (Pillow's guard against decompression bombs, twice "
        "PIL.Image.MAX_IMAGE_PIXELS); if the picture is genuine, raise "
        "PIL.Image.MAX_IMAGE_PIXELS (None: no limit) in every process that builds or reads"
    )


def check_image(data: bytes | memoryview) -> ImageHeader:
    """The header of the image in ``data`` once the whole picture decodes (a JPEG at 1/8 of
    its size, which reads every byte but computes few pixels); NotAnImage when it does not:
    truncated, empty, or not an image at all."""
    header = read_header(data)
    if header.width < 1 or header.height < 1:
        raise NotAnImage(f"a {header.format.upper()} of {header.width}x{header.height} pixels")
    decode_image(data, channels=None, scale=8 if header.format == "jpeg" else 1)
    return header


def decode_image(
    data: bytes | memoryview,
    channels: int | None = 3,
    scale: int = 1,
    scratch: Callable[[int], np.ndarray] | None = None,
) -> np.ndarray:
    """The picture in ``data`` as a uint8 array (height, width, channels). ``channels`` 1, 3 or
    4 converts to grey, RGB or RGBA as Pillow's ``convert`` does, except that grey from a colour
    JPEG is the luma it holds (libjpeg's grey output, as torchvision's ``read_image`` gives it),
    which differs from ``convert("L")`` of its RGB by a few levels where colours clip; None
    keeps the file's own (grey or palette-less colour: 1, 3 or 4). ``scale`` (1, 2, 4 or 8)
    divides a JPEG's sides by it inside the decoder, rounding up; other formats are decoded
    whole whatever it says.

    ``scratch(nbytes)``, where given, lends a writable uint8 array of at least ``nbytes`` that
    a JPEG is decoded into: the picture is then a view of it, good until the next loan. A
    transform that decodes picture after picture only to crop and resize it reuses memory
    already mapped, instead of a fresh half-megabyte array whose pages fault in one by one
    (a tenth of a JPEG's decoding time, measured)."""
    if channels not in (None, 1, 3, 4):
        raise ValueError(f"channels must be None, 1, 3 or 4, got {channels!r}")
    if scale not in DCT_SCALES:
        raise ValueError(f"scale must be one of {DCT_SCALES}, got {scale!r}")
    if not len(data):
        raise NotAnImage("no bytes at all (an empty file)")
    simplejpeg = _simplejpeg()
    if simplejpeg is not None and sniff(data) == "jpeg" and channels is not None:
        try:
            if scale == 1 and scratch is None:
                return simplejpeg.decode_jpeg(data, _SIMPLEJPEG_SPACES[channels])
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            height, width = -(-height // scale), -(-width // scale)
            buffer = None if scratch is None else scratch(height * width * channels)
            return simplejpeg.decode_jpeg(
                data,
                _SIMPLEJPEG_SPACES[channels],
                min_height=height,
                min_width=width,
                min_factor=scale,
                buffer=buffer,
            )
        except ValueError:
            # Pillow has the last word: it reads subsamplings TurboJPEG refuses, and like
            # torchvision's loader passes the warnings libjpeg gives on many real photos
            # ("extraneous bytes before marker") but not a truncated file.
            pass
    return _decode_with_pillow(data, channels, scale)


def _decode_with_pillow(data: bytes | memoryview, channels: int | None, scale: int) -> np.ndarray:
    with _opened(data) as image:
        mode = _MODES[channels] if channels is not None else _kept_mode(image)
        if image.format == "JPEG" and (scale > 1 or mode == "L"):
            # libjpeg scales, and gives grey (the luma) of a colour JPEG, as simplejpeg does.
            width, height = image.size
            draft = "L" if mode == "L" else image.mode
            image.draft(draft, (-(-width // scale), -(-height // scale)))
        try:
            image.load()
            converted = image if image.mode == mode else image.convert(mode)
            array = np.asarray(converted)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise NotAnImage(f"the {image.format or 'image'} does not decode: {exc}") from None
    return array if array.ndim == 3 else array[:, :, None]


def _kept_mode(image: Any) -> str:
    """The mode of 1, 3 or 4 eight-bit channels nearest ``image``'s own."""
    if image.mode in ("L", "RGB", "RGBA"):
        return str(image.mode)
    if image.mode in ("1", "I;16", "I", "F"):
        return "L"
    has_alpha = "A" in image.mode or "transparency" in image.info
    return "RGBA" if has_alpha else "RGB"


def _opened(data: bytes | memoryview) -> Any:
    """``data`` opened by Pillow (lazily: the header only), NotAnImage when it cannot be."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(bytes(data)))
    except Image.DecompressionBombError as exc:  # not an OSError: Pillow's "too big"
        raise NotAnImage(_bomb(str(exc).split(", could be")[0].rstrip("."))) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        reason = str(exc).split(" <_io.BytesIO")[0]  # not the repr of our own buffer
        raise NotAnImage(f"not an image Pillow reads ({reason})") from None
