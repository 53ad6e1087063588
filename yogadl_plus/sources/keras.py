"""A ``keras.utils.PyDataset`` (or ``Sequence``) as a source, cached record by record.

Each ``sequence[i]`` is a batch: ``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``, each
part an array or a dict of arrays. Batches are split along axis 0 into records. Field names:
the keys of a dict ``x`` (nested dicts joined with ``/``), else ``"x"`` (``"x/0"``, ``"x/1"``
for a list of inputs); ``"y"`` and ``"sample_weight"`` likewise (``"y/<key>"`` for a dict).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from yogadl_plus.errors import SchemaError, YogaError
from yogadl_plus.sources.base import Source

__all__ = ["KerasSequenceSource"]

_PARTS = ("x", "y", "sample_weight")


def _num_batches(sequence: Any) -> int:
    try:
        count = sequence.num_batches  # Keras 3; None means infinite
    except (AttributeError, NotImplementedError):
        count = len(sequence)
    if count is None:
        raise YogaError(
            f"{type(sequence).__name__} is infinite (num_batches is None), so it cannot be "
            "cached; give it a __len__"
        )
    return int(count)


def _columns(batch: Any, index: int) -> dict[str, np.ndarray]:
    """The named columns of batch ``index``: field name -> array with the batch on axis 0."""
    if isinstance(batch, list):
        batch = tuple(batch)
    if not isinstance(batch, tuple):
        batch = (batch,)
    if not 1 <= len(batch) <= 3:
        raise SchemaError(
            f"batch {index}: a Keras batch is x, (x, y) or (x, y, sample_weight), got a tuple "
            f"of {len(batch)}"
        )
    out: dict[str, np.ndarray] = {}

    def add(name: str, value: Any) -> None:
        if name in out:
            raise SchemaError(
                f"batch {index}: field name {name!r} appears twice; rename the dict key"
            )
        out[name] = np.asarray(value)

    def walk(value: Any, names: tuple[str, ...], top: bool) -> None:
        if isinstance(value, Mapping):
            for key, child in value.items():
                # The keys of a dict x are the field names themselves.
                walk(child, (str(key),) if top and names == ("x",) else (*names, str(key)), False)
        elif isinstance(value, (tuple, list)):
            for i, child in enumerate(value):
                walk(child, (*names, str(i)), False)
        else:
            add("/".join(names), value)

    for part, value in zip(_PARTS, batch):
        if value is not None:
            walk(value, (part,), True)
    return out


class KerasSequenceSource(Source):
    """The records of a Keras ``PyDataset`` / ``Sequence``: its batches split along axis 0."""

    kind = "keras"

    def __init__(self, sequence: Any) -> None:
        if not hasattr(sequence, "__getitem__"):
            raise TypeError(f"expected a keras PyDataset or Sequence, got {type(sequence)}")
        self.sequence = sequence
        self.num_batches = _num_batches(sequence)

    def records(self) -> Iterator[dict[str, Any]]:
        names: list[str] | None = None
        for index in range(self.num_batches):
            columns = _columns(self.sequence[index], index)
            if names is None:
                names = list(columns)
            elif list(columns) != names:
                raise SchemaError(
                    f"batch {index}: fields {list(columns)} differ from batch 0's {names}"
                )
            sizes = {name: (c.shape[0] if c.ndim else None) for name, c in columns.items()}
            if None in sizes.values() or len(set(sizes.values())) > 1:
                raise SchemaError(
                    f"batch {index}: every part of a batch needs the same size along axis 0, "
                    f"got sizes {sizes} (None: a scalar, not a batch)"
                )
            for row in zip(*columns.values()):
                yield dict(zip(names, row))
