"""Codecs turn one field value into bytes and back; the schema names them, never pickles them.

A codec is a small object with ``encode(field, value) -> bytes`` and
``decode(field, data) -> value``. ``encode`` receives a value already checked against the field
(right dtype, right shape). Codecs are found again by ``name`` and ``params()`` when a stored
schema is read, so reading a cache never runs code that came with the data.
"""

from __future__ import annotations

import io
import struct
import threading
from typing import Any, ClassVar, Protocol

import numpy as np

from yogadl_plus.errors import CacheCorrupted, SchemaError
from yogadl_plus.imagefiles import NotAnImage, check_image, decode_image, read_header

__all__ = [
    "Bytes",
    "CheckedImage",
    "Codec",
    "CodecField",
    "Compressed",
    "Image",
    "Raw",
    "Scalar",
    "String",
    "codec_from_json",
]


class CodecField(Protocol):
    """What a codec asks of the field it stores (a ``schema.Field``, which holds its codec:
    declared here so that codecs need not know the schema)."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def shape(self) -> tuple[int | None, ...]: ...

    @property
    def kind(self) -> str: ...

    @property
    def dtype_name(self) -> str: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def num_variable_dims(self) -> int: ...

    def require_numeric(self, codec: Codec) -> None: ...

    def require_kind(self, codec: Codec, kind: str) -> None: ...


class Codec:
    """Base of all codecs; subclasses set ``name`` and implement encode/decode."""

    name: ClassVar[str] = ""
    #: Fixed-size codecs store exactly ``field.nbytes`` bytes and are decoded in bulk.
    fixed_size: ClassVar[bool] = False

    def encode(self, field: CodecField, value: Any) -> bytes:
        raise NotImplementedError

    def decode(self, field: CodecField, data: memoryview | bytes) -> Any:
        raise NotImplementedError

    def check(self, field: CodecField) -> None:
        """Raise SchemaError if this codec cannot store ``field``."""

    def params(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.params()}

    def is_fixed_for(self, field: CodecField) -> bool:
        """True when every value of ``field`` encodes to the same ``field.nbytes`` bytes."""
        return False

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"codecs.{type(self).__name__}({args})"


def _pack_dims(field: CodecField, shape: tuple[int, ...]) -> bytes:
    """The variable dims of ``shape`` (the ones the schema leaves as None), as uint32s."""
    variable = [d for d, f in zip(shape, field.shape) if f is None]
    if not variable:
        return b""
    try:
        return struct.pack(f"<{len(variable)}I", *variable)
    except struct.error:
        raise SchemaError(
            f"field {field.name!r}: got shape {shape}, whose dims over {2**32 - 1} a stored "
            "shape cannot say; split the value across records"
        ) from None


def _unpack_dims(field: CodecField, data: memoryview | bytes) -> tuple[tuple[int, ...], int]:
    """Shape stored by _pack_dims and the number of header bytes it took."""
    n_var = field.num_variable_dims
    if not n_var:
        return field.shape, 0  # type: ignore[return-value]
    dims = iter(struct.unpack_from(f"<{n_var}I", data, 0))
    shape = tuple(next(dims) if d is None else d for d in field.shape)
    return shape, 4 * n_var


class Raw(Codec):
    """The array's bytes as they are: the fast default for numeric tensors."""

    name = "raw"

    def check(self, field: CodecField) -> None:
        field.require_numeric(self)

    def is_fixed_for(self, field: CodecField) -> bool:
        return field.num_variable_dims == 0

    def encode(self, field: CodecField, value: np.ndarray) -> bytes:
        return _pack_dims(field, value.shape) + value.tobytes()

    def decode(self, field: CodecField, data: memoryview | bytes) -> np.ndarray:
        shape, start = _unpack_dims(field, data)
        # A private copy: the caller may keep the array after the read transaction ends.
        return np.frombuffer(bytearray(data[start:]), dtype=field.dtype).reshape(shape)


class Scalar(Codec):
    """One numeric or bool value, as its fixed-size bytes."""

    name = "scalar"

    def check(self, field: CodecField) -> None:
        field.require_numeric(self)
        if field.shape != ():
            raise SchemaError(
                f"field {field.name!r}: codecs.Scalar stores shape (), got shape {field.shape}; "
                "use codecs.Raw() for arrays"
            )

    def is_fixed_for(self, field: CodecField) -> bool:
        return True

    def encode(self, field: CodecField, value: np.ndarray) -> bytes:
        return value.tobytes()

    def decode(self, field: CodecField, data: memoryview | bytes) -> Any:
        return np.frombuffer(data, dtype=field.dtype, count=1)[0]


