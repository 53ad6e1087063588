"""Image files as record values, kept as they are: which file names are images, the field that
holds them, and the check each one passes before it is cached."""

from __future__ import annotations

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import YogaError
from yogadl_plus.imagefiles import NotAnImage, check_image
from yogadl_plus.schema import Field

__all__ = ["IMAGE_EXTENSIONS", "checked_image", "image_field", "is_image_name"]

#: The extensions of image files (torchvision's ``IMG_EXTENSIONS``), compared in lower case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_name(name: str) -> bool:
    """Whether a file (or a WebDataset member's extension, with its dot) names an image."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def image_field(name: str) -> Field:
    """The field of an image file kept as it is: read back as RGB pixels, (H, W, 3) uint8, as
    torchvision's ``pil_loader`` gives them."""
    return Field(name, np.uint8, (None, None, 3), codecs.Image())


def checked_image(data: bytes, where: str) -> bytes:
    """``data`` marked as an image that decodes (so that the codec does not check it again),
    or a YogaError naming ``where`` (the file, or the shard and member) and what is wrong."""
    try:
        check_image(data)
    except NotAnImage as exc:
        raise YogaError(
            f"{where}: not an image that decodes ({exc}); replace or remove the file, nothing "
            "was cached"
        ) from None
    return codecs.CheckedImage(data)
