"""The stream's options beyond the order, as frozen dataclasses checked once: what is done at the
boundary (``BoundarySettings``) and by whom (``WorkerSettings``). The order's own are
``OrderSettings`` (order/settings.py). Each field is the ``stream(...)`` keyword of that name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from yogadl_plus.checks import check_int
from yogadl_plus.ngram import NGram
from yogadl_plus.order.settings import CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER, OrderSettings
from yogadl_plus.predicates import Predicate
from yogadl_plus.stream.skips import Skips
from yogadl_plus.stream.workers import KINDS

__all__ = ["BoundarySettings", "WorkerSettings"]

# Characters of a predicate's repr a stream state keeps (it is there to be recognized).
_PREDICATE_SHOWN = 200


@dataclass(frozen=True)
class BoundarySettings:
    """What is done to the records at the boundary: the ``fields`` decoded, the ``predicate``
    that keeps some, the records never handed out (``skip``: indices, or source name ->
    indices for a mixture), n-gram windows (``ngram``) instead of records, the ``transform``,
    and batches of ``batch_size`` (the last dropped when short, with ``drop_last``)."""

    fields: Sequence[str] | str | None = None
    predicate: Any = None
    ngram: Any = None
    transform: Callable[[Any], Any] | None = None
    batch_size: int | None = None
    drop_last: bool = False
    # (Arrays: not compared, so that settings stay comparable and hashable.)
    skip: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.fields, list):
            object.__setattr__(self, "fields", tuple(self.fields))  # frozen: no later change
        if self.batch_size is not None:
            object.__setattr__(self, "batch_size", check_int("batch_size", self.batch_size, 1))
        object.__setattr__(self, "drop_last", bool(self.drop_last))  # (any truth value, as ever)
        if self.predicate is not None and not isinstance(self.predicate, Predicate):
            raise ValueError(
                "predicate must be made with ydl.predicates (in_set, in_lambda, ...), "
                f"got {self.predicate!r}"
            )
        if self.ngram is not None:
            if not isinstance(self.ngram, NGram):
                raise ValueError(f"ngram must be a ydl.NGram, got {self.ngram!r}")
            if self.fields is not None:
                raise ValueError(
                    "with ngram=, the NGram names the fields of each offset: drop fields="
                )
            if self.predicate is not None:
                raise ValueError("predicate= and ngram= cannot be combined in one stream")
        encoded = self.encoded_fields  # (a ValueError for a transform's bad encoded_fields)
        if encoded and self.ngram is not None:
            raise ValueError(
                f"the transform {self.transform!r} takes fields {sorted(encoded)} encoded "
                "(its encoded_fields), and n-gram windows come decoded, as {offset: record}: "
                "use a transform of windows without encoded_fields"
            )
        if self.skip is not None:
            skips = self.skip if isinstance(self.skip, Skips) else Skips(self.skip)
            # (An empty list skips nothing: the stream is then as without one. A mask that
            # skips nothing is kept, to be checked against the source's length.)
            object.__setattr__(self, "skip", skips if len(skips) or skips.mask_lengths else None)
            if self.skipping and self.ngram is not None:
                raise ValueError(
                    "skip= and ngram= cannot be combined in one stream: a window would hold "
                    "skipped records; use a transform that rejects such windows"
                )

    @property
    def filtered(self) -> bool:
        """Whether some positions hand out nothing (a predicate, or records skipped): an
        epoch's items are then at most its positions."""
        return self.predicate is not None or self.skipping

    @property
    def skipping(self) -> bool:
        """Whether the skip list skips any record."""
        return self.skip is not None and len(self.skip) > 0

    def identity(self) -> dict[str, Any]:
        """What a stream state records of how items were made (``StreamState.boundary``):
        batch size, ``drop_last``, the skip list's count and digest, the predicate's repr."""
        predicate = None if self.predicate is None else repr(self.predicate)
        if predicate is not None and len(predicate) > _PREDICATE_SHOWN:
            predicate = predicate[: _PREDICATE_SHOWN - 3] + "..."
        return {
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "skip": self.skip.identity() if self.skipping else None,
            "predicate": predicate,
        }

    @property
    def encoded_fields(self) -> frozenset[str]:
        """The fields the transform takes as their stored bytes, undecoded: those its
        ``encoded_fields`` attribute names (a tuple of field names; ``ydl.vision``'s transforms
        set it). Only image fields come so: others are decoded as for any transform."""
        names = getattr(self.transform, "encoded_fields", None)
        if names is None:
            return frozenset()
        if not isinstance(names, (tuple, list, set, frozenset)) or not all(
            isinstance(name, str) for name in names
        ):
            raise ValueError(
                f"the transform {self.transform!r} has encoded_fields={names!r}: expected a "
                "tuple of field names"
            )
        return frozenset(names)

    @property
    def batching(self) -> bool:
        return self.batch_size is not None

    @property
    def as_columns(self) -> bool:
        """Whether records are read as columns (one decode per block): without a transform,
        for batches, and for records (the stream makes them records); n-gram windows that are
        not batched come as windows."""
        return self.transform is None and (self.batching or self.ngram is None)

    def check_order(self, order: OrderSettings) -> None:
        """ValueError for an order these settings cannot be read in."""
        if self.ngram is not None and order.shard_by == "chunks":
            raise ValueError(CHUNK_SHARDS_TAKE_NO_GLOBAL_ORDER)


@dataclass(frozen=True)
class WorkerSettings:
    """Who reads ahead: ``num_workers`` threads, processes or Ray actors (``worker_type``), with
    ``prefetch`` units in flight (None: twice the workers), processes started by
    ``worker_start_method`` (None: fork where there is one)."""

    num_workers: int = 0
    prefetch: int | None = None
    worker_type: str = "thread"
    worker_start_method: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_workers", check_int("num_workers", self.num_workers, 0))
        if self.prefetch is not None:
            check_int("prefetch", self.prefetch, 1)
        if self.worker_type not in KINDS:
            raise ValueError(f"worker_type must be one of {tuple(KINDS)}, got {self.worker_type!r}")