class Compressed(Codec):
    """The array's bytes, zstd-compressed: for large, compressible tensors."""

    name = "compressed"
    _local = threading.local()  # zstd (de)compressor objects are not thread-safe

    def __init__(self, level: int = 3) -> None:
        if not isinstance(level, int) or isinstance(level, bool) or not 1 <= level <= 22:
            raise ValueError(f"codecs.Compressed: level must be an int in [1, 22], got {level!r}")
        self.level = level

    def params(self) -> dict[str, Any]:
        return {"level": self.level}

    def check(self, field: CodecField) -> None:
        field.require_numeric(self)

    def _compressor(self) -> Any:
        import zstandard

        cache = self._local.__dict__.setdefault("compressors", {})
        if self.level not in cache:
            cache[self.level] = zstandard.ZstdCompressor(level=self.level)
        return cache[self.level]

    def _decompressor(self) -> Any:
        import zstandard

        if not hasattr(self._local, "decompressor"):
            self._local.decompressor = zstandard.ZstdDecompressor()
        return self._local.decompressor

    def encode(self, field: CodecField, value: np.ndarray) -> bytes:
        return _pack_dims(field, value.shape) + self._compressor().compress(value.tobytes())

    def decode(self, field: CodecField, data: memoryview | bytes) -> np.ndarray:
        shape, start = _unpack_dims(field, data)
        raw = self._decompressor().decompress(bytes(data[start:]))
        return np.frombuffer(bytearray(raw), dtype=field.dtype).reshape(shape)


class CheckedImage(bytes):
    """An image file's bytes that their source has checked already (``imagefiles.check_image``,
    naming the file in its own error): ``codecs.Image`` stores them without decoding them again.

    ``codecs.CheckedImage(data)`` is for sources; a user's plain ``bytes`` are checked at build.
    """

    __slots__ = ()


class Image(Codec):
    """An image, (H, W) or (H, W, C): an array stored as PNG (lossless) or JPEG (lossy), or an
    image file's bytes (JPEG, PNG, WebP, ...) stored as they are, checked at build; both are
    decoded to an array at read, with the field's channels."""

    name = "image"
    _CHANNELS: ClassVar[dict[str, tuple[int, ...]]] = {"png": (1, 3, 4), "jpeg": (1, 3)}
    _JPEG_MAX_SIDE: ClassVar[int] = 65500  # libjpeg's limit, below the format's 65535

    def __init__(self, format: str = "png", quality: int = 90) -> None:
        fmt = format.lower().replace("jpg", "jpeg")
        if fmt not in self._CHANNELS:
            raise ValueError(f"codecs.Image: format must be 'png' or 'jpeg', got {format!r}")
        if not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ValueError(f"codecs.Image: quality must be an int in [1, 100], got {quality!r}")
        self.format = fmt
        self.quality = quality

    def params(self) -> dict[str, Any]:
        return {"format": self.format, "quality": self.quality}

    def takes_files(self, field: CodecField) -> bool:
        """Whether ``field`` may be given image files' bytes: uint8 fields (16-bit ones hold
        arrays only)."""
        return bool(field.dtype.name == "uint8")

    def check(self, field: CodecField) -> None:
        allowed = ("uint8", "uint16") if self.format == "png" else ("uint8",)
        if field.kind != "numeric" or field.dtype.name not in allowed:
            raise SchemaError(
                f"field {field.name!r}: codecs.Image({self.format!r}) stores dtypes {allowed}, "
                f"got {field.dtype_name}"
            )
        if len(field.shape) not in (2, 3):
            raise SchemaError(
                f"field {field.name!r}: codecs.Image stores shape (H, W) or (H, W, C), "
                f"got {field.shape}"
            )
        channels = field.shape[2] if len(field.shape) == 3 else 1
        if channels is not None and channels not in self._CHANNELS[self.format]:
            raise SchemaError(
                f"field {field.name!r}: codecs.Image({self.format!r}) stores "
                f"{self._CHANNELS[self.format]} channels, got {channels}"
            )
        if field.dtype.name == "uint16" and len(field.shape) == 3:
            raise SchemaError(f"field {field.name!r}: 16-bit PNG is supported for (H, W) only")

    def encode(self, field: CodecField, value: np.ndarray | bytes) -> bytes:
        if isinstance(value, bytes):
            return self._kept_file(field, value)
        return self._encoded_array(field, value)

    def _kept_file(self, field: CodecField, data: bytes) -> bytes:
        """An image file's bytes as they are, once they decode (unless their source checked
        them) and their size fits the field's fixed height and width."""
        height, width = field.shape[:2]
        if isinstance(data, CheckedImage) and height is None and width is None:
            return data
        try:
            header = read_header(data) if isinstance(data, CheckedImage) else check_image(data)
        except NotAnImage as exc:
            raise SchemaError(
                f"field {field.name!r}: got {len(data)} bytes, no image file that decodes: "
                f"{exc}; repair or leave out the file, or declare the field as bytes to keep "
                "any bytes as they are"
            ) from None
        if (height is not None and height != header.height) or (
            width is not None and width != header.width
        ):
            raise SchemaError(
                f"field {field.name!r}: got a {header.format.upper()} of height {header.height} "
                f"and width {header.width}, where the field's shape {field.shape} holds "
                f"height {height} and width {width}; resize the image, or declare None for "
                "the dims that vary"
            )
        return data

    def _encoded_array(self, field: CodecField, value: np.ndarray) -> bytes:
        from PIL import Image as PILImage

        array = value[:, :, 0] if value.ndim == 3 and value.shape[2] == 1 else value
        if array.ndim == 3 and array.shape[2] not in self._CHANNELS[self.format]:
            raise SchemaError(
                f"field {field.name!r}: codecs.Image({self.format!r}) cannot store "
                f"{array.shape[2]} channels"
            )
        height, width = array.shape[:2]
        if not height or not width:
            raise SchemaError(
                f"field {field.name!r}: got shape {value.shape}, an image without pixels; "
                "leave the record out, or use codecs.Raw() for this field"
            )
        if self.format == "jpeg" and max(height, width) > self._JPEG_MAX_SIDE:
            raise SchemaError(
                f"field {field.name!r}: got shape {value.shape}; JPEG images are at most "
                f"{self._JPEG_MAX_SIDE} pixels high and wide: use codecs.Image('png') or "
                "split the image"
            )
        out = io.BytesIO()
        image = PILImage.fromarray(np.ascontiguousarray(array))
        try:
            if self.format == "png":
                image.save(out, format="PNG", compress_level=1)
            else:
                image.save(out, format="JPEG", quality=self.quality)
        except (OSError, ValueError) as exc:
            raise SchemaError(
                f"field {field.name!r}: {self.format.upper()} cannot store an image of shape "
                f"{value.shape} ({exc})"
            ) from None
        return out.getvalue()

    def decode(self, field: CodecField, data: memoryview | bytes) -> np.ndarray:
        """The picture as (H, W, C) uint8 with the field's channels (converted as Pillow does,
        as stored where the field says None), or (H, W) for a 2-D field; 16-bit grey as is."""
        if field.dtype.name == "uint16":  # (H, W) only: Pillow reads 16-bit grey as it is
            return self._decoded_16_bit(field, data)
        wide = len(field.shape) == 3
        try:
            array = decode_image(data, field.shape[2] if wide else 1)
        except NotAnImage as exc:
            raise _undecodable(field, exc) from None
        return array if wide else array[:, :, 0]

    def _decoded_16_bit(self, field: CodecField, data: memoryview | bytes) -> np.ndarray:
        from PIL import Image as PILImage

        try:
            with PILImage.open(io.BytesIO(bytes(data))) as image:
                return np.asarray(image, dtype=field.dtype)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise _undecodable(field, exc) from None


