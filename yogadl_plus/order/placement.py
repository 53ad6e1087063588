"""Placement: where a run of consecutive positions reads, source by source.

Any ``RecordSource`` answers ``place(epoch, positions, ...)`` with one: a DataRef puts every
position on its one source (``Placement.whole``), a Mixture deals them out to its sources' records.
The stream's reader then reads each part from its own DataRef, with no branch on what kind of
source made it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Part", "Placement"]

# (leaf number, the part's offsets in the run (ascending; None: every offset, in order), and
# the record of that leaf at each).
Part = tuple[int, "np.ndarray | None", np.ndarray]


class Placement:
    """Where ``length`` consecutive positions read: per part, a leaf of the source (its number
    in ``source.leaves``), which of the run's offsets it serves and that leaf's record at each.

    ``single`` is the one part when it serves every offset in order (a DataRef's run, or a
    mixture's run that reads one source only): its reads are the run's, in order.

    ``own_epochs`` (one per part) says in which epoch of its own source each record is read,
    where that is not the run's ``epoch``: a mixture reads a source through its own sequence of
    epochs, so that an up-sampled record comes once in each of them (``record_epochs``).
    """

    # (A stream makes one per unit of work: a plain class with slots costs least to make.)
    __slots__ = ("epoch", "length", "own_epochs", "parts", "single")

    def __init__(
        self,
        length: int,
        parts: list[Part],
        epoch: int = 0,
        own_epochs: list[int | np.ndarray] | None = None,
    ) -> None:
        self.length = length
        self.parts = parts
        #: The epoch of the positions.
        self.epoch = epoch
        self.own_epochs = own_epochs
        self.single: Part | None = None
        if len(parts) == 1:
            where = parts[0][1]
            if where is None or len(where) == length:
                self.single = parts[0]

    @staticmethod
    def whole(records: np.ndarray, leaf: int = 0, epoch: int = 0) -> Placement:
        """Every position of the run on ``leaf``, reading ``records`` in order."""
        placement = Placement.__new__(Placement)  # (what __init__ would find, made directly)
        part = (leaf, None, records)
        placement.length, placement.parts, placement.single = len(records), [part], part
        placement.epoch, placement.own_epochs = epoch, None
        return placement

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"Placement(length={self.length}, parts={self.parts!r})"

    def record_epochs(self, k: int) -> int | np.ndarray:
        """The epoch of its own source in which each record of part ``k`` is read (one int for
        all, or an array): what a seeded augmentation draws from, with the record, so that two
        readings of a record in one epoch of a mixture draw apart."""
        return self.epoch if self.own_epochs is None else self.own_epochs[k]

    def offsets(self, part: Part) -> np.ndarray:
        """The run's offsets that ``part`` serves, as an array."""
        where = part[1]
        return np.arange(len(part[2]), dtype=np.int64) if where is None else where

    def split(self, step: int) -> list[Placement]:
        """This run cut into runs of ``step`` positions (the last may be shorter)."""
        starts = range(0, self.length, step)
        if self.own_epochs is None and len(self.parts) == 1 and self.parts[0][1] is None:
            # (The most common, made fast.)
            leaf, _, records = self.parts[0]
            epoch = self.epoch
            return [Placement.whole(records[start : start + step], leaf, epoch) for start in starts]
        # Each part is cut once for all runs (a searchsorted per run would cost per run), and
        # its offsets made relative to their runs in one pass: each run's are then a slice.
        cuts = [
            (leaf, where, records, [])
            if where is None
            else (
                leaf,
                where % step,
                records,
                [*np.searchsorted(where, starts).tolist(), len(where)],
            )
            for leaf, where, records in self.parts
        ]
        owns = self.own_epochs
        runs = []
        for k, start in enumerate(starts):
            stop = min(start + step, self.length)
            parts: list[Part] = []
            epochs: list[int | np.ndarray] = []
            for n, (leaf, where, records, at) in enumerate(cuts):
                if where is None:
                    low, high = start, stop
                else:
                    low, high = at[k], at[k + 1]
                    if high <= low:
                        continue
                parts.append((leaf, None if where is None else where[low:high], records[low:high]))
                if owns is not None:
                    own = owns[n]
                    epochs.append(own if isinstance(own, int) else own[low:high])
            runs.append(
                Placement(stop - start, parts, self.epoch, None if owns is None else epochs)
            )
        return runs

    def __getitem__(self, run: slice) -> Placement:
        """The positions [start, stop) of this run, as a run of their own (as for arrays)."""
        start, stop, _ = run.indices(self.length)
        owns = self.own_epochs
        parts: list[Part] = []
        epochs: list[int | np.ndarray] = []
        for n, (leaf, where, records) in enumerate(self.parts):
            if where is None:
                low, high = start, stop
                parts.append((leaf, None, records[start:stop]))
            else:
                low, high = np.searchsorted(where, (start, stop)).tolist()
                if high <= low:
                    continue
                parts.append((leaf, where[low:high] - start, records[low:high]))
            if owns is not None:
                own = owns[n]
                epochs.append(own if isinstance(own, int) else own[low:high])
        return Placement(max(stop - start, 0), parts, self.epoch, None if owns is None else epochs)
