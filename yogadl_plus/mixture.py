"""Mixture: several cached datasets read as one, each at a chosen share of every epoch.

``ydl.mix({"web": web, "books": books}, weights={"web": 3, "books": 1})`` is a view, like a
DataRef, whose epochs hold exactly ``epoch_size`` items: source ``j`` gets its weight's share of
them (``proportions.shares``), dealt evenly through the epoch (``proportions.Interleave``).
Within a source, items come from that source's own endless sequence of epochs, each its own
shuffle when the stream shuffles (keyed by the seed and the source's name), so a down-sampled
source is read without replacement across mixture epochs and an up-sampled one repeats evenly.
Which record a slot reads is arithmetic on (epoch, slot): a stream over a mixture resumes,
shards and rescales as over a DataRef (docs/mixtures.md).
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from yogadl_plus.boundary import Located, merge_columns, stacking
from yogadl_plus.checks import check_index, check_indices, check_int
from yogadl_plus.dataref import DataRef
from yogadl_plus.errors import SchemaError
from yogadl_plus.order import Permutation
from yogadl_plus.proportions import Interleave, shares
from yogadl_plus.schema import Field, Schema
from yogadl_plus.splitmix import GOLDEN, splitmix64_array
from yogadl_plus.stream_state import build_fingerprint

if TYPE_CHECKING:
    from yogadl_plus.stream import Stream

__all__ = ["Leaf", "Mixture", "mix"]

Source = Union[DataRef, "Mixture"]
# The per-source permutations a Mixture keeps made (a block of slots reads a few source epochs).
_PERMUTATIONS_KEPT = 64
# Sources up to this many records are shuffled by small_orders, many epochs at once.
_SMALL_SOURCE = 1024


def mix(
    sources: Mapping[str, Source],
    weights: Mapping[str, float] | None = None,
    *,
    epoch_size: int | None = None,
) -> Mixture:
    """One dataset made of ``sources`` (name -> DataRef or Mixture) at ``weights`` (name ->
    non-negative number; None: in proportion to the sources' sizes), ``epoch_size`` items per
    epoch (None: the sum of the sources' sizes). See docs/mixtures.md."""
    return Mixture(sources, weights, epoch_size=epoch_size)


class Leaf:
    """A DataRef a mixture reads from, and the names that lead to it (``("web",)``, or
    ``("text", "books")`` inside a mixture of mixtures). ``used``: its share of an epoch is
    not zero (a source of weight 0 is never read, and its fields need not match)."""

    __slots__ = ("path", "ref", "used")

    def __init__(self, path: tuple[str, ...], ref: DataRef, used: bool = True) -> None:
        self.path = path
        self.ref = ref
        self.used = used

    @property
    def name(self) -> str:
        return "/".join(self.path)

    def __repr__(self) -> str:
        return f"Leaf({self.name!r}, {self.ref!r})"


class Mixture:
    """Several sources read as one at set proportions (see ``ydl.mix``).

    ``len(mix)`` is the items per epoch; ``mix[i]`` and ``mix.get_batch(indices)`` read the
    positions of the unshuffled epoch 0; ``mix.stream(...)`` takes every argument
    ``DataRef.stream`` takes. Picklable (its DataRefs pickle themselves).
    """

    def __init__(
        self,
        sources: Mapping[str, Source],
        weights: Mapping[str, float] | None = None,
        *,
        epoch_size: int | None = None,
    ) -> None:
        self.names, self.sources = _checked_sources(sources)
        sizes = [len(s) for s in self.sources]
        self.weights = _checked_weights(weights, self.names, sizes)
        self.epoch_size = (
            sum(sizes) if epoch_size is None else check_int("epoch_size", epoch_size, 1)
        )
        if not self.epoch_size:
            raise ValueError("the sources hold no records: a mixture of them has no items")
        for name, size, weight in zip(self.names, sizes, self.weights):
            # (Refused even where its share of a short epoch rounds to nothing.)
            if weight and not size:
                raise ValueError(
                    f"source {name!r} has no records, yet weight {weight}: give it weight 0 "
                    "or leave it out"
                )
        self.counts = shares(self.weights, self.epoch_size)
        self._interleave = Interleave(self.counts)
        self.leaves: tuple[Leaf, ...] = tuple(_leaves(self.names, self.sources, self.counts))
        self._permutations: dict[tuple[int, int, int], Permutation] = {}

    # --- what a user sees ---

    def __len__(self) -> int:
        return self.epoch_size

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={count}" for name, count in zip(self.names, self.counts))
        return f"Mixture({parts}; epoch_size={self.epoch_size})"

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Position ``index`` of the unshuffled epoch 0, as its source's record."""
        i = check_index(index, self.epoch_size, "Mixture", "position")
        ((leaf, _, records),) = self.locate(0, np.array([i]), False, 0).parts
        return self.leaves[leaf].ref[int(records[0])]

    def get_batch(
        self, indices: Sequence[int] | np.ndarray, fields: Sequence[str] | str | None = None
    ) -> dict[str, Any]:
        """The items at positions ``indices`` of the unshuffled epoch 0, as field -> stacked
        array (a list for variable shapes, strings and bytes), as ``DataRef.get_batch``."""
        idx = check_indices(indices, self.epoch_size, "position")
        # Checked whichever sources these positions read: the same call must not work for
        # some indices and not for others.
        names = [f.name for f in self.batch_fields(fields)]
        parts = []
        for leaf, where, records in self.locate(0, idx, False, 0).parts:
            ref = self.leaves[leaf].ref
            parts.append((self.leaves[leaf].name, where, ref.get_batch(records, names)))
        if not parts:
            return self.leaves[0].ref.get_batch(idx, names)
        return merge_columns(parts, len(idx))

    def stream(self, **kwargs: Any) -> Stream:
        """A Stream over this mixture; it takes every argument ``DataRef.stream`` takes."""
        from yogadl_plus.stream import Stream

        return Stream(self, **kwargs)

    def close(self) -> None:
        """Release this process's LMDB handles of every source (they reopen on the next read)."""
        for leaf in self.leaves:
            leaf.ref.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_permutations"] = {}
        return state

    # --- for the Stream and adapters ---

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
        share of an epoch) and a digest of their builds and shares; any change to a source's
        build, a weight or the epoch size changes the digest."""
        described = ", ".join(
            f"{name}={_source_name(source)}*{count}"
            for name, source, count in zip(self.names, self.sources, self.counts)
        )
        digest = hashlib.sha256()
        for name, source, count in zip(self.names, self.sources, self.counts):
            inner = (
                source.identity()[1]
                if isinstance(source, Mixture)
                else build_fingerprint(source.manifest)
            )
            digest.update(f"{name}\x00{inner}\x00{count};".encode())
        return f"mix({described})", digest.hexdigest()[:32]

    def locate(self, epoch: int, slots: np.ndarray, shuffle: bool, seed: int) -> Located:
        """Where the ``slots`` of epoch ``epoch`` read: per leaf (its number in ``leaves``),
        which of ``slots`` and that leaf's record for each. With ``shuffle``, each source walks
        its epochs in the order of a permutation keyed by ``seed`` and the source's name."""
        found: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        epochs = np.full(len(slots), epoch, dtype=np.int64)
        self._locate(
            epochs, np.asarray(slots, np.int64), shuffle, seed, 0, np.arange(len(slots)), found
        )
        parts = []
        for leaf, pieces in sorted(found.items()):
            where = np.concatenate([w for w, _ in pieces])
            records = np.concatenate([r for _, r in pieces])
            if len(pieces) > 1:  # (from several epochs of a nested mixture)
                ascending = np.argsort(where, kind="stable")
                where, records = where[ascending], records[ascending]
            parts.append((leaf, where, records))
        return Located(len(slots), parts)

    def _locate(
        self,
        epochs: np.ndarray,
        slots: np.ndarray,
        shuffle: bool,
        seed: int,
        first_leaf: int,
        where: np.ndarray,
        found: dict[int, list[tuple[np.ndarray, np.ndarray]]],
    ) -> None:
        source, rank = self._interleave.locate(slots)
        leaf = first_leaf
        for j, src in enumerate(self.sources):
            chosen = source == j
            count = len(src.leaves) if isinstance(src, Mixture) else 1
            if chosen.any():
                # The source's own sequence: its items of mixture epoch e come after those of
                # the epochs before, through its own epochs in turn.
                sequence = epochs[chosen] * self.counts[j] + rank[chosen]
                size = len(src)
                src_epochs, positions = np.divmod(sequence, size)
                if isinstance(src, Mixture):
                    # An inner mixture is walked in its own slot order, not a permutation of
                    # it: a part of its epoch is then a prefix, in which each of its sources
                    # gets a run of its own sequence (the balance property holds at every
                    # level). The items are shuffled all the same: by the outer order, and by
                    # the inner sources' own shuffled epochs.
                    inner_seed = source_seed(seed, self.names[j])
                    src._locate(
                        src_epochs, positions, shuffle, inner_seed, leaf, where[chosen], found
                    )
                else:
                    if shuffle:
                        positions = self._shuffled(j, src_epochs, positions, seed)
                    found.setdefault(leaf, []).append((where[chosen], positions))
            leaf += count

    def _shuffled(self, j: int, epochs: np.ndarray, positions: np.ndarray, seed: int) -> np.ndarray:
        """``positions`` of source ``j``'s ``epochs`` through that source's permutations."""
        key = source_seed(seed, self.names[j])
        size = len(self.sources[j])
        if size <= _SMALL_SOURCE:
            # A small source up-sampled goes through an epoch every few slots: its epochs'
            # orders are made together (one table per epoch would cost a Python call each).
            unique, inverse = np.unique(epochs, return_inverse=True)
            return small_orders(size, key, unique)[inverse, positions]
        first = int(epochs[0])
        if (epochs == first).all():  # (most blocks of slots read one epoch of each source)
            return self._permutation(j, key, first).indices(positions)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs).tolist():
            at = epochs == epoch
            out[at] = self._permutation(j, key, epoch).indices(positions[at])
        return out

    def _permutation(self, j: int, key: int, epoch: int) -> Permutation:
        """Source ``j``'s order of its epoch ``epoch`` under ``key``, made once while in use."""
        permutation = self._permutations.get((j, key, epoch))
        if permutation is None:
            if len(self._permutations) >= _PERMUTATIONS_KEPT:
                self._permutations.clear()
            permutation = Permutation(len(self.sources[j]), key, epoch)
            self._permutations[(j, key, epoch)] = permutation
        return permutation