def _undecodable(field: CodecField, exc: Exception) -> CacheCorrupted:
    """The error of a stored image that no longer decodes (it did when it was stored)."""
    return CacheCorrupted(
        f"field {field.name!r}: a stored image does not decode ({exc}), though it did when "
        "it was cached: the cache is damaged; rebuild this version"
    )


class Bytes(Codec):
    """A ``bytes`` value as is."""

    name = "bytes"

    def check(self, field: CodecField) -> None:
        field.require_kind(self, "bytes")

    def encode(self, field: CodecField, value: bytes) -> bytes:
        return value

    def decode(self, field: CodecField, data: memoryview | bytes) -> bytes:
        return bytes(data)


class String(Codec):
    """A ``str`` value as UTF-8."""

    name = "string"

    def check(self, field: CodecField) -> None:
        field.require_kind(self, "str")

    def encode(self, field: CodecField, value: str) -> bytes:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start : exc.end]
            raise SchemaError(
                f"field {field.name!r}: got a str holding {bad!r} at position {exc.start}, "
                f"which UTF-8 cannot store ({exc.reason}: text decoded with "
                "errors='surrogateescape'?); repair the text, or store the original bytes in a "
                "bytes field"
            ) from None

    def decode(self, field: CodecField, data: memoryview | bytes) -> str:
        return str(data, "utf-8")


_REGISTRY: dict[str, type[Codec]] = {
    c.name: c for c in (Raw, Scalar, Compressed, Image, Bytes, String)
}


def codec_from_json(spec: dict[str, Any]) -> Codec:
    """The codec a stored schema names; unknown names are an error, never a guess."""
    params = dict(spec)
    name = params.pop("name", None)
    if name not in _REGISTRY:
        raise SchemaError(
            f"unknown codec {name!r} in stored schema; known: {sorted(_REGISTRY)}. "
            "The cache may come from a newer yogadl_plus: upgrade it."
        )
    return _REGISTRY[name](**params)
