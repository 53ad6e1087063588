"""A crop of a decoded picture, resized once and laid out as asked: the one copy of the
output's pixels a vision transform makes.

The crop is a view of the decoded picture (no copy). The resize is bilinear with antialiasing,
as torchvision's ``resized_crop`` and Pillow's ``BILINEAR`` do: through torch's uint8 kernel
(``interpolate(..., antialias=True)``, about twice Pillow's speed, within one level of it)
where torch is installed, else through Pillow. Both release the GIL, so thread workers resize
side by side. torch hands its result out channels first (CHW) with no further copy; HWC costs
one transposing copy, and a flip one more copy of the small output (a bilinear resize is
symmetric, so flipping after it is flipping before it).

torch's intra-op threads: a resize this small gains nothing from them, and they cost a great
deal where the cores are busy (measured on 2 busy cores: a 500x375 JPEG to a 224 crop took
2.5 ms with one thread, 20 ms with torch's default two, its spare thread spinning against the
decoder and the stream's workers). So the first resize in a process sets
``torch.set_num_threads(1)``, as torch's DataLoader does in its workers. The setting is the
process's: where the same process also computes on the CPU with torch (training on the CPU
with thread workers), set it back after the first batch.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from yogadl_plus.vision.boxes import Box

__all__ = ["crop_resized", "laid_out"]

_torch: Any = None  # the torch module once a resize looked for it; False: not installed


def crop_resized(
    picture: np.ndarray, box: Box, size: tuple[int, int], flip: bool, chw: bool
) -> np.ndarray:
    """``box`` of ``picture`` (uint8, height x width x 3) resized to ``size`` (height, width),
    mirrored left to right when ``flip``, as a new uint8 array HWC, or CHW when ``chw``."""
    crop = picture[box.top : box.top + box.height, box.left : box.left + box.width]
    if crop.shape[:2] == size:
        return laid_out(crop[:, ::-1] if flip else crop, chw)
    torch = _torch_module()
    if torch is not None:
        return _resized_by_torch(torch, crop, size, flip, chw)
    return _resized_by_pillow(crop, size, flip, chw)


def laid_out(picture: np.ndarray, chw: bool) -> np.ndarray:
    """A new contiguous copy of the HWC ``picture``, in HWC or CHW (a copy even where it is
    laid out so already: the picture may be a decoder's scratch memory, or the user's)."""
    return np.array(picture.transpose(2, 0, 1) if chw else picture, order="C", copy=True)


def _torch_module() -> Any:
    """torch, imported on the first resize (with one intra-op thread from then on: see the
    module's docstring), or None where it is not installed."""
    global _torch
    if _torch is None:
        found = importlib.util.find_spec("torch") is not None
        if found:
            import torch

            torch.set_num_threads(1)
            _torch = torch
        else:
            _torch = False
    return _torch or None


def _resized_by_torch(
    torch: Any, crop: np.ndarray, size: tuple[int, int], flip: bool, chw: bool
) -> np.ndarray:
    if not crop.flags.writeable:  # (torch warns on a read-only array; a user's, not ours)
        crop = crop.copy()
    batch = torch.from_numpy(crop).permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(batch, size=size, mode="bilinear", antialias=True)[0]
    if flip:
        out = out.flip(-1)
    if not chw:
        out = out.permute(1, 2, 0).contiguous()
    return out.numpy()


def _resized_by_pillow(
    crop: np.ndarray, size: tuple[int, int], flip: bool, chw: bool
) -> np.ndarray:
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(crop)).resize(
        (size[1], size[0]), Image.Resampling.BILINEAR
    )
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return laid_out(np.asarray(image), chw) if chw else np.array(image)
