"""``ydl.vision``'s transforms: an image field's encoded bytes in, a uint8 picture of the size
asked out, decoding only what that needs.

Each is a ``RandomMap`` (augment.py): the stream calls ``apply`` with the record's seed, epoch,
index and source, so a crop is drawn from the record's own generator and is the same after any
resume, with any workers, shards or face. Each names its field in ``encoded_fields``, so the
stream hands that field over as the image file's bytes, undecoded; an already decoded HWC
array (a source whose images are arrays) is cropped the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from yogadl_plus.augment import RandomMap, generator
from yogadl_plus.checks import check_int
from yogadl_plus.errors import TransformError
from yogadl_plus.imagefiles import NotAnImage, decode_image, read_header
from yogadl_plus.vision.boxes import (
    Box,
    center_box,
    center_filled,
    dct_scale,
    random_resized_box,
)
from yogadl_plus.vision.resize import crop_resized, laid_out

__all__ = ["CenterCrop", "Decode", "RandomResizedCrop"]

LAYOUTS = ("HWC", "CHW")


class _ImageTransform(RandomMap):
    """What the three share: the field and layout, reading the field's picture, the errors."""

    #: Whether ``crop`` draws from the record's generator (else it gets None, and none is made).
    draws = False

    def __init__(self, field: str, layout: str, seed: int | None) -> None:
        if not isinstance(field, str) or not field:
            raise ValueError(f"field must be a field's name (a str), got {field!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        super().__init__(self._transformed, seed)
        self.field = field
        self.layout = layout
        #: The stream hands this field over as its stored bytes (the image file).
        self.encoded_fields = (field,)

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={value!r}" for name, value in self._options().items())
        return f"ydl.vision.{type(self).__name__}({options})"

    def _options(self) -> dict[str, Any]:
        seed = {"seed": self.seed} if self.draws else {}
        return {"field": self.field, "layout": self.layout, **seed}

    def __call__(self, record: Any) -> Any:
        """``record`` transformed, outside a stream, where the transform draws nothing (a
        random one runs in a stream, which gives it each record's epoch and index)."""
        if self.draws:
            return super().__call__(record)
        return self.apply(record, 0, 0, 0, "")

    def apply(self, record: Any, stream_seed: int, epoch: int, index: int, source: str) -> Any:
        """``record`` with its field's picture made (record ``index`` of ``source`` read in
        ``epoch``, as for any random_map); other fields as they are. TransformError naming the
        record and field when it holds no picture that decodes."""
        rng = None
        if self.draws:
            seed = self.seed if self.seed is not None else stream_seed
            rng = generator(seed, epoch, index, source)
        try:
            return self._transformed(record, rng)
        except NotAnImage as exc:
            where = f"record {index}" + (f" of source {source!r}" if source else "")
            raise TransformError(
                f"{self!r}: {where}, field {self.field!r}: {exc}; expected an image file's bytes "
                "(a codecs.Image field) or a uint8 array (height, width, channels)"
            ) from None

    def _transformed(self, record: Any, rng: np.random.Generator | None) -> Any:
        if not isinstance(record, dict) or self.field not in record:
            names = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise NotAnImage(
                f"the record has no such field (it has {names}): where the stream names "
                "fields=, name this one there too"
            )
        out = dict(record)
        out[self.field] = self._picture(record[self.field], rng)
        return out

    def _picture(self, value: Any, rng: np.random.Generator | None) -> np.ndarray:
        """The output for one field's value, encoded bytes or a decoded array: the crop
        decoded (a JPEG as small as still covers it), resized and laid out."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value) if isinstance(value, bytearray) else value
            header = read_header(value)
            height, width = header.height, header.width
            box, size, flip = self.crop(height, width, rng)
            scale = dct_scale(box, size) if header.format == "jpeg" else 1
            picture = decode_image(value, channels=3, scale=scale, scratch=_scratch)
            if scale > 1:
                box = box.scaled(height, width, *picture.shape[:2])
        else:
            picture = _rgb(value)
            box, size, flip = self.crop(picture.shape[0], picture.shape[1], rng)
        return crop_resized(picture, box, size, flip, self.layout == "CHW")

    def crop(
        self, height: int, width: int, rng: np.random.Generator | None
    ) -> tuple[Box, tuple[int, int], bool]:
        """Where to crop a ``height`` x ``width`` picture, the output's (height, width), and
        whether to mirror it."""
        raise NotImplementedError


class Decode(_ImageTransform):
    """The field's image decoded whole to uint8 RGB (grey repeated, alpha dropped, as
    torchvision's ImageFolder loader does), HWC or CHW (``layout``); other fields as they are."""

    def __init__(self, field: str = "image", layout: str = "HWC") -> None:
        super().__init__(field, layout, None)

    def _picture(self, value: Any, rng: np.random.Generator | None) -> np.ndarray:
        if isinstance(value, (bytes, bytearray, memoryview)):
            picture = decode_image(bytes(value) if isinstance(value, bytearray) else value)
        else:
            picture = _rgb(value)
        return laid_out(picture, self.layout == "CHW")


class RandomResizedCrop(_ImageTransform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` then ``RandomHorizontalFlip(
    flip)``, from the encoded image: the box is drawn from the record's own generator, and the
    JPEG is decoded only as large as the box needs (DCT scaling) before one resize."""

    draws = True

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        field: str = "image",
        layout: str = "HWC",
        seed: int | None = None,
    ) -> None:
        super().__init__(field, layout, seed)
        self.size = _size(size)
        self.scale = _interval("scale", scale)
        self.ratio = _interval("ratio", ratio)
        if not isinstance(flip, (int, float)) or isinstance(flip, bool) or not 0 <= flip <= 1:
            raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
        self.flip = float(flip)

    def _options(self) -> dict[str, Any]:
        own = {"size": self.size, "scale": self.scale, "ratio": self.ratio, "flip": self.flip}
        return {**own, **super()._options()}

    def crop(
        self, height: int, width: int, rng: np.random.Generator | None
    ) -> tuple[Box, tuple[int, int], bool]:
        assert rng is not None
        box = random_resized_box(height, width, self.scale, self.ratio, rng)
        return box, self.size, bool(rng.random() < self.flip)


class CenterCrop(_ImageTransform):
    """torchvision's ``Resize(resize)`` (the shorter side to ``resize``; None: no resize) then
    ``CenterCrop(size)``, as one crop of the matching region of the picture and one resize,
    the JPEG decoded only as large as that region needs. Where the (resized) picture is
    smaller than ``size``, it is centred on black, as torchvision pads it."""

    def __init__(
        self,
        size: int | Sequence[int],
        resize: int | None = None,
        field: str = "image",
        layout: str = "HWC",
    ) -> None:
        super().__init__(field, layout, None)
        self.size = _size(size)
        self.resize = None if resize is None else check_int("resize", resize, 1)

    def _options(self) -> dict[str, Any]:
        return {"size": self.size, "resize": self.resize, **super()._options()}

    def crop(
        self, height: int, width: int, rng: np.random.Generator | None
    ) -> tuple[Box, tuple[int, int], bool]:
        filled = center_filled(height, width, self.size, self.resize)
        return center_box(height, width, self.size, self.resize), filled, False

    def _picture(self, value: Any, rng: np.random.Generator | None) -> np.ndarray:
        picture = super()._picture(value, rng)
        chw = self.layout == "CHW"
        filled = picture.shape[1:] if chw else picture.shape[:2]
        if filled == self.size:
            return picture
        # torchvision's pad: the odd pixel of a side's padding goes after the picture.
        top, left = (self.size[0] - filled[0]) // 2, (self.size[1] - filled[1]) // 2
        rows, cols = slice(top, top + filled[0]), slice(left, left + filled[1])
        if chw:
            out = np.zeros((3, *self.size), np.uint8)
            out[:, rows, cols] = picture
        else:
            out = np.zeros((*self.size, 3), np.uint8)
            out[rows, cols] = picture
        return out


_lent = threading.local()


def _scratch(nbytes: int) -> np.ndarray:
    """This thread's memory to decode a picture into, at least ``nbytes``: a crop of it is
    resized into a new array before the thread decodes the next one."""
    buffer: np.ndarray | None = getattr(_lent, "buffer", None)
    if buffer is None or buffer.size < nbytes:
        buffer = _lent.buffer = np.empty(nbytes, np.uint8)
    return buffer


def _size(size: Any) -> tuple[int, int]:
    """``size`` (an int, or a pair height, width) as (height, width); ValueError naming it."""
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return check_int("size", size[0], 1), check_int("size", size[1], 1)
    if isinstance(size, (list, tuple)):
        raise ValueError(f"size must be an int or a pair (height, width), got {size!r}")
    side = check_int("size", size, 1)
    return side, side


def _interval(name: str, bounds: Any) -> tuple[float, float]:
    """``bounds`` as (low, high) with 0 < low <= high; ValueError naming ``name`` otherwise."""
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high), got {bounds!r}") from None
    if not 0 < low <= high or not np.isfinite(high):
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {bounds!r}")
    return low, high


def _rgb(value: Any) -> np.ndarray:
    """A decoded picture as height x width x 3 uint8 (a view where it already is): grey is
    repeated, alpha dropped, as Pillow's ``convert("RGB")``; NotAnImage for anything else."""
    if value is None:
        raise NotAnImage("got None (the record holds no image)")
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim not in (2, 3):
        what = (
            f"a {value.dtype} array of shape {value.shape}"
            if isinstance(value, np.ndarray)
            else f"a {type(value).__name__}"
        )
        raise NotAnImage(f"got {what}")
    picture = value if value.ndim == 3 else value[:, :, None]
    channels = picture.shape[2]
    if channels not in (1, 3, 4) or not picture.shape[0] or not picture.shape[1]:
        raise NotAnImage(f"got an array of shape {value.shape}")
    if channels == 1:
        return np.repeat(picture, 3, axis=2)
    return picture[:, :, :3]
