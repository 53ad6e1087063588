"""Which record of which source each slot of a mixture's epoch reads, as arithmetic.

A mixture's epoch has ``sum(counts)`` slots; source ``j`` gets ``counts[j]`` of them, dealt
evenly through the epoch (``Interleave``). The items of source ``j`` come from its own endless
sequence of epochs: mixture epoch ``e``'s items of it follow those of the epochs before, so
its ``k``-th item there is item ``e * counts[j] + k`` of the sequence, in the source's epoch
``(e * counts[j] + k) // size``. With a shuffle, each of the source's epochs is its own keyed
``Permutation`` (keyed by the stream's seed and the source's name), so a down-sampled source is
read without replacement across mixture epochs and an up-sampled one repeats evenly. An inner
mixture is walked in its own slot order the same way, level by level.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yogadl_plus.order.interleave import Interleave
from yogadl_plus.order.permutation import TABLE_MAX, Permutation, hashed_words
from yogadl_plus.order.placement import Part, Placement

__all__ = ["MixOrder", "source_seed"]

# The per-source permutations a MixOrder keeps made (a block of slots reads a few source epochs).
_PERMUTATIONS_KEPT = 64
# The entries of small sources' tables it keeps (8 bytes each): every epoch of an up-sampled
# source that a mixture's epoch reads, many times over.
_TABLE_ENTRIES_KEPT = 1 << 21
# (leaf number, the slots' offsets in the run, the leaf's records), as found piece by piece.
Found = dict[int, list[tuple[np.ndarray, np.ndarray]]]


def source_seed(seed: int, name: str) -> int:
    """The key of a source's own shuffles: from the stream's seed and the source's name, the
    same in every process."""
    return hashed_words(f"{seed}\x00{name}", 1, b"")[0] >> 1


class MixOrder:
    """The arithmetic of one mixture: sources ``names``, each a leaf of ``parts[j]`` records or
    an inner ``MixOrder``, with ``counts[j]`` slots of every epoch. ``place`` says where slots
    read; leaves are numbered depth first, as ``Mixture.leaves`` lists them."""

    def __init__(
        self, names: Sequence[str], parts: Sequence[int | MixOrder], counts: Sequence[int]
    ) -> None:
        self.names = tuple(names)
        self.parts = tuple(parts)
        self.counts = tuple(int(c) for c in counts)
        self.epoch_size = sum(self.counts)
        self.interleave = Interleave(self.counts)
        self.num_leaves: int = sum(_leaves_of(part) for part in self.parts)
        self._permutations: dict[tuple[int, int, int], Permutation] = {}
        self._kept_tables: dict[tuple[int, int, int], np.ndarray] = {}
        self._kept_entries = 0

    def __repr__(self) -> str:
        return f"MixOrder(names={self.names}, counts={self.counts})"

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_permutations": {}, "_kept_tables": {}, "_kept_entries": 0}

    def size(self, j: int) -> int:
        """Items of source ``j`` per epoch of its own: its records, or an inner mixture's
        epoch size."""
        part = self.parts[j]
        return part.epoch_size if isinstance(part, MixOrder) else part

    def place(self, epoch: int, slots: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Where the ``slots`` of epoch ``epoch`` read: per leaf, which of ``slots`` and that
        leaf's record for each. With ``shuffle``, each source walks its epochs in the order of
        a permutation keyed by ``seed`` and the source's name."""
        found: Found = {}
        where = np.arange(len(slots))
        self._place(int(epoch), np.asarray(slots, np.int64), shuffle, seed, 0, where, found)
        parts: list[Part] = []
        for leaf, pieces in sorted(found.items()):
            offsets = np.concatenate([w for w, _ in pieces])
            records = np.concatenate([r for _, r in pieces])
            if len(pieces) > 1:  # (from several epochs of an inner mixture)
                ascending = np.argsort(offsets, kind="stable")
                offsets, records = offsets[ascending], records[ascending]
            parts.append((leaf, offsets, records))
        return Placement(len(slots), parts)

    def _place(
        self,
        epochs: int | np.ndarray,
        slots: np.ndarray,
        shuffle: bool,
        seed: int,
        first_leaf: int,
        where: np.ndarray,
        found: Found,
    ) -> None:
        source, rank = self.interleave.source_and_rank(slots)
        leaf = first_leaf
        for j, part in enumerate(self.parts):
            chosen = source == j
            if chosen.any():
                # The source's own sequence: its items of mixture epoch e come after those of
                # the epochs before, through its own epochs in turn.
                own = epochs if isinstance(epochs, int) else epochs[chosen]
                sequence = own * self.counts[j] + rank[chosen]
                own_epochs, positions = _own_epochs(sequence, self.size(j))
                if isinstance(part, MixOrder):
                    # An inner mixture is walked in its own slot order, not a permutation of
                    # it: a part of its epoch is then a prefix, in which each of its sources
                    # gets a run of its own sequence (the balance property holds at every
                    # level). The items are shuffled all the same: by the outer order, and by
                    # the inner sources' own shuffled epochs.
                    inner_seed = source_seed(seed, self.names[j])
                    part._place(
                        own_epochs, positions, shuffle, inner_seed, leaf, where[chosen], found
                    )
                else:
                    if shuffle:
                        positions = self._shuffled(j, own_epochs, positions, seed)
                    found.setdefault(leaf, []).append((where[chosen], positions))
            leaf += _leaves_of(part)

    def _shuffled(
        self, j: int, epochs: int | np.ndarray, positions: np.ndarray, seed: int
    ) -> np.ndarray:
        """``positions`` of source ``j``'s ``epochs`` (one for all, or one per position)
        through that source's permutations."""
        key = source_seed(seed, self.names[j])
        size = self.size(j)
        if isinstance(epochs, int):  # (most blocks of slots read one epoch of each source)
            if size <= TABLE_MAX:
                return self._tables(j, key, size, [epochs])[0, positions]
            return self._permutation(j, key, epochs).indices(positions)
        unique, inverse = np.unique(epochs, return_inverse=True)
        if size <= TABLE_MAX:
            # A small source up-sampled goes through an epoch every few slots, and a block of a
            # shuffled mixture's slots reads every one of them: their tables are kept.
            return self._tables(j, key, size, unique.tolist())[inverse, positions]
        out = np.empty_like(positions)
        for k, epoch in enumerate(unique.tolist()):
            at = inverse == k
            out[at] = self._permutation(j, key, epoch).indices(positions[at])
        return out

    def _tables(self, j: int, key: int, size: int, epochs: list[int]) -> np.ndarray:
        """The orders of small source ``j``'s ``epochs`` (rows), those not kept made together."""
        kept = self._kept_tables
        missing = [e for e in epochs if (j, key, e) not in kept]
        if missing:
            if self._kept_entries + len(missing) * size > _TABLE_ENTRIES_KEPT:
                kept = self._kept_tables = {}  # replaced, never cleared: a reader keeps its own
                self._kept_entries = 0
            for epoch, row in zip(missing, Permutation.tables(size, key, missing)):
                kept[(j, key, epoch)] = row
            self._kept_entries += len(missing) * size
        return np.stack([kept[(j, key, e)] for e in epochs])

    def _permutation(self, j: int, key: int, epoch: int) -> Permutation:
        """Source ``j``'s order of its epoch ``epoch`` under ``key``, made once while in use."""
        permutation = self._permutations.get((j, key, epoch))
        if permutation is None:
            if len(self._permutations) >= _PERMUTATIONS_KEPT:
                self._permutations = {}  # replaced, never cleared: a concurrent reader keeps its
            permutation = Permutation(self.size(j), key, epoch)
            self._permutations[(j, key, epoch)] = permutation
        return permutation


def _own_epochs(sequence: np.ndarray, size: int) -> tuple[int | np.ndarray, np.ndarray]:
    """(epoch, position) in a source's own epochs of ``size`` items for each item number of
    its ``sequence``: one epoch for all when they share it (no division per item)."""
    low, high = int(sequence.min()) // size, int(sequence.max()) // size
    if low == high:
        return low, sequence - low * size
    return np.divmod(sequence, size)


def _leaves_of(part: int | MixOrder) -> int:
    """The leaves of a source: one for a DataRef's records, an inner mixture's own."""
    return part.num_leaves if isinstance(part, MixOrder) else 1
