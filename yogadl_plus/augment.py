"""Seeded augmentation: ``ydl.random_map(fn)`` is a stream transform whose randomness is the
record's own, so a resumed run draws the augmentations the first run drew.

``fn(record, rng)`` gets a ``numpy.random.Generator`` keyed by (seed, epoch, record index), and
the source's name in a mixture: the same record in the same epoch gets the same augmentation
whatever happened before it, after any resume, with any number or kind of workers, on any
number of shards, after an elastic rescale and through every face, since none of those change
an epoch's records, only who reads them and when. In a mixture the epoch is the source's own
(``Placement.record_epochs``): a mixture's epoch reads an up-sampled source's records once in
each of its own epochs that it walks through, and each of those copies draws its own; a source
read once per mixture epoch (weights in proportion to the sizes) has its own epochs numbered as
the mixture's. (Grain's ``RandomMapTransform`` draws from a
seed and the element's position in its pipeline; NVIDIA DALI checkpoints its operators' random
state. Here there is no state to save.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from yogadl_plus.checks import check_int
from yogadl_plus.order.permutation import hashed_words

__all__ = ["RandomMap", "random_map"]

_DOMAIN = b"ydl-augment-v1"


def random_map(fn: Callable[[Any, np.random.Generator], Any], seed: int | None = None) -> RandomMap:
    """A transform (``stream(transform=...)``) that calls ``fn(record, rng)``, ``rng`` keyed by
    ``seed`` (None: the stream's shuffle seed), the epoch, the record's index and, in a mixture,
    its source's name (and the epoch is that source's own). See the module's docstring."""
    return RandomMap(fn, seed)


class RandomMap:
    """``fn(record, rng)`` with the record's own generator (see ``random_map``). Picklable when
    ``fn`` is (a module-level function), as worker processes need."""

    def __init__(
        self, fn: Callable[[Any, np.random.Generator], Any], seed: int | None = None
    ) -> None:
        if not callable(fn):
            raise ValueError(f"random_map needs a function fn(record, rng), got {fn!r}")
        self.fn = fn
        self.seed = None if seed is None else check_int("seed", seed, 0)

    def __repr__(self) -> str:
        return f"random_map({getattr(self.fn, '__qualname__', self.fn)!r}, seed={self.seed})"

    def __call__(self, record: Any) -> Any:
        raise TypeError(
            "a random_map runs inside a stream, which gives it each record's epoch and index: "
            "pass it as stream(transform=...)"
        )

    def apply(self, record: Any, stream_seed: int, epoch: int, index: int, source: str) -> Any:
        """``fn`` of ``record`` (record ``index`` of ``source``, "" for a DataRef's own) read in
        ``epoch`` (of ``source``'s own), with its generator; ``stream_seed`` stands in for a
        seed of None."""
        return self.fn(
            record,
            generator(self.seed if self.seed is not None else stream_seed, epoch, index, source),
        )


def generator(seed: int, epoch: int, index: int, source: str = "") -> np.random.Generator:
    """The generator of record ``index`` of ``source`` in ``epoch`` under ``seed``: Philox keyed
    by 128 bits of BLAKE2b of the four, the same in every process and Python version."""
    low, high = hashed_words(f"{seed}:{epoch}:{index}:{source}", 2, _DOMAIN)
    return np.random.Generator(np.random.Philox(key=low | (high << 64)))
