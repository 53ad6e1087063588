"""Which record of which source each slot of a mixture's epoch reads, as arithmetic.

A mixture's epoch has ``epoch_size`` slots; in epoch ``e`` source ``j`` gets ``counts[j]`` of
them, dealt evenly through the epoch (``Interleave``), where ``counts`` are those of the stage
in force at ``e`` (a schedule changes them from given epochs on; the epoch's size stays). The
items of source ``j`` come from its own endless sequence of epochs: mixture epoch ``e``'s items
of it follow those of the epochs before, so its ``k``-th item there is item ``S_j(e) + k`` of
the sequence, ``S_j(e)`` being its items in epochs ``0 .. e-1`` (a sum over the stages, linear
within each), in the source's epoch ``(S_j(e) + k) // size``. A change of weights therefore
neither repeats nor skips a record: each source goes on where it was. With a shuffle, each of
the source's epochs is its own keyed ``Permutation`` (keyed by the stream's seed and the
source's name), so a down-sampled source is read without replacement across mixture epochs and
an up-sampled one repeats evenly. An inner mixture is walked in its own slot order the same
way, level by level, through its own schedule.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from yogadl_plus.order.interleave import Interleave
from yogadl_plus.order.permutation import TABLE_MAX, Permutation, hashed_words
from yogadl_plus.order.placement import Part, Placement

__all__ = ["MixOrder", "Schedule", "source_seed"]

# The per-source permutations a MixOrder keeps made (a block of slots reads a few source epochs).
_PERMUTATIONS_KEPT = 64
# Values (a source's epochs in a block of slots, a stage's) spanning fewer than this many are
# found by a pass per value over them; more, by sorting them first (np.unique).
_VALUES_BY_PASSES = 4
# The entries of small sources' tables it keeps (8 bytes each): every epoch of an up-sampled
# source that a mixture's epoch reads, many times over.
_TABLE_ENTRIES_KEPT = 1 << 21
# Per leaf number: the slots' offsets in the run, the leaf's records and the epoch of its own
# that each is read in (one for all, or an array), as found piece by piece.
Found = dict[int, list[tuple[np.ndarray, np.ndarray, int | np.ndarray]]]
#: Every stage of a mixture and of its inner ones, as plain data (what a stream state keeps):
#: the path of each mixture ('' for the outermost, 'text' or 'text/code' inside) -> its stages,
#: each [first epoch, [slots of each source]].
Schedule = dict[str, list[list[Any]]]


def source_seed(seed: int, name: str) -> int:
    """The key of a source's own shuffles: from the stream's seed and the source's name, the
    same in every process."""
    return hashed_words(f"{seed}\x00{name}", 1, b"")[0] >> 1


class MixOrder:
    """The arithmetic of one mixture: sources ``names``, each a leaf of ``parts[j]`` records or
    an inner ``MixOrder``, with ``counts[j]`` slots of every epoch until the first of ``stages``
    ((first epoch, counts) each, epochs ascending from 1) changes them; every stage's counts sum
    to the same epoch size. ``place`` says where slots read; leaves are numbered depth first,
    as ``Mixture.leaves`` lists them."""

    def __init__(
        self,
        names: Sequence[str],
        parts: Sequence[int | MixOrder],
        counts: Sequence[int],
        stages: Sequence[tuple[int, Sequence[int]]] = (),
    ) -> None:
        self.names = tuple(names)
        self.parts = tuple(parts)
        self.counts = tuple(int(c) for c in counts)
        self.epoch_size = sum(self.counts)
        self.stages = _stages(self.counts, stages)
        #: The first epoch of each stage, and each source's items in the epochs before it.
        self._firsts = np.array([first for first, _ in self.stages], dtype=np.int64)
        self._before = _items_before(self.stages)
        self._interleaves = [Interleave(counts) for _, counts in self.stages]
        self.num_leaves: int = sum(_leaves_of(part) for part in self.parts)
        self._permutations: dict[tuple[int, int, int], Permutation] = {}
        self._kept_tables: dict[tuple[int, int, int], np.ndarray] = {}
        self._kept_entries = 0

    def __repr__(self) -> str:
        later = f", stages={self.stages[1:]}" if len(self.stages) > 1 else ""
        return f"MixOrder(names={self.names}, counts={self.counts}{later})"

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_permutations": {}, "_kept_tables": {}, "_kept_entries": 0}

    def counts_at(self, epoch: int) -> tuple[int, ...]:
        """The slots of each source in epoch ``epoch`` (those of the stage then in force)."""
        return self.stages[self._stage_of(epoch)][1]

    def items_before(self, j: int, epoch: int) -> int:
        """Items of source ``j``'s own sequence read in the epochs before ``epoch``."""
        return int(self._before_in(self._stage_of(epoch), j, epoch))

    def _before_in(self, k: int, j: int, epochs: Any) -> Any:
        """``items_before`` for ``epochs`` (one, or an array) all in stage ``k``."""
        first, counts = self.stages[k]
        return int(self._before[k][j]) + (epochs - first) * counts[j]

    def _stage_of(self, epoch: int) -> int:
        return int(np.searchsorted(self._firsts, epoch, side="right")) - 1

    # --- the schedule a stream state keeps, and what a state may load into ---

    def schedule(self, path: str = "") -> Schedule:
        """The stages of this mixture and of every inner one, by path (see ``Schedule``)."""
        out: Schedule = {path: [[first, list(counts)] for first, counts in self.stages]}
        for name, part in zip(self.names, self.parts):
            if isinstance(part, MixOrder):
                out.update(part.schedule(f"{path}/{name}" if path else name))
        return out

    @property
    def scheduled(self) -> bool:
        """Whether this mixture, or an inner one, changes its counts at some epoch."""
        return len(self.stages) > 1 or any(
            isinstance(part, MixOrder) and part.scheduled for part in self.parts
        )

    def first_change(self, saved: Mapping[str, Any], through: int, path: str = "") -> str | None:
        """Where ``saved`` (another mixture's ``schedule()``, same sources) deals an epoch
        ``0 .. through`` of this mixture, or of an inner one in the epochs those read, other
        slots than this one does: 'epoch E' (of an inner one: "epoch E of source 'text'"), or
        None when they agree that far."""
        rows = saved.get(path)
        # (A state without a schedule was saved by a mixture without stages, or by a release
        # before them: its epoch 0, in its fingerprint, is this one's.)
        theirs = self.stages[:1] if rows is None else [(int(f), tuple(c)) for f, c in rows]
        mine = list(self.stages)
        epochs = sorted({first for first, _ in theirs + mine if first <= through})
        for epoch in epochs:
            if _in_force(theirs, epoch) != _in_force(mine, epoch):
                return f"epoch {epoch}" + (f" of source {path!r}" if path else "")
        for j, (name, part) in enumerate(zip(self.names, self.parts)):
            read = self.items_before(j, through + 1)
            if isinstance(part, MixOrder) and read:
                inner = f"{path}/{name}" if path else name
                found = part.first_change(saved, (read - 1) // part.epoch_size, inner)
                if found is not None:
                    return found
        return None

    def size(self, j: int) -> int:
        """Items of source ``j`` per epoch of its own: its records, or an inner mixture's
        epoch size."""
        part = self.parts[j]
        return part.epoch_size if isinstance(part, MixOrder) else part

    def place(self, epoch: int, slots: np.ndarray, shuffle: bool, seed: int) -> Placement:
        """Where the ``slots`` of epoch ``epoch`` read: per leaf, which of ``slots``, that
        leaf's record for each and the epoch of the leaf's own in which it is read (its
        ``own_epochs``). With ``shuffle``, each source walks its epochs in the order of a
        permutation keyed by ``seed`` and the source's name."""
        found: Found = {}
        self._place(int(epoch), np.asarray(slots, np.int64), shuffle, seed, 0, None, found)
        parts: list[Part] = []
        own_epochs: list[int | np.ndarray] = []
        for leaf, pieces in sorted(found.items()):
            if len(pieces) == 1:
                where, records, own = pieces[0]
                parts.append((leaf, where, records))
                own_epochs.append(own)
                continue
            # (From several epochs of an inner mixture, or stages of this one.)
            offsets = np.concatenate([w for w, _, _ in pieces])
            records = np.concatenate([r for _, r, _ in pieces])
            owns = np.concatenate([np.broadcast_to(e, len(w)) for w, _, e in pieces])
            ascending = np.argsort(offsets, kind="stable")
            parts.append((leaf, offsets[ascending], records[ascending]))
            own_epochs.append(owns[ascending])
        return Placement(len(slots), parts, own_epochs=own_epochs)

    def _place(
        self,
        epochs: int | np.ndarray,
        slots: np.ndarray,
        shuffle: bool,
        seed: int,
        first_leaf: int,
        where: np.ndarray | None,
        found: Found,
    ) -> None:
        """Place ``slots`` of ``epochs`` (one for all, or one per slot) at offsets ``where``
        (None: ``0 .. len(slots) - 1``), this mixture's first leaf numbered ``first_leaf``."""
        if isinstance(epochs, int):
            runs = [(self._stage_of(epochs), epochs, slots, where)]
        else:  # (an inner mixture's slots may span its epochs, and so its stages)
            stage = np.searchsorted(self._firsts, epochs, side="right") - 1
            runs = [
                (k, epochs[at], slots[at], np.flatnonzero(at) if where is None else where[at])
                for k, at in _by_value(stage)
            ]
        for k, own_epochs, own_slots, own_where in runs:
            counts = self.stages[k][1]
            leaf = first_leaf
            for j, (at, rank) in enumerate(self._interleaves[k].deal(own_slots)):
                if counts[j] and len(at):
                    # The source's own sequence: its items of mixture epoch e come after those
                    # of the epochs before, through its own epochs in turn.
                    own = own_epochs if isinstance(own_epochs, int) else own_epochs[at]
                    sequence = self._before_in(k, j, own) + rank
                    offsets = at if own_where is None else own_where[at]
                    self._place_source(j, leaf, sequence, shuffle, seed, offsets, found)
                leaf += _leaves_of(self.parts[j])

    def _place_source(
        self,
        j: int,
        leaf: int,
        sequence: np.ndarray,
        shuffle: bool,
        seed: int,
        where: np.ndarray,
        found: Found,
    ) -> None:
        """Place items ``sequence`` of source ``j``'s own sequence (its first leaf ``leaf``) at
        offsets ``where``."""
        part = self.parts[j]
        own_epochs, positions = _own_epochs(sequence, self.size(j))
        if isinstance(part, MixOrder):
            # An inner mixture is walked in its own slot order, not a permutation of it: a part
            # of its epoch is then a prefix, in which each of its sources gets a run of its own
            # sequence (the balance property holds at every level). The items are shuffled all
            # the same: by the outer order, and by the inner sources' own shuffled epochs.
            inner_seed = source_seed(seed, self.names[j])
            part._place(own_epochs, positions, shuffle, inner_seed, leaf, where, found)
            return
        if shuffle:
            positions = self._shuffled(j, own_epochs, positions, seed)
        found.setdefault(leaf, []).append((where, positions, own_epochs))

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
            # (In range by construction: the checks of ``indices`` would cost two passes.)
            return self._permutation(j, key, epochs).permute(positions.astype(np.uint64))
        if size <= TABLE_MAX:
            # A small source up-sampled goes through an epoch every few slots, and a block of a
            # shuffled mixture's slots reads every one of them: their tables are kept.
            unique, inverse = np.unique(epochs, return_inverse=True)
            return self._tables(j, key, size, unique.tolist())[inverse, positions]
        # A big source's block mostly spans two of its epochs (a shuffled block of slots reads
        # across an epoch's end), and up-sampled many times over, many.
        out = np.empty_like(positions)
        for epoch, at in _by_value(epochs):
            permutation = self._permutation(j, key, epoch)
            out[at] = permutation.permute(positions[at].astype(np.uint64))
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


def _stages(
    counts: tuple[int, ...], later: Sequence[tuple[int, Sequence[int]]]
) -> list[tuple[int, tuple[int, ...]]]:
    """Stage 0 (``counts`` from epoch 0) and the ``later`` ones, checked: epochs ascending from
    1, one count per source, each stage's summing to the epoch's size."""
    stages = [(0, counts)]
    for first, stage_counts in later:
        row = tuple(int(c) for c in stage_counts)
        if first <= stages[-1][0]:
            raise ValueError(f"stages must start at ascending epochs >= 1, got {first}")
        if len(row) != len(counts) or sum(row) != sum(counts) or min(row) < 0:
            raise ValueError(
                f"the stage from epoch {first} deals {list(row)}: it needs {len(counts)} "
                f"counts >= 0 summing to the epoch's {sum(counts)} slots"
            )
        stages.append((int(first), row))
    return stages


def _items_before(stages: list[tuple[int, tuple[int, ...]]]) -> list[list[int]]:
    """Each source's items in the epochs before each stage's first (Python ints: no overflow)."""
    before = [[0] * len(stages[0][1])]
    for (first, counts), (following, _) in itertools.pairwise(stages):
        before.append([b + (following - first) * c for b, c in zip(before[-1], counts)])
    return before


def _in_force(stages: Sequence[tuple[int, tuple[int, ...]]], epoch: int) -> tuple[int, ...]:
    """The counts of the last of ``stages`` (ascending) that starts at or before ``epoch``."""
    current = stages[0][1]
    for first, counts in stages:
        if first > epoch:
            break
        current = counts
    return current


def _by_value(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each distinct value of ``values`` (a non-empty int array) and where it is (a mask): a
    pass per value where they span few, else the values found by a sort first."""
    first, last = int(values.min()), int(values.max())
    if last - first < _VALUES_BY_PASSES:
        masks = [(v, values == v) for v in range(first, last + 1)]
        return [(v, at) for v, at in masks if at.any()]
    return [(v, values == v) for v in np.unique(values).tolist()]


def _own_epochs(sequence: np.ndarray, size: int) -> tuple[int | np.ndarray, np.ndarray]:
    """(epoch, position) in a source's own epochs of ``size`` items for each item number of
    its ``sequence``: one epoch for all when they share it (no division per item)."""
    low, high = int(sequence.min()) // size, int(sequence.max()) // size
    if low == high:
        return low, sequence - low * size
    epochs = sequence // size  # (by one number: libdivide, twice as fast as np.divmod)
    return epochs, sequence - epochs * size


def _leaves_of(part: int | MixOrder) -> int:
    """The leaves of a source: one for a DataRef's records, an inner mixture's own."""
    return part.num_leaves if isinstance(part, MixOrder) else 1
