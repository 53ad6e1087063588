"""A Hugging Face ``datasets.Dataset`` or ``datasets.IterableDataset``, read in Arrow batches,
its ``Features`` mapped to fields.

``datasets`` is imported only when a source is made of one of its datasets: the features are
told apart by their class names, so that this module loads without it.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from yogadl_plus import codecs
from yogadl_plus.errors import SchemaError, missing_extra
from yogadl_plus.schema import Field, Schema
from yogadl_plus.sources.arrow import BATCH_ROWS, arrow_field, column_values
from yogadl_plus.sources.base import Description, Piece, Source, even_ranges, flatten_into

__all__ = ["IMAGES", "HuggingFaceSource"]

#: What an ``Image`` feature becomes: pixel arrays, or the image files' bytes as they are.
IMAGES = ("array", "bytes")

# Features whose Arrow type says all: numbers, bools, timestamps, strings, binary, lists of
# numbers (arrow_field maps them as it maps any Arrow column), a struct of strings (Translation).
# Sequence is datasets 3's List.
_PLAIN = ("Value", "ClassLabel", "List", "LargeList", "Sequence", "Translation")
# Images sampled from the head of a stream, which cannot be read twice to learn all shapes.
_STREAM_IMAGE_SAMPLE = 64
# PNG stores these (dtype, channels) losslessly; other images of varying shape are zstd'ed.
_PNG = {("uint8", 1), ("uint8", 3), ("uint8", 4), ("uint16", 1)}


def _datasets() -> Any:
    try:
        import datasets
    except ModuleNotFoundError as exc:
        raise missing_extra(exc, "caching a Hugging Face dataset") from None
    return datasets


@dataclass(frozen=True)
class _Leaf:
    """One field of the records: where its values are in an Arrow batch (the column, then
    the keys into nested structs) and how they become record values."""

    name: str
    path: tuple[str, ...]
    #: "arrow" (column_values), "array" (datasets' ArrayND extension), "image", "image_bytes"
    how: str
    #: The field the values are read as; for images, what the features alone say (a guess
    #: at shape and dtype, replaced by what the images hold in the source's schema).
    field: Field
    #: The datasets Image feature that decodes an image leaf (its mode, EXIF rotation).
    feature: Any = None


class HuggingFaceSource(Source):
    """The rows of a ``datasets.Dataset`` (in its order, ``select``/``shuffle`` included) or of
    a ``datasets.IterableDataset`` (streamed once, in its order).

    Rows are read in Arrow batches and the dataset's ``Features`` become the fields: ``Value``
    and ``ClassLabel`` scalars (labels as int64), ``List``/``Sequence`` of numbers as arrays
    (a fixed ``length`` a fixed dim, else ``None``), ``Array2D`` to ``Array5D`` arrays of their
    shape and dtype, nested dicts as ``outer/inner`` fields, ``Image`` as described by
    ``images``. Other features (Audio, Video, lists of strings, ...) are a SchemaError naming
    the field and the feature, before anything is read.

    ``images="array"`` (the default) stores each image's pixels as ``np.asarray`` of the image
    ``datasets`` decodes (what ``ds.with_format("numpy")`` gives: H x W x C, or H x W for one
    band). For a ``Dataset``, every image's header is read first: when all images have one
    shape, the field has it and stores raw pixels; otherwise its differing dims are None and
    images are stored as PNG (lossless; other dtypes and channel counts zstd-compressed). A
    stream cannot be read twice, so its image fields always have None height and width, their
    dtype and channels taken from its first images. ``images="bytes"`` stores the encoded
    image files as they are (a ``bytes`` field), for decoding in a transform; so does an
    ``Image(decode=False)`` feature.

    A column of a ``Dataset`` is nullable when it holds a null; a stream's are not (a null
    names its field and record: pass ``schema=`` with nullable fields). A stream without
    ``features`` (``IterableDataset.from_generator`` without them) is read as Python rows and
    its schema inferred from its first records, as for any iterable.
    """

    kind = "huggingface"
    framework = "datasets"
    forked_by_its_framework = True  # datasets' map(num_proc=) forks its workers

    def __init__(self, dataset: Any, *, images: str = "array") -> None:
        datasets = _datasets()
        if images not in IMAGES:
            raise ValueError(f"images must be one of {IMAGES}, got {images!r}")
        if not isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
            raise TypeError(
                "HuggingFaceSource takes a datasets.Dataset or datasets.IterableDataset, got "
                f"{type(dataset).__name__} (for a DatasetDict, pick a split: ds['train'])"
            )
        self.dataset = dataset
        self.images = images
        self.streamed = isinstance(dataset, datasets.IterableDataset)
        features = dataset.features
        #: None for a stream without features: its records are Python rows, inferred.
        self.leaves: list[_Leaf] | None = None
        if features is not None:
            self.leaves = list(_leaves(features, features.arrow_schema, images))

    def __repr__(self) -> str:
        return f"HuggingFaceSource({self.dataset!r}, images={self.images!r})"

    @functools.cached_property
    def schema(self) -> Schema | None:
        return self._fields(read_images=True)

    @property
    def length(self) -> int | None:
        return None if self.streamed else len(self.dataset)

    def description(self) -> Description:
        """The length of a ``Dataset``, and the fields its features tell, image fields as
        the features alone say (the images, which tell their shapes, are not read)."""
        return Description(self.length, self._fields(read_images=False))

    def _fields(self, read_images: bool) -> Schema | None:
        """The fields of the features; nullable where a Dataset's column holds a null; an
        image field as its images say if ``read_images``, else as its feature says."""
        if self.leaves is None:
            return None
        nulls = self._nullable() if not self.streamed else set()
        fields = []
        for leaf in self.leaves:
            field = leaf.field
            if leaf.how == "image" and read_images:
                field = self._image_field(leaf)
            fields.append(_with_nullable(field, leaf.name in nulls))
        return Schema(fields)

    def fingerprint(self) -> str | None:
        """A ``Dataset``'s own fingerprint (datasets derives it from its files or contents and
        the transforms applied), with ``images``; None for a stream."""
        found = None if self.streamed else getattr(self.dataset, "_fingerprint", None)
        return None if found is None else f"huggingface:{found}:images={self.images}"

    def records(self) -> Iterator[Mapping[str, Any]]:
        if self.leaves is None:
            return _python_records(self.dataset)
        return _records(_tables(self.dataset, self.streamed), self.leaves, 0)

    def split(self, parts: int) -> list[Source] | None:
        """Index ranges of a ``Dataset``: ``ds.select(range(a, b))`` of one read from files
        (which pickles as their paths), the rows themselves of one held in memory (pickling
        it, or a slice of it, would copy its whole table into every piece); None for a
        stream."""
        if self.streamed:
            return None
        schema = self.schema
        assert schema is not None and self.leaves is not None  # a Dataset has features
        in_memory = not self.dataset.cache_files
        pieces: list[Source] = []
        for run in even_ranges(len(self.dataset), parts):
            part = self.dataset.select(run)
            rows = _arrow_bytes(part.with_format("arrow")[:]) if in_memory else None
            pieces.append(
                _DatasetPiece(
                    None if in_memory else part, rows, self.leaves, schema, run.start, len(run)
                )
            )
        return pieces

    def _nullable(self) -> set[str]:
        """The fields of a Dataset's table that hold a null (of the whole table under any
        ``select``: a superset, at no cost)."""
        table = self.dataset.data.table
        assert self.leaves is not None
        return {
            leaf.name
            for leaf in self.leaves
            if any(_child(c, leaf.path[1:]).null_count for c in table.column(leaf.path[0]).chunks)
        }

    def _image_field(self, leaf: _Leaf) -> Field:
        """The field of an image leaf from the images themselves: all of a Dataset's headers
        (no pixel is decoded), a stream's first images (decoded)."""
        images = self.dataset.select_columns([leaf.path[0]])
        if self.streamed:
            table = next(_tables(images, True, _STREAM_IMAGE_SAMPLE), None)
            column = [] if table is None else _column(table, leaf.path).to_pylist()
            found = {(a.shape, a.dtype) for a in _decoded(leaf, column, 0) if a is not None}
            return _image_field(leaf, sorted(found, key=str), fixed=False)
        headers: set[tuple[tuple[int, ...], np.dtype]] = set()
        read = 0
        for table in _tables(images, False):
            column = _column(table, leaf.path).to_pylist()
            headers.update(_header(leaf, v, read + i) for i, v in enumerate(column) if v)
            read += len(column)
        return _image_field(leaf, sorted(headers, key=str), fixed=True)


