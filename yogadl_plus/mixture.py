"""Mixture: several cached datasets read as one, each at a chosen share of every epoch.

``ydl.mix({"web": web, "books": books}, weights={"web": 3, "books": 1})`` is a view, like a
DataRef, whose epochs hold exactly ``epoch_size`` items: source ``j`` gets its weight's share of
them (``order.interleave.shares``), dealt evenly through the epoch (``Interleave`` there).
Within a source, items come from that source's own endless sequence of epochs, each its own
shuffle when the stream shuffles (keyed by the seed and the source's name), so a down-sampled
source is read without replacement across mixture epochs and an up-sampled one repeats evenly.
Which record a slot reads is arithmetic on (epoch, slot) (``order.mixing.MixOrder``): a Mixture
is a RecordSource, so a stream over it resumes, shards and rescales as over a DataRef
(docs/mixtures.md).
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from yogadl_plus.checks import check_indices, check_int, check_selection
from yogadl_plus.columns import merge_columns, stacking
from yogadl_plus.dataref import DataRef
from yogadl_plus.deprecation import old_names
from yogadl_plus.errors import SchemaError
from yogadl_plus.order.interleave import shares
from yogadl_plus.order.mixing import MixOrder, Schedule
from yogadl_plus.order.placement import Placement
from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.recordsource import Leaf, RecordSource
from yogadl_plus.schema import Field, Schema
from yogadl_plus.tokenblocks import TokenBlocks

__all__ = ["Mixture", "mix"]

if not TYPE_CHECKING:  # its names of the last release, with a DeprecationWarning
    __getattr__ = old_names(__name__)

Mixable = Union[DataRef, TokenBlocks, "Mixture"]
# (Epochs are int64 in the order's arithmetic, with room for the slots of an epoch.)
_LAST_EPOCH = 1 << 62


def mix(
    sources: Mapping[str, Mixable],
    weights: Mapping[str, float] | None = None,
    *,
    epoch_size: int | None = None,
    schedule: Mapping[int, Mapping[str, float] | None] | None = None,
) -> Mixture:
    """One dataset made of ``sources`` (name -> DataRef, TokenBlocks or Mixture) at
    ``weights`` (name -> number >= 0, with a positive sum; 0 leaves a source out; None: in
    proportion to the sources' sizes), ``epoch_size`` items per epoch (None: the sum of the
    sources' sizes); ``schedule={first_epoch: weights}`` changes the weights from those epochs
    on, each source going on with its own sequence. See docs/mixtures.md."""
    return Mixture(sources, weights, epoch_size=epoch_size, schedule=schedule)


class Mixture(RecordSource):
    """Several sources read as one at set proportions (see ``ydl.mix``).

    ``len(mix)`` is the items per epoch; ``mix[i]`` and ``mix.get_batch(indices)`` read the
    positions of the unshuffled epoch 0; ``mix.stream(...)`` takes every argument
    ``DataRef.stream`` takes. ``weights`` and ``counts`` are epoch 0's (a schedule's later
    ones: ``schedule``, ``counts_at(epoch)``). Picklable (its DataRefs pickle themselves).
    """

    def __init__(
        self,
        sources: Mapping[str, Mixable],
        weights: Mapping[str, float] | None = None,
        *,
        epoch_size: int | None = None,
        schedule: Mapping[int, Mapping[str, float] | None] | None = None,
    ) -> None:
        self.names, self.sources = _checked_sources(sources)
        sizes = [len(s) for s in self.sources]
        self.weights = _checked_weights(weights, self.names, sizes)
        #: The later stages: first epoch -> the weights from then on (each source's, exact).
        self.schedule = {
            first: _checked_weights(stage, self.names, sizes, f"schedule[{first}]: ")
            for first, stage in _checked_schedule(schedule)
        }
        self.epoch_size = (
            sum(sizes) if epoch_size is None else check_int("epoch_size", epoch_size, 1)
        )
        if not self.epoch_size:
            raise ValueError("the sources hold no records: a mixture of them has no items")
        for first, stage in [(None, self.weights), *self.schedule.items()]:
            _check_sizes(self.names, sizes, stage, first)
        self.counts = shares(self.weights, self.epoch_size)
        stages = [(first, shares(w, self.epoch_size)) for first, w in self.schedule.items()]
        used = [any(row) for row in zip(self.counts, *(counts for _, counts in stages))]
        self._leaves = tuple(_leaves(self.names, self.sources, used))
        parts = [s.mix_order if isinstance(s, Mixture) else len(s) for s in self.sources]
        self.mix_order: MixOrder = MixOrder(self.names, parts, self.counts, stages)

    # --- what a user sees ---

    def __len__(self) -> int:
        return self.epoch_size

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={count}" for name, count in zip(self.names, self.counts))
        later = "".join(
            f"; from epoch {first}: " + ", ".join(f"{n}={c}" for n, c in zip(self.names, counts))
            for first, counts in self.mix_order.stages[1:]
        )
        return f"Mixture({parts}{later}; epoch_size={self.epoch_size})"

    def counts_at(self, epoch: int) -> list[int]:
        """Each source's items in epoch ``epoch``: the shares of the weights then in force."""
        return list(self.mix_order.counts_at(check_int("epoch", epoch, 0)))

    def __getitem__(self, index: int | slice | Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Position ``index`` of the unshuffled epoch 0, as its source's record; for a slice, a
        list or array of positions, or a mask of bools, those as ``get_batch`` gives them."""
        picked = check_selection(index, self.epoch_size, "Mixture", "position")
        if isinstance(picked, np.ndarray):
            return self.get_batch(picked)
        i = picked
        ((leaf, _, records),) = self.place(0, np.array([i]), False, 0).parts
        return self.leaves[leaf].ref[int(records[0])]

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        fields: Sequence[str] | str | None = None,
        decode: bool = True,
    ) -> dict[str, Any]:
        """The items at positions ``indices`` of the unshuffled epoch 0, as field -> stacked
        array (a list for variable shapes, strings and bytes), as ``DataRef.get_batch``
        (``decode=False``: image fields as their stored bytes)."""
        idx = check_indices(indices, self.epoch_size, "position")
        # Checked whichever sources these positions read: the same call must not work for
        # some indices and not for others.
        names = [f.name for f in self.batch_fields(fields)]
        parts = []
        placement = self.place(0, idx, False, 0)
        for part in placement.parts:
            leaf = self.leaves[part[0]]
            where = placement.offsets(part)
            parts.append((leaf.name, where, leaf.ref.get_batch(part[2], names, decode)))
        if not parts:
            return self.leaves[0].ref.get_batch(idx, names, decode)
        return merge_columns(parts, len(idx))

    def close(self) -> None:
        """Release this process's LMDB handles of every source (they reopen on the next read)."""
        for leaf in self.leaves:
            leaf.ref.close()

    # --- as a RecordSource (what a Stream reads) ---

    # (Placing a mixture's slots costs more per call than the order itself.)
    place_block = 2 * RecordSource.place_block

    @property
    def leaves(self) -> tuple[Leaf, ...]:
        """The DataRefs read, depth first (a mixture of mixtures lists its inner ones')."""
        return self._leaves

    def batch_fields(self, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
        """The fields a batch of this mixture holds: those selected, which every source must
        have alike (SchemaError naming the field and the sources otherwise)."""
        first, *others = [leaf for leaf in self.leaves if leaf.used]
        chosen = _selected(first, fields)
        for leaf in others:
            theirs = _selected(leaf, fields)
            mine = {f.name: f for f in chosen}
            other = {f.name: f for f in theirs}
            for name in sorted(set(mine) ^ set(other)):
                has, lacks = (first, leaf) if name in mine else (leaf, first)
                raise SchemaError(
                    f"field {name!r} is in source {has.name!r} but not in source "
                    f"{lacks.name!r}: batches of a mixture need the same fields from every "
                    "source (select the shared ones with fields=, or read record by record)"
                )
            for name, field in mine.items():
                if stacking(field) != stacking(other[name]):
                    raise SchemaError(
                        f"field {name!r} differs between sources {first.name!r} "
                        f"({_describe(field)}) and {leaf.name!r} ({_describe(other[name])}): "
                        "batches of a mixture need it alike in every source"
                    )
        return chosen

    @property
    def schema(self) -> Schema:
        """The fields every source has alike (what a batch of all fields holds)."""
        return Schema(self.shared_fields())

    def shared_fields(self) -> tuple[Field, ...]:
        """The fields every source has alike, in the first source's order."""
        first, *others = [leaf.ref.select(None) for leaf in self.leaves if leaf.used]
        kept = []
        for field in first:
            theirs = [{f.name: f for f in fields}.get(field.name) for fields in others]
            if all(f is not None and stacking(f) == stacking(field) for f in theirs):
                kept.append(field)
        return tuple(kept)

    def identity(self) -> tuple[str, str]:
        """What a stream's state names this mixture by: its sources (dataset:version, and its
        share of epoch 0) and a digest of their builds and shares; any change to a source's
        build, a weight of epoch 0 or the epoch size changes the digest. A schedule's later
        stages are not in it: a state keeps them (``schedule_of_state``) and is compared with
        them up to its own epoch, so stages can be appended during a run."""
        described = ", ".join(
            f"{name}={source.identity()[0]}*{count}"
            for name, source, count in zip(self.names, self.sources, self.counts)
        )
        digest = hashlib.sha256()
        for name, source, count in zip(self.names, self.sources, self.counts):
            digest.update(f"{name}\x00{source.identity()[1]}\x00{count};".encode())
        return f"mix({described})", digest.hexdigest()[:32]

    def schedule_of_state(self) -> Schedule | None:
        """Every stage of this mixture and its inner ones (None where none has a schedule)."""
        return self.mix_order.schedule() if self.mix_order.scheduled else None

    def schedule_difference(self, saved: Mapping[str, Any] | None, epoch: int) -> str | None:
        """What a state whose ``schedule`` is ``saved`` (None: no stage after epoch 0) would
        resume into, if this mixture deals any epoch up to ``epoch`` (the last one the state
        has read from) otherwise: the message naming the first such epoch; None if none."""
        found = self.mix_order.first_change(saved or {}, epoch) if epoch >= 0 else None
        if found is None:
            return None
        return (
            f"this state was saved from a mixture whose schedule differs at {found}, which "
            f"the state has read already (it is in epoch {epoch}): a schedule may change "
            "only at epochs after the state's"
        )

    def place(self, epoch: int, positions: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Where slots ``positions`` of epoch ``epoch`` read: per leaf (its number in
        ``leaves``), which slots and that leaf's record for each (``MixOrder.place``)."""
        return self.mix_order.place(epoch, positions, shuffle, seed)

    @property
    def chunk_records(self) -> np.ndarray:
        """One run of slots per epoch: a mixture has no chunks of its own."""
        return np.array([self.epoch_size], dtype=np.int64)

    @property
    def record_bytes(self) -> float:
        """The largest of the sources' stored bytes per record (what units are sized by)."""
        return max(leaf.ref.record_bytes for leaf in self.leaves)

    @property
    def chunk_bytes(self) -> float:
        """The smallest of the sources' stored bytes per chunk."""
        return min(leaf.ref.chunk_bytes for leaf in self.leaves)

    def stream_fields(
        self, fields: Sequence[str] | str | None, batching: bool
    ) -> tuple[Field, ...]:
        """The fields a stream's items share: batches need the selected ones alike in every
        source (SchemaError otherwise); records may differ between sources, and then only the
        fields alike in all are listed (what adapters build their structure from)."""
        if batching or fields is not None:
            return self.batch_fields(fields)
        return self.shared_fields()

    def check_stream(self, order: OrderSettings, windows: bool) -> None:
        """What a stream over a mixture cannot do, said before it starts."""
        if windows:
            raise ValueError(
                "ngram= windows run within one dataset: make the n-gram streams of the sources "
                "themselves, not of a mixture"
            )
        if order.shard_by == "chunks":
            raise ValueError(
                "shard_by='chunks' keeps each shard's reads within whole chunks, which a "
                "mixture's slots do not map to: use shard_by='records' (the default) with a "
                "mixture"
            )
        if order.shuffle_window is not None:
            raise ValueError(
                "shuffle_window= shuffles within windows of one dataset's chunks; a mixture's "
                "epoch is shuffled whole (leave shuffle_window=None)"
            )


def _checked_sources(sources: Mapping[str, Mixable]) -> tuple[tuple[str, ...], tuple[Mixable, ...]]:
    if not isinstance(sources, Mapping):
        raise TypeError(
            "sources must be a mapping of name -> DataRef, TokenBlocks or Mixture, got "
            f"{type(sources).__name__}"
        )
    if not sources:
        raise ValueError("a mixture needs at least one source")
    for name, source in sources.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"source names must be non-empty strs without '/', got {name!r}")
        if not isinstance(source, (DataRef, TokenBlocks, Mixture)):
            raise TypeError(
                f"source {name!r} must be a DataRef or a Mixture, got "
                f"{type(source).__name__} (token blocks, ydl.token_blocks(...), mix as well)"
            )
    return tuple(sources), tuple(sources.values())


def _checked_schedule(
    schedule: Mapping[int, Mapping[str, float] | None] | None,
) -> list[tuple[int, Mapping[str, float] | None]]:
    """The schedule's stages by first epoch, checked: keys are epochs >= 1 (``weights`` are
    epoch 0's)."""
    if schedule is None:
        return []
    if not isinstance(schedule, Mapping):
        raise TypeError(
            f"schedule must be a mapping of first epoch -> weights, got {type(schedule).__name__}"
        )
    for first in schedule:
        if isinstance(first, (bool, np.bool_)) or not isinstance(first, numbers.Integral):
            raise ValueError(f"schedule keys are epochs (ints >= 1), got {first!r}")
        if first < 1:
            raise ValueError(
                f"schedule keys are epochs >= 1, got {first}: epoch 0's weights are weights="
            )
        if first >= _LAST_EPOCH:
            raise ValueError(f"schedule keys are epochs below 2**62, got {first}")
    return sorted((int(first), stage) for first, stage in schedule.items())


def _check_sizes(
    names: tuple[str, ...], sizes: list[int], weights: list[Fraction], first: int | None
) -> None:
    for name, size, weight in zip(names, sizes, weights):
        # (Refused even where its share of a short epoch rounds to nothing.)
        if weight and not size:
            stage = "" if first is None else f"schedule[{first}]: "
            raise ValueError(
                f"{stage}source {name!r} has no records, yet weight {weight}: give it weight 0 "
                "or leave it out"
            )


def _checked_weights(
    weights: Mapping[str, float] | None,
    names: tuple[str, ...],
    sizes: list[int],
    where: str = "",
) -> list[Fraction]:
    """Each source's weight as an exact rational; ValueError (prefixed by ``where``: which
    stage of a schedule) naming what is wrong."""
    try:
        return _weights(weights, names, sizes)
    except (TypeError, ValueError) as exc:
        if not where:
            raise
        raise type(exc)(f"{where}{exc}") from None


def _weights(
    weights: Mapping[str, float] | None, names: tuple[str, ...], sizes: list[int]
) -> list[Fraction]:
    if weights is None:
        if not sum(sizes):
            raise ValueError("the sources hold no records: a mixture of them has no items")
        return [Fraction(size) for size in sizes]
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must be a mapping of source name -> number, got {weights!r}")
    for name in weights:
        if name not in names:
            raise ValueError(
                f"weights names {name!r}, which is not a source (the sources: {list(names)})"
            )
    out: list[Fraction] = []
    for name in names:
        if name not in weights:
            raise ValueError(f"weights has no weight for source {name!r}")
        value = weights[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise ValueError(f"the weight of source {name!r} must be a number, got {value!r}")
        # (A rational is finite: float() of a big one would overflow.)
        finite = isinstance(value, numbers.Rational) or math.isfinite(float(value))
        if not finite or value < 0:
            raise ValueError(
                f"the weight of source {name!r} must be a finite number >= 0, got {value!r}"
            )
        out.append(_exact(value))
    if not any(out):
        raise ValueError(
            f"the weights must be numbers >= 0 with a positive sum; they are all zero: "
            f"{dict(weights)}"
        )
    return out


def _exact(value: numbers.Real) -> Fraction:
    """A weight as an exact rational of Python ints: numpy's integers would overflow in the
    arithmetic of shares (np.int8(100) * 127), and Fraction takes no numpy float but float64."""
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    return Fraction(float(value))


def _leaves(names: Sequence[str], sources: Sequence[Mixable], used: Sequence[bool]) -> list[Leaf]:
    return [
        Leaf((name, *leaf.path), leaf.ref, leaf.used and read)
        for name, source, read in zip(names, sources, used)
        for leaf in source.leaves
    ]


def _selected(leaf: Leaf, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
    try:
        return leaf.ref.select(fields)
    except (KeyError, SchemaError) as exc:
        raise SchemaError(f"source {leaf.name!r}: {exc}") from None


def _describe(field: Field) -> str:
    shape = f"{field.shape}" if field.shape else "scalar"
    return f"{field.dtype_name} {shape}{', nullable' if field.nullable else ''}"