def small_orders(size: int, key: int, epochs: np.ndarray) -> np.ndarray:
    """For each of ``epochs``, a keyed uniformly random order of ``range(size)`` (a row):
    positions sorted by their splitmix64 draws, keyed by ``key`` and the epoch. Equal draws,
    about one pair in 2**64 / size**2, keep the positions' order."""
    epoch_keys = splitmix64_array(np.uint64(key) ^ splitmix64_array(epochs.astype(np.uint64)))
    states = epoch_keys[:, None] + np.arange(size, dtype=np.uint64) * np.uint64(GOLDEN)
    return np.argsort(splitmix64_array(states), axis=1, kind="stable")


def source_seed(seed: int, name: str) -> int:
    """The key of a source's own shuffles: from the stream's seed and the source's name, the
    same in every process (blake2b, never Python's salted hash)."""
    digest = hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _checked_sources(sources: Mapping[str, Source]) -> tuple[tuple[str, ...], tuple[Source, ...]]:
    if not isinstance(sources, Mapping):
        raise TypeError(
            f"sources must be a mapping of name -> DataRef or Mixture, got {type(sources).__name__}"
        )
    if not sources:
        raise ValueError("a mixture needs at least one source")
    for name, source in sources.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"source names must be non-empty strs without '/', got {name!r}")
        if not isinstance(source, (DataRef, Mixture)):
            raise TypeError(
                f"source {name!r} must be a DataRef or a Mixture, got {type(source).__name__}"
            )
    return tuple(sources), tuple(sources.values())