class _DatasetPiece(Piece):
    """Rows ``start`` .. ``start + rows`` of a Dataset, read with the whole dataset's schema:
    a ``dataset`` of just those rows, or the rows as an Arrow IPC stream (``arrow``)."""

    kind = "huggingface"

    def __init__(
        self,
        dataset: Any,
        arrow: bytes | None,
        leaves: list[_Leaf],
        schema: Schema,
        start: int,
        rows: int,
    ) -> None:
        super().__init__(schema, start, rows)
        self.dataset, self.arrow, self.leaves = dataset, arrow, leaves

    def __repr__(self) -> str:
        return f"<rows {self.start}..{self.start + self.rows} of a datasets.Dataset>"

    def records(self) -> Iterator[Mapping[str, Any]]:
        if self.arrow is None:
            return _records(_tables(self.dataset, False), self.leaves, self.start)
        import pyarrow as pa

        table = pa.ipc.open_stream(self.arrow).read_all()
        return _records(iter(table.to_batches(BATCH_ROWS)), self.leaves, self.start)


# --------------------------------------------------------------------------- features -> leaves


def _leaves(features: Mapping[str, Any], arrow_schema: Any, images: str) -> Iterator[_Leaf]:
    for name, feature in features.items():
        yield from _leaves_of(name, (name,), feature, arrow_schema.field(name).type, images)


