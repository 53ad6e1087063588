"""A PyTorch map-style Dataset, read in order through a DataLoader (optionally with workers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from yogadl_plus.checks import check_int
from yogadl_plus.errors import SchemaError
from yogadl_plus.sources.base import Description, Source, even_ranges, flatten_into

__all__ = ["TorchDatasetSource", "item_to_record"]

# DataLoader arguments that would change which items come or in what order: the source owns them.
_RESERVED = ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last")


def _value(value: Any, name: str) -> Any:
    """A record value: tensors become numpy arrays of the same dtype, 0-d ones numpy scalars."""
    if isinstance(value, (str, bytes, int, float, bool, np.generic)) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return value[()] if value.ndim == 0 else value
    import torch

    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            value = value.to_dense()
        try:
            array = value.detach().cpu().resolve_conj().resolve_neg().numpy()
        except TypeError as exc:  # bfloat16 and other dtypes numpy lacks
            raise SchemaError(
                f"field {name!r}: a torch.{value.dtype} tensor has no numpy dtype ({exc}); "
                "convert it in __getitem__ (e.g. .float()) to cache it"
            ) from None
        return array[()] if array.ndim == 0 else array
    if isinstance(value, (list, tuple)):
        # A list value is one array-like field ({"bbox": [x0, y0, x1, y1]}); its tensors must
        # become arrays for numpy to stack them.
        return [_value(v, name) for v in value]
    if hasattr(value, "__array_interface__") or hasattr(value, "__array__"):
        array = np.asarray(value)  # PIL images, for torchvision datasets without transforms
        return array[()] if array.ndim == 0 else array
    return value


def item_to_record(item: Any) -> dict[str, Any]:
    """The record for one ``dataset[i]``: a dict's keys (nested dicts joined with "/"), a
    tuple's or list's positions "0", "1", ... (dict elements flattened under them), or
    "value" for anything else."""
    record: dict[str, Any] = {}
    if isinstance(item, Mapping):
        flatten_into(record, "", item, _value)
    elif isinstance(item, (tuple, list)):
        for position, element in enumerate(item):
            name = str(position)
            if isinstance(element, Mapping):
                flatten_into(record, name, element, _value)
            else:
                record[name] = _value(element, name)
    else:
        record["value"] = _value(item, "value")
    return record


def _collate_records(items: list[Any]) -> list[dict[str, Any]]:
    """DataLoader collate_fn: runs in the worker, so tensors cross processes as numpy arrays
    (pickled bytes) and not as shared-memory handles, of which a worker has few."""
    return [item_to_record(item) for item in items]


class TorchDatasetSource(Source):
    """A ``torch.utils.data.Dataset`` (``__len__`` + ``__getitem__``), cached record by record.

    Items are read with a ``DataLoader`` of ``num_workers`` worker processes, ``batch_size``
    items per task, in index order whatever the number of workers: slow ``__getitem__``s
    (decoding, preprocessing) run in parallel. ``loader_kwargs`` go to the DataLoader too
    (``multiprocessing_context``, ``worker_init_fn``, ``timeout``, ...).

    An ``IterableDataset`` is read in the calling process, in its own order.
    """

    kind = "torch"
    framework = "torch"
    forked_by_its_framework = True

    def __init__(
        self, dataset: Any, num_workers: int = 0, batch_size: int = 64, **loader_kwargs: Any
    ) -> None:
        import torch.utils.data as tud

        self.dataset = dataset
        self.num_workers = check_int("num_workers", num_workers, 0)
        self.batch_size = check_int("batch_size", batch_size, 1)
        reserved = sorted(set(loader_kwargs) & set(_RESERVED))
        if reserved:
            raise ValueError(
                f"TorchDatasetSource reads every item once, in order; it sets {reserved} itself"
            )
        self.loader_kwargs = loader_kwargs
        self._iterable = isinstance(dataset, tud.IterableDataset)
        if self._iterable:
            if num_workers:
                raise ValueError(
                    "an IterableDataset read by several workers would repeat or reorder items; "
                    "use num_workers=0, or a map-style Dataset (__len__ + __getitem__)"
                )
        elif not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(
                f"TorchDatasetSource needs a map-style Dataset with __len__ and __getitem__, "
                f"got {type(dataset).__name__}"
            )

    def __repr__(self) -> str:
        return (
            f"TorchDatasetSource({type(self.dataset).__name__}, num_workers={self.num_workers}, "
            f"batch_size={self.batch_size})"
        )

    @property
    def length(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:  # an IterableDataset without __len__
            return None

    def description(self) -> Description:
        """A map-style dataset's length (the records are what ``__getitem__`` makes, so their
        schema is not known before reading); nothing of an ``IterableDataset``, whose
        ``__len__``, if any, is a hint."""
        return Description(None if self._iterable else len(self.dataset))

    def split(self, parts: int) -> list[Source] | None:
        """Index ranges of a map-style dataset (each read without DataLoader workers: the
        parallel build is the parallelism); None for an IterableDataset."""
        if self._iterable:
            return None
        from torch.utils.data import Subset

        pieces: list[Source] = []
        for run in even_ranges(len(self.dataset), parts):
            piece = TorchDatasetSource(
                Subset(self.dataset, run), batch_size=self.batch_size, **self.loader_kwargs
            )
            piece.offset = run.start
            pieces.append(piece)
        return pieces

    def records(self) -> Iterator[dict[str, Any]]:
        if self._iterable:
            return (item_to_record(item) for item in self.dataset)
        return self._map_style_records()

    def _map_style_records(self) -> Iterator[dict[str, Any]]:
        from torch.utils.data import DataLoader

        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=_collate_records,
            **self.loader_kwargs,
        )
        batches = iter(loader)
        try:
            for batch in batches:
                yield from batch
        finally:
            # Stops the workers now when the build stops early (a schema error), not at GC.
            shutdown = getattr(batches, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
