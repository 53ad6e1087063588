"""Where a crop lies in a picture, before anything is decoded: torchvision's RandomResizedCrop
box drawn from a record's own generator, the centre crop of Resize + CenterCrop, and the JPEG
DCT scale that still covers the crop at the output's size."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from yogadl_plus.imagefiles import DCT_SCALES

__all__ = ["Box", "center_box", "center_filled", "dct_scale", "random_resized_box"]

# Boxes RandomResizedCrop draws before it falls back to the centre crop (torchvision's 10).
_TRIES = 10


@dataclass(frozen=True)
class Box:
    """A crop: its top row, left column, height and width, in pixels of the picture."""

    top: int
    left: int
    height: int
    width: int

    def scaled(self, height: int, width: int, picture_height: int, picture_width: int) -> Box:
        """This box of a ``height`` x ``width`` picture, in the same picture decoded at
        ``picture_height`` x ``picture_width`` (a JPEG decoded smaller): its edges rounded to
        the nearest pixel, at least one pixel each way."""
        fy, fx = picture_height / height, picture_width / width
        top = min(round(self.top * fy), picture_height - 1)
        left = min(round(self.left * fx), picture_width - 1)
        bottom = min(max(round((self.top + self.height) * fy), top + 1), picture_height)
        right = min(max(round((self.left + self.width) * fx), left + 1), picture_width)
        return Box(top, left, bottom - top, right - left)


def random_resized_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    rng: np.random.Generator,
) -> Box:
    """The box ``torchvision.transforms.RandomResizedCrop.get_params`` draws, from ``rng``: up
    to 10 tries of an area in ``scale`` times the picture's and an aspect ratio log-uniform in
    ``ratio``, the first that fits placed uniformly; else the centre crop, its ratio clamped
    to ``ratio``."""
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_TRIES):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return Box(top, left, h, w)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


def center_box(height: int, width: int, size: tuple[int, int], resize: int | None) -> Box:
    """The region of a ``height`` x ``width`` picture that torchvision's ``Resize(resize)``
    (the shorter side to ``resize``, the other in proportion) then ``CenterCrop(size)`` hand
    out, in the picture's own pixels: one crop and one resize do the work of both. A side
    the crop is longer than (torchvision pads it with black: ``center_filled``) is taken
    whole."""
    new_height, new_width = _resized(height, width, resize)
    fy, fx = height / new_height, width / new_width
    crop_h, crop_w = center_filled(height, width, size, resize)
    top = round((new_height - crop_h) / 2.0)
    left = round((new_width - crop_w) / 2.0)
    box_top, box_left = round(top * fy), round(left * fx)
    box_h = max(1, min(round(crop_h * fy), height - box_top))
    box_w = max(1, min(round(crop_w * fx), width - box_left))
    return Box(box_top, box_left, box_h, box_w)


def center_filled(
    height: int, width: int, size: tuple[int, int], resize: int | None
) -> tuple[int, int]:
    """The (height, width) of the part of ``CenterCrop(size)``'s output that the picture
    fills, after ``Resize(resize)``: ``size``, but for a side the resized picture is shorter
    than, where torchvision pads the rest with black, the picture centred."""
    new_height, new_width = _resized(height, width, resize)
    return min(size[0], new_height), min(size[1], new_width)


def _resized(height: int, width: int, resize: int | None) -> tuple[int, int]:
    """The picture's (height, width) after torchvision's ``Resize(resize)`` (None: as is)."""
    if resize is None:
        return height, width
    if width <= height:
        return int(resize * height / width), resize
    return resize, int(resize * width / height)


def dct_scale(box: Box, size: tuple[int, int]) -> int:
    """The largest factor a JPEG may be shrunk by in its decoder (1, 2, 4 or 8) that leaves
    ``box`` at least ``size`` (height, width): the resize after it then only shrinks."""
    for factor in reversed(DCT_SCALES):
        if box.height >= size[0] * factor and box.width >= size[1] * factor:
            return factor
    return 1