def _leaves_of(
    name: str, path: tuple[str, ...], feature: Any, arrow_type: Any, images: str
) -> Iterator[_Leaf]:
    kind = type(feature).__name__
    if isinstance(feature, dict):  # nested features: one field per leaf, "outer/inner"
        for key, inner in feature.items():
            child = arrow_type.field(key).type
            yield from _leaves_of(f"{name}/{key}", (*path, key), inner, child, images)
        return
    if kind == "Sequence" and isinstance(getattr(feature, "feature", None), dict):
        # datasets 3's Sequence of a dict is a dict of lists (a struct of lists in Arrow).
        for key in feature.feature:
            child = arrow_type.field(key).type
            yield _plain_leaf(f"{name}/{key}", (*path, key), feature, child)
        return
    if kind == "Image":
        as_bytes = images == "bytes" or not feature.decode
        if as_bytes:
            yield _Leaf(name, path, "image_bytes", Field(name, bytes), feature)
        else:
            yield _Leaf(name, path, "image", Field(name, np.uint8, (None, None, None)), feature)
        return
    if kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
        dtype = _array_dtype(name, feature)
        yield _Leaf(name, path, "array", Field(name, dtype, tuple(feature.shape)))
        return
    if kind not in _PLAIN:
        raise _unsupported(name, feature, "")
    if kind == "Translation":  # a struct of one string per language: one field each
        for language in arrow_type:
            leaf = f"{name}/{language.name}"
            yield _Leaf(leaf, (*path, language.name), "arrow", Field(leaf, str))
        return
    yield _plain_leaf(name, path, feature, arrow_type)


def _plain_leaf(name: str, path: tuple[str, ...], feature: Any, arrow_type: Any) -> _Leaf:
    """A leaf whose Arrow type says all, as arrow_field maps any Arrow column."""
    try:
        field = arrow_field(name, arrow_type, nullable=False)
    except SchemaError:
        raise _unsupported(name, feature, f" (stored as Arrow {arrow_type})") from None
    return _Leaf(name, path, "arrow", field)


