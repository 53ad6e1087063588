"""What the mixture tests share (tests/test_mixture_*.py), and their fixtures (a pytest plugin,
registered from ``tests/conftest.py``).

Sources are small real caches of records ``{"src": j, "i": i}``, built once per test module
(``pool``) and mixed at the weights, epoch sizes and shards Hypothesis draws (``mixtures``);
the expected shares are computed here with fractions (``largest_remainder``), not by the
library.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import yogadl_plus as ydl
from yogadl_plus.mixture import Mixture

NAMES = ("a", "b", "c", "d")
SIZES = (1, 2, 3, 5, 8, 13)

Pair = tuple[int, int]
Pool = Callable[[int, int], ydl.DataRef]

# Hypothesis reads real (tiny) caches: a few dozen examples per property keep the module quick.
PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def mixture_storage(tmp_path_factory: pytest.TempPathFactory) -> ydl.LocalStorage:
    """The test module's storage of mixture sources."""
    return ydl.LocalStorage(tmp_path_factory.mktemp("mixture"))


@pytest.fixture(scope="module")
def pool(mixture_storage: ydl.LocalStorage) -> Pool:
    """``pool(j, n)``: the dataset of source number ``j`` with ``n`` records ``{"src": j, "i":
    i}``, built on first use and kept for the module."""
    made: dict[tuple[int, int], ydl.DataRef] = {}

    def of(j: int, n: int) -> ydl.DataRef:
        if (j, n) not in made:
            records = [{"src": np.int64(j), "i": np.int64(i)} for i in range(n)]
            made[(j, n)] = ydl.cache_dataset(
                records, f"s{j}", f"n{n}", mixture_storage, progress=False
            )
        return made[(j, n)]

    return of


@pytest.fixture(scope="module")
def three(pool: Pool) -> Mixture:
    """Sources of 13, 5 and 8 records at weights 3 : 2 : 1, 70 items an epoch."""
    return ydl.mix(
        {"a": pool(0, 13), "b": pool(1, 5), "c": pool(2, 8)},
        {"a": 3, "b": 2, "c": 1},
        epoch_size=70,
    )


@st.composite
def mixtures(draw: st.DrawFn, max_sources: int = 4) -> dict[str, Any]:
    """Sizes, weights (None: by size) and epoch size (None: the sum of the sizes) of a mixture."""
    k = draw(st.integers(1, max_sources))
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=k, max_size=k))
    weights: list[Any] | None = None
    if draw(st.booleans()):
        weights = draw(
            st.lists(
                st.one_of(
                    st.integers(0, 6),
                    st.sampled_from([0.5, 0.1, 2.75, Fraction(1, 3), Fraction(5, 7)]),
                ),
                min_size=k,
                max_size=k,
            )
        )
        if not any(weights):
            weights[draw(st.integers(0, k - 1))] = 1
    epoch_size = draw(st.one_of(st.none(), st.integers(1, 40)))
    return {"sizes": sizes, "weights": weights, "epoch_size": epoch_size}


def make(pool: Pool, spec: dict[str, Any]) -> Mixture:
    sources = {NAMES[j]: pool(j, n) for j, n in enumerate(spec["sizes"])}
    weights = spec["weights"]
    named = None if weights is None else dict(zip(NAMES, weights))
    return ydl.mix(sources, named, epoch_size=spec["epoch_size"])


def largest_remainder(weights: Sequence[Any], total: int) -> list[int]:
    """``total`` split by ``weights``: each quota rounded down, then one more to the largest
    fractional parts (earlier first among equal ones); computed here, not by the library."""
    exact = [Fraction(w) for w in weights]
    quotas = [w * total / sum(exact) for w in exact]
    parts = [q.numerator // q.denominator for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda j: (parts[j] - quotas[j], j))
    for j in by_remainder[: total - sum(parts)]:
        parts[j] += 1
    return parts


def expected_counts(spec: dict[str, Any]) -> list[int]:
    weights = spec["weights"] if spec["weights"] is not None else spec["sizes"]
    total = spec["epoch_size"] if spec["epoch_size"] is not None else sum(spec["sizes"])
    return largest_remainder(weights, total)


def pair(item: dict[str, Any]) -> Pair:
    return int(item["src"]), int(item["i"])


def epoch_pairs(stream: ydl.Stream) -> list[Pair]:
    """The stream's next epoch as (src, i) pairs, in order."""
    return [pair(item) for item in stream]


def take(stream: ydl.Stream, k: int) -> list[Pair]:
    """The stream's next ``k`` items, through as many epochs as it takes."""
    out: list[Pair] = []
    while len(out) < k:
        out += [pair(item) for item in itertools.islice(iter(stream), k - len(out))]
    return out


def batch_pairs(batches: Iterable[dict[str, Any]]) -> list[Pair]:
    out: list[Pair] = []
    for batch in batches:
        out += [(int(s), int(i)) for s, i in zip(np.asarray(batch["src"]), np.asarray(batch["i"]))]
    return out


def with_twice(item: dict[str, Any]) -> dict[str, Any]:
    """A transform: the item, and twice its ``i`` as ``twice``."""
    return {"src": item["src"], "i": item["i"], "twice": int(item["i"]) * 2}
