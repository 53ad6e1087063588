"""The order of one shard, epoch by epoch, as a pure function ``(epoch, position) -> index``.

``ShardByRecords`` (``shard_by="records"``, the default) strides through one global order of all
positions per epoch: shard ``r`` of ``S`` takes global positions ``r, r + S, ...``, so every epoch
reshuffles across shards, and ``global_offset``/``global_start`` rescale a job elastically.
``ShardByChunks`` (``shard_by="chunks"``) gives each shard whole chunks and shuffles among their
records only. Both count a shard's offsets with ``EpochPositions``. Resuming, sharding and
rescaling are then arithmetic, in O(1) memory and with no I/O.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from yogadl_plus.checks import check_int
from yogadl_plus.order.permutation import Permutation
from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.order.window import WindowPermutation

__all__ = ["EpochPositions", "ShardByChunks", "ShardByRecords", "ShardOrder", "shard_order"]

_MAX_N = 1 << 63  # positions and record indices are int64

Counts = Sequence[int] | npt.NDArray[np.int64]


@dataclass(frozen=True)
class EpochPositions:
    """A shard's offsets as ``(epoch, position)``: offsets count positions from the start of
    ``first_epoch`` (``first_length`` positions, fewer than ``length`` when it was begun part-way
    by ``global_start``), then ``length`` per epoch."""

    first_epoch: int
    first_length: int
    length: int

    def position_of(self, offset: int) -> tuple[int, int]:
        """``(epoch, position)`` of ``offset``."""
        first, first_length = self.first_epoch, self.first_length
        # Offset 0 is the first epoch even when this shard has nothing left in it (a resumed
        # epoch can be empty for some shards): its first iteration must still be that epoch.
        if offset < first_length or offset == 0 or not self.length:
            return first, min(offset, first_length)
        epochs, position = divmod(offset - first_length, self.length)
        return first + 1 + epochs, position

    def offset_of(self, epoch: int, position: int) -> int:
        """The offset of ``position`` in ``epoch`` (``position_of``'s inverse)."""
        if epoch == self.first_epoch:
            return position
        return self.first_length + (epoch - self.first_epoch - 1) * self.length + position


def shard_order(settings: OrderSettings, num_positions: int, chunk_records: Counts) -> ShardOrder:
    """The order of ``num_positions`` positions (records, or n-gram windows) by ``settings``.

    ``chunk_records`` counts the positions of each chunk (records; for n-grams, the anchors
    whose anchor record lies in it): ``shard_by="chunks"`` deals them out, ``shuffle_window``
    groups them in windows."""
    if settings.shard_by == "chunks":
        return ShardByChunks(chunk_records, settings)
    return ShardByRecords(num_positions, settings, chunk_records=chunk_records)


def _settings_or(
    settings: OrderSettings | None, options: dict[str, Any], **defaults: Any
) -> OrderSettings:
    """The settings an order is made with: given whole, or as OrderSettings' keywords (over
    ``defaults``)."""
    if settings is None:
        return OrderSettings(**{**defaults, **options})
    if options:
        raise TypeError(f"pass OrderSettings or keywords, not both: got {sorted(options)}")
    return settings


class ShardByRecords:
    """Shard ``shard_rank`` of ``num_shards`` of one global order per epoch.

    Each epoch has one order over all ``num_records`` positions: the identity, or with
    ``shuffle=True`` the ``Permutation(num_records, shuffle_seed, epoch)`` (epoch 0's for every
    epoch with ``skip_shuffle_at_epoch_end=True``; a ``WindowPermutation`` of the positions
    grouped by ``chunk_records`` with ``shuffle_window``). ``drop_shard_remainder=True`` first
    cuts it to its first ``global_length`` positions, a multiple of ``num_shards``;
    ``pad_shard_remainder=True`` extends it to the next multiple, position ``num_records + k``
    holding what position ``k`` holds (DistributedSampler's padding). Shard ``r`` of ``S`` takes
    positions ``r, r + S, r + 2S, ...``: within an epoch the shards are disjoint and together
    cover the (cut or padded) order. Any ``(epoch, position)`` costs the same.

    ``global_start = g`` starts in epoch ``g // num_records`` at position ``g % num_records``:
    in that first epoch, shard ``r`` takes positions ``g0 + r, g0 + r + S, ...``, cut (or
    padded) to a multiple of ``S`` after ``g0``; later epochs are whole.

    Made from ``OrderSettings`` or its keywords: ``ShardByRecords(10, shuffle=True,
    shuffle_seed=1)``.
    """

    def __init__(
        self,
        num_records: int,
        settings: OrderSettings | None = None,
        *,
        chunk_records: Counts | None = None,
        **options: Any,
    ) -> None:
        settings = _settings_or(settings, options)
        if settings.shuffle and settings.shuffle_seed is None:
            raise ValueError(
                "shuffle=True needs a seed, got shuffle_seed=None: pass shuffle_seed; the "
                "Stream draws one when none is given"
            )
        self.settings = settings
        self.num_records = check_int("num_records", num_records, 0, _MAX_N)
        self.global_start = settings.global_start or 0
        self.shuffle_seed = settings.shuffle_seed
        self.num_shards = settings.num_shards
        self.shard_rank = settings.shard_rank
        self._chunk_records = _chunk_counts(
            chunk_records, self.num_records, settings.shuffle_window
        )
        self._pad = settings.pad_shard_remainder
        self.global_length = self._evened(0)
        self.shard_length = len(range(self.shard_rank, self.global_length, self.num_shards))
        n = self.num_records
        self.first_epoch, self.first_global = divmod(self.global_start, n) if n else (0, 0)
        first_length = self.epoch_length(self.first_epoch)
        self.positions = EpochPositions(self.first_epoch, first_length, self.shard_length)
        self._perm: Permutation | WindowPermutation | None = None

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"ShardByRecords(num_records={self.num_records}, shuffle={s.shuffle}, "
            f"shuffle_seed={s.shuffle_seed}, "
            f"skip_shuffle_at_epoch_end={s.skip_shuffle_at_epoch_end}, "
            f"shard_rank={self.shard_rank}, num_shards={self.num_shards}, "
            f"drop_shard_remainder={s.drop_shard_remainder}, "
            f"pad_shard_remainder={s.pad_shard_remainder}, global_start={self.global_start}, "
            f"shuffle_window={s.shuffle_window})"
        )

    # --- lengths ---

    def epoch_start(self, epoch: int) -> int:
        """The global position where ``epoch`` starts: ``global_start``'s in the first epoch."""
        if epoch < self.first_epoch:
            raise ValueError(
                f"epoch {epoch} comes before this order's first epoch {self.first_epoch} "
                f"(global_start={self.global_start})"
            )
        return self.first_global if epoch == self.first_epoch else 0

    def epoch_global_length(self, epoch: int) -> int:
        """The end of ``epoch``'s global order (cut, or padded, to whole rounds of shards after
        its start)."""
        start = self.epoch_start(epoch)
        return self._evened(start) if start else self.global_length

    def _evened(self, start: int) -> int:
        """The end of an epoch's global order begun at ``start``."""
        n, shards = self.num_records, self.num_shards
        if self.settings.drop_shard_remainder:
            return start + (n - start) // shards * shards
        if self._pad:
            return start + -(-(n - start) // shards) * shards
        return n

    def shard_lengths(self, epoch: int) -> list[int]:
        """Positions of every shard (rank 0, 1, ...) in ``epoch``."""
        start, end = self.epoch_start(epoch), self.epoch_global_length(epoch)
        return [len(range(start + rank, end, self.num_shards)) for rank in range(self.num_shards)]

    def epoch_length(self, epoch: int) -> int:
        """Positions of this shard in ``epoch`` (fewer in a first epoch begun mid-way)."""
        start = self.epoch_start(epoch)
        if not start:
            return self.shard_length
        return len(range(start + self.shard_rank, self.epoch_global_length(epoch), self.num_shards))

    # --- positions ---

    def global_position(self, position: int) -> int:
        """Where this shard's ``position`` sits in a whole epoch's global order (in the first
        epoch of a ``global_start`` order, add ``epoch_start(epoch)``)."""
        position = check_int("position", position, 0)
        return self.shard_rank + self.num_shards * position

    def global_offset(self, epoch: int, position: int) -> int:
        """The global position, counted from epoch 0, reached when every shard has handed out
        ``position`` items of ``epoch``: what ``global_start`` takes to resume there."""
        reached = self.epoch_start(epoch) + self.num_shards * position
        # (Past num_records, a padded order only repeats records: the epoch is done.)
        if reached >= min(self.epoch_global_length(epoch), self.num_records):
            return (epoch + 1) * self.num_records
        return epoch * self.num_records + reached

    def indices(self, epoch: int, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The int64 indices at this shard's positions ``[start, stop)`` of ``epoch``.

        ``start`` and ``stop`` are clipped to the epoch; the work is O(stop - start) for any
        epoch and position.
        """
        epoch = check_int("epoch", epoch, 0)
        length = self.epoch_length(epoch)
        start = min(max(operator.index(start), 0), length)
        stop = min(max(operator.index(stop), start), length)
        positions = np.arange(start, stop, dtype=np.int64)
        positions *= self.num_shards
        positions += self.shard_rank + self.epoch_start(epoch)
        if self._pad and stop > start and positions[-1] >= self.num_records:
            positions %= self.num_records  # the padding repeats the order's first positions
        perm = self.permutation(epoch)
        return positions if perm is None else perm.permute(positions.view(np.uint64))

    def index(self, epoch: int, position: int) -> int:
        """The index at this shard's ``position`` of ``epoch``."""
        epoch = check_int("epoch", epoch, 0)
        position = _check_position(operator.index(position), self.epoch_length(epoch))
        global_position = self.epoch_start(epoch) + self.shard_rank + self.num_shards * position
        if self._pad:
            global_position %= self.num_records  # the padding repeats the first positions
        perm = self.permutation(epoch)
        return global_position if perm is None else perm[global_position]

    # --- the epoch's global order ---

    def permutation(self, epoch: int) -> Permutation | WindowPermutation | None:
        """The permutation of ``epoch``'s global order (None: unshuffled)."""
        settings = self.settings
        if not settings.shuffle:
            return None
        assert settings.shuffle_seed is not None
        key_epoch = 0 if settings.skip_shuffle_at_epoch_end else epoch
        perm = self._perm  # one read, so a concurrent caller can only replace it
        if perm is None or perm.epoch != key_epoch:
            if settings.shuffle_window is None:
                perm = Permutation(self.num_records, settings.shuffle_seed, key_epoch)
            else:
                assert self._chunk_records is not None
                perm = WindowPermutation(
                    self._chunk_records, settings.shuffle_window, settings.shuffle_seed, key_epoch
                )
            self._perm = perm
        return perm

    def window_permutation(self, epoch: int) -> WindowPermutation | None:
        """The windowed permutation of ``epoch``'s global order (its chunk order and windows,
        for a reader that fetches chunks ahead), or None without ``shuffle_window``."""
        perm = self.permutation(check_int("epoch", epoch, 0))
        return perm if isinstance(perm, WindowPermutation) else None


class ShardByChunks:
    """The order of a shard made of whole chunks: shard ``r`` of ``S`` owns chunks
    ``r, r + S, r + 2S, ...`` and shuffles only among their records.

    A rank then reads (and pulls from a remote store) only its own chunks, at the price of a
    shuffle that never mixes records across shards. ``drop_shard_remainder=True`` cuts every
    shard to the shortest one's length, ``pad_shard_remainder=True`` extends every shard to the
    longest one's by wrapping around its own order, so all shards have as many positions (with
    the padding, a shard's first records come twice in an epoch). There is no global
    order, so no ``global_start`` and no ``global_offset``: resume with ``start_offset`` on the
    same number of shards.
    """

    def __init__(
        self, chunk_records: Counts, settings: OrderSettings | None = None, **options: Any
    ) -> None:
        settings = _settings_or(settings, options, shard_by="chunks")
        num_shards, shard_rank = settings.num_shards, settings.shard_rank
        counts = np.asarray(chunk_records, dtype=np.int64)
        if len(counts) < num_shards:
            raise ValueError(
                f"shard_by='chunks' needs at least one chunk per shard: this version has "
                f"{len(counts)} chunks for num_shards={num_shards}; build it with a smaller "
                "chunk_bytes, or shard by records"
            )
        self.settings = settings
        self.shuffle_seed = settings.shuffle_seed
        self.shard_rank, self.num_shards = shard_rank, num_shards
        self.chunks = np.arange(shard_rank, len(counts), num_shards)
        mine = counts[self.chunks]
        # Where each of this shard's chunks starts in the version, and ends in its own numbering.
        self._starts = (np.cumsum(counts) - counts)[self.chunks]
        self._ends = np.cumsum(mine)
        self._local_starts = self._ends - mine
        # Within its chunks, the shard is the one shard of an order of their records (a
        # windowed shuffle then windows this shard's chunks).
        whole = dataclasses.replace(
            settings,
            shard_rank=0,
            num_shards=1,
            drop_shard_remainder=False,
            pad_shard_remainder=False,
            global_start=None,
        )
        self._own = ShardByRecords(int(mine.sum()), whole, chunk_records=mine)
        self.num_records = self._own.num_records
        self._lengths = [int(counts[r::num_shards].sum()) for r in range(num_shards)]
        if settings.drop_shard_remainder:
            # Each epoch takes the first `shortest` positions of this shard's own shuffle: a
            # different cut every shuffled epoch, as with shard_by="records".
            self._lengths = [min(self._lengths)] * num_shards
        elif settings.pad_shard_remainder:
            self._lengths = [max(self._lengths)] * num_shards
        self.shard_length = self._lengths[shard_rank]
        self.first_epoch = 0
        self.positions = EpochPositions(0, self.shard_length, self.shard_length)

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"ShardByChunks(chunks={len(self.chunks)}, records={self.num_records}, "
            f"shuffle={s.shuffle}, shuffle_seed={s.shuffle_seed}, shard_rank={self.shard_rank}, "
            f"num_shards={self.num_shards}, drop_shard_remainder={s.drop_shard_remainder}, "
            f"pad_shard_remainder={s.pad_shard_remainder}, shuffle_window={s.shuffle_window})"
        )

    def epoch_length(self, epoch: int) -> int:
        """Positions of this shard in ``epoch``: every epoch has ``shard_length``."""
        return self.shard_length

    def shard_lengths(self, epoch: int) -> list[int]:
        """Positions of every shard (rank 0, 1, ...) in ``epoch``."""
        return list(self._lengths)

    def global_offset(self, epoch: int, position: int) -> int:
        raise ValueError(
            "a stream with shard_by='chunks' has no global order: resume it with start_offset "
            "on the same number of shards"
        )

    def indices(self, epoch: int, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The record indices at this shard's positions ``[start, stop)`` of ``epoch``, clipped
        to the epoch."""
        start = min(max(operator.index(start), 0), self.shard_length)
        stop = min(max(operator.index(stop), start), self.shard_length)
        own = self.num_records
        if stop <= own:
            return self._records(self._own.indices(epoch, start, stop))
        # Padded past this shard's own records: its order again from its start.
        parts, first = [], start
        while first < stop:
            local = first % own
            end = min(stop, first + own - local)
            parts.append(self._own.indices(epoch, local, local + end - first))
            first = end
        return self._records(np.concatenate(parts))

    def index(self, epoch: int, position: int) -> int:
        """The record index at this shard's ``position`` of ``epoch``."""
        _check_position(operator.index(position), self.shard_length)
        found = self._own.index(epoch, position % self.num_records)
        return int(self._records(np.array([found], dtype=np.int64))[0])

    def window_permutation(self, epoch: int) -> WindowPermutation | None:
        """The windowed permutation of this shard's own chunks in ``epoch`` (see
        ``ShardByRecords.window_permutation``)."""
        return self._own.window_permutation(epoch)

    def _records(self, local: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """This shard's k-th record -> the version's record index."""
        chunk = np.searchsorted(self._ends, local, side="right")
        return self._starts[chunk] + (local - self._local_starts[chunk])


ShardOrder = ShardByRecords | ShardByChunks


def _check_position(position: int, length: int) -> int:
    if not 0 <= position < length:
        raise IndexError(
            f"Got position {position}, allowed positions are in [0, {length - 1}]"
            if length
            else f"Got position {position}, but this shard has no positions"
        )
    return position


def _chunk_counts(
    chunk_records: Counts | None, num_records: int, window: int | None
) -> npt.NDArray[np.int64] | None:
    """The positions per chunk as int64, checked to add up to ``num_records``: only a windowed
    shuffle needs (and checks) them."""
    if window is None:
        return None
    if chunk_records is None:
        raise ValueError(
            "shuffle_window needs the records of each chunk: pass chunk_records (the Stream "
            "passes its version's)"
        )
    counts = np.asarray(chunk_records)
    if counts.ndim != 1 or (counts.size and counts.dtype.kind not in "iu"):
        raise ValueError(f"chunk_records must be a 1-d sequence of ints, got {chunk_records!r}")
    counts = counts.astype(np.int64)
    if (counts.size and counts.min() < 0) or int(counts.sum()) != num_records:
        raise ValueError(
            f"chunk_records must be counts >= 0 adding up to num_records={num_records}, got "
            f"{len(counts)} chunks adding up to {int(counts.sum())}"
        )
    return counts