def _checked_weights(
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
        raise ValueError(f"the weights are all zero: {dict(weights)}")
    return out


def _exact(value: numbers.Real) -> Fraction:
    """A weight as an exact rational of Python ints: numpy's integers would overflow in the
    arithmetic of shares (np.int8(100) * 127), and Fraction takes no numpy float but float64."""
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, numbers.Rational):
        return Fraction(int(value.numerator), int(value.denominator))
    return Fraction(float(value))


def _leaves(names: Sequence[str], sources: Sequence[Source], counts: Sequence[int]) -> list[Leaf]:
    out: list[Leaf] = []
    for name, source, count in zip(names, sources, counts):
        if isinstance(source, Mixture):
            out.extend(
                Leaf((name, *leaf.path), leaf.ref, leaf.used and count > 0)
                for leaf in source.leaves
            )
        else:
            out.append(Leaf((name,), source, count > 0))
    return out


def _selected(leaf: Leaf, fields: Sequence[str] | str | None) -> tuple[Field, ...]:
    try:
        return leaf.ref.select(fields)
    except (KeyError, SchemaError) as exc:
        raise SchemaError(f"source {leaf.name!r}: {exc}") from None


def _source_name(source: Source) -> str:
    if isinstance(source, Mixture):
        return source.identity()[0]
    return f"{source.dataset_id}:{source.version}"


def _describe(field: Field) -> str:
    shape = f"{field.shape}" if field.shape else "scalar"
    return f"{field.dtype_name} {shape}{', nullable' if field.nullable else ''}"