def _array_dtype(name: str, feature: Any) -> np.dtype:
    try:
        dtype = np.dtype(feature.dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise _unsupported(name, feature, " (arrays of numbers and bools are)")
    return dtype


def _unsupported(name: str, feature: Any, detail: str) -> SchemaError:
    top = name.split("/")[0]
    return SchemaError(
        f"field {name!r}: the Hugging Face feature {feature!r:.120}{detail} is not "
        "supported. Supported: Value (numbers, bools, timestamps, strings, binary), "
        "ClassLabel, List/Sequence of numbers, Array2D-5D of numbers, Image, Translation, and "
        f"dicts of these. Drop the column (ds.remove_columns([{top!r}])) or turn it into "
        "those with ds.map(...) or ds.cast_column(...) first"
    )


def _with_nullable(field: Field, nullable: bool) -> Field:
    if not nullable:
        return field
    return Field(field.name, field.dtype, field.shape, field.codec, nullable=True)


# --------------------------------------------------------------------------- images


def _image_field(
    leaf: _Leaf, kinds: Sequence[tuple[tuple[int, ...], np.dtype]], fixed: bool
) -> Field:
    """The field for images of the (shape, dtype)s found: dims that differ, or all of a
    stream's height and width, are None; one shape is stored raw, others as PNG or zstd."""
    if not kinds:
        raise SchemaError(
            f"field {leaf.name!r}: no image to learn the pixels' shape and dtype from (all "
            "null, or no row); pass schema= with this field, or images='bytes'"
        )
    ranks = {len(shape) for shape, _ in kinds}
    dtypes = {dtype for _, dtype in kinds}
    if len(ranks) > 1 or len(dtypes) > 1:
        shown = sorted({f"{_dims(shape)} {dtype}" for shape, dtype in kinds})
        raise SchemaError(
            f"field {leaf.name!r}: its images decode to arrays of different ranks or dtypes "
            f"({', '.join(shown)}: images of several modes); give them one mode with "
            f"ds.cast_column({leaf.path[0]!r}, datasets.Image(mode='RGB')) (or 'L', ...), or "
            "store the files with images='bytes'"
        )
    dtype = dtypes.pop()
    first = kinds[0][0]
    shape: tuple[int | None, ...] = tuple(
        d if all(s[i] == d for s, _ in kinds) else None for i, d in enumerate(first)
    )
    if not fixed:  # a stream: later images may have any height and width
        shape = (None, None, *shape[2:])
    if None not in shape:
        return Field(leaf.name, dtype, shape, codecs.Raw())
    channels = {s[2] if len(s) == 3 else 1 for s, _ in kinds}
    png = all((dtype.name, c) in _PNG for c in channels) and (len(first) == 2 or dtype == np.uint8)
    codec = codecs.Image("png") if png else codecs.Compressed()
    return Field(leaf.name, dtype, shape, codec)


def _dims(shape: tuple[int, ...]) -> str:
    return "H x W" + "".join(f" x {d}" for d in shape[2:])


def _header(leaf: _Leaf, value: Mapping[str, Any], index: int) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the array an image decodes to, from its file's header: the size,
    turned as datasets turns it by its EXIF orientation, and the mode it is converted to."""
    from PIL import Image, ImageMode

    try:
        with _open_image(value) as image:
            width, height = image.size
            # The EXIF the header holds (Image.getexif of a PNG would decode its pixels to
            # look for EXIF after them: a PNG turned that way fails the build, named).
            orientation = Image.Image.getexif(image).get(Image.ExifTags.Base.Orientation)
            mode = leaf.feature.mode or image.mode
    except (OSError, ValueError) as exc:
        raise _undecodable(leaf, index, exc) from None
    if orientation in (5, 6, 7, 8):  # turned by a quarter: exif_transpose swaps the sides
        width, height = height, width
    described = ImageMode.getmode(mode)
    bands = len(described.bands)
    shape = (height, width) if bands == 1 else (height, width, bands)
    return shape, np.dtype(described.typestr).newbyteorder("=")


def _open_image(value: Mapping[str, Any]) -> Any:
    from PIL import Image

    if value.get("bytes") is not None:
        return Image.open(io.BytesIO(value["bytes"]))
    if value.get("path"):
        return Image.open(value["path"])
    raise ValueError("the image has neither bytes nor a path")


def _decoded(leaf: _Leaf, column: Sequence[Any], first: int) -> Iterator[Any]:
    """The values of an image column, decoded one by one as the records are written."""
    for i, value in enumerate(column):
        if value is None:
            yield None
            continue
        try:
            if leaf.how == "image_bytes":
                yield _file_bytes(value)
            else:
                yield np.asarray(leaf.feature.decode_example(value))
        except (OSError, ValueError) as exc:
            raise _undecodable(leaf, first + i, exc) from None


def _file_bytes(value: Mapping[str, Any]) -> bytes:
    if value.get("bytes") is not None:
        return bytes(value["bytes"])
    path = value.get("path")
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    raise ValueError(f"the image has no bytes and its path {path!r} is no local file")


def _undecodable(leaf: _Leaf, index: int, exc: BaseException) -> SchemaError:
    files = "" if leaf.how == "image_bytes" else ", or store the files with images='bytes'"
    return SchemaError(
        f"record {index}, field {leaf.name!r}: the image cannot be read ({type(exc).__name__}: "
        f"{exc}); fix or drop that row (ds.filter){files}"
    )


# --------------------------------------------------------------------------- reading


def _tables(dataset: Any, streamed: bool, rows: int | None = None) -> Iterator[Any]:
    """A dataset with features as Arrow tables of ``rows`` rows (default ``BATCH_ROWS``): a
    Dataset's are slices of its own table, a stream's are made from its rows."""
    rows = rows or BATCH_ROWS
    if streamed:
        return _stream_tables(dataset, rows)
    return iter(dataset.with_format("arrow").iter(batch_size=rows))


def _stream_tables(stream: Any, rows: int) -> Iterator[Any]:
    """A stream's rows as Arrow tables typed by its features, batch by batch of Python rows:
    datasets builds a stream's Arrow from a generator's rows one row at a time, and fails
    when two rows infer different types (an empty list, a None). Images are kept as files
    (``decode(False)``), to be decoded here once."""
    import pyarrow as pa

    features = stream.features
    schema = pa.schema([pa.field(f.name, _plain(f.type)) for f in features.arrow_schema])
    undecoded = getattr(stream, "decode", None)
    if undecoded is not None:
        stream = undecoded(False)
    batches = iter(stream.with_format(None).iter(batch_size=rows))
    first = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (ValueError, TypeError) as exc:  # datasets cannot encode a value to its feature
            raise SchemaError(
                f"the stream failed in the batch after record {first - 1}: "
                f"{type(exc).__name__}: {exc} (a row whose value does not fit its feature?)"
            ) from exc
        if undecoded is None:  # older datasets: images come decoded, stored back as files
            batch = features.encode_batch(batch)
        columns = []
        for field in schema:
            try:
                columns.append(pa.array(batch[field.name], field.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                last = first + len(batch[field.name]) - 1
                raise SchemaError(
                    f"records {first}..{last}, column {field.name!r}: the stream's values do "
                    f"not fit its feature {features[field.name]!r} ({exc}); fix the rows, or "
                    "the features given to the stream"
                ) from None
        table = pa.Table.from_arrays(columns, schema=schema)
        first += table.num_rows
        yield table


def _arrow_bytes(table: Any) -> bytes:
    """``table`` as an Arrow IPC stream: its rows only (a pickled slice keeps whole buffers)."""
    import pyarrow as pa

    table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _plain(arrow_type: Any) -> Any:
    """``arrow_type`` with datasets' extension types (ArrayND) as their storage types."""
    import pyarrow as pa

    if isinstance(arrow_type, pa.ExtensionType):
        return _plain(arrow_type.storage_type)
    if pa.types.is_struct(arrow_type):
        return pa.struct([f.with_type(_plain(f.type)) for f in arrow_type])
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(_plain(arrow_type.value_type), arrow_type.list_size)
    if pa.types.is_large_list(arrow_type):
        return pa.large_list(_plain(arrow_type.value_type))
    if pa.types.is_list(arrow_type):
        return pa.list_(_plain(arrow_type.value_type))
    return arrow_type


def _records(tables: Iterator[Any], leaves: list[_Leaf], first: int) -> Iterator[dict[str, Any]]:
    """The rows of Arrow tables as records, converted column by column."""
    names = [leaf.name for leaf in leaves]
    for table in tables:
        columns = [_values(table, leaf, first) for leaf in leaves]
        for row in zip(*columns):
            yield dict(zip(names, row))
        first += table.num_rows


def _values(batch: Any, leaf: _Leaf, first: int) -> Any:
    column = _column(batch, leaf.path)
    if leaf.how in ("image", "image_bytes"):
        return _decoded(leaf, column.to_pylist(), first)
    if leaf.how == "array" and hasattr(column.type, "storage_type"):
        column = column.storage  # datasets' ArrayND: lists of lists underneath
    return column_values(column, leaf.field)


def _column(batch: Any, path: tuple[str, ...]) -> Any:
    """The array at ``path`` of an Arrow batch: a column, then fields of nested structs."""
    column = batch.column(path[0])
    if hasattr(column, "combine_chunks"):
        column = column.combine_chunks()
    return _child(column, path[1:])


def _child(array: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        # flatten(), unlike field(), makes a child null where its struct is
        array = array.flatten()[array.type.get_field_index(key)]
    return array


def _python_records(dataset: Any) -> Iterator[dict[str, Any]]:
    """The rows of a stream without features, as Python values (a nested dict's keys joined
    with "/", PIL images as arrays), for the build to infer a schema from."""
    for row in dataset.with_format(None):
        record: dict[str, Any] = {}
        flatten_into(record, "", row, _python_value)
        yield record


def _python_value(value: Any, name: str) -> Any:
    return np.asarray(value) if hasattr(value, "getbands") else value  # a PIL image: its array
