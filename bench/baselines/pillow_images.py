"""torchvision's image pipeline written with Pillow: the baseline that bench.headline and
bench.bench_images measure yogadl_plus's images against, and the augmentation the Pillow-based
peers (WebDataset's loader, litdata) run in their side venvs.

Imports only the standard library at the top (numpy, Pillow and torch lazily), so that it
runs in any side venv that has those three; never yogadl_plus.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = (".jpg", ".jpeg")


def random_resized_crop_flip(image: Any, size: int = 224) -> Any:
    """torchvision's RandomResizedCrop(size) (scale 0.08-1, ratio 3/4-4/3, 10 tries, then a
    centre crop; bilinear) and RandomHorizontalFlip, written with Pillow as torchvision's PIL
    path does them; returns a uint8 CHW tensor (PILToTensor)."""
    import numpy as np
    import torch
    from PIL import Image

    width, height = image.size
    left, top, w, h = crop_box(width, height)
    image = image.crop((left, top, left + w, top + h)).resize((size, size), Image.BILINEAR)
    if random.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def crop_box(
    width: int, height: int, rng: random.Random | None = None
) -> tuple[int, int, int, int]:
    """The box (left, top, width, height) torchvision's RandomResizedCrop draws for an image of
    ``width`` x ``height`` (scale 0.08-1, ratio 3/4-4/3, 10 tries, then a centre square), from
    ``rng`` (default: the ``random`` module's own state)."""
    draw = rng or random
    area = width * height
    for _ in range(10):
        target = area * draw.uniform(0.08, 1.0)
        ratio = math.exp(draw.uniform(math.log(3 / 4), math.log(4 / 3)))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = draw.randint(0, height - h)  # top first, as torchvision draws them
            return draw.randint(0, width - w), top, w, h
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


def decode_crop_flip(data: bytes) -> Any:
    """An image file's bytes -> Pillow decode (RGB) -> ``random_resized_crop_flip``."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return random_resized_crop_flip(image.convert("RGB"))


class ImageFolderLike:
    """A torch Dataset as torchvision's ImageFolder is: (path, class) pairs found by walking
    class folders, each item opened with Pillow (``pil_loader``) and transformed."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [
            (str(path), index)
            for index, name in enumerate(classes)
            for path in sorted((root / name).iterdir())
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return random_resized_crop_flip(image), label
