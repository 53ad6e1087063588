"""Two cached datasets mixed 3:1, fed to a PyTorch DataLoader, interrupted mid-epoch, resumed.

``web`` (6,000 records) and ``books`` (1,000 records) are cached once and mixed with
``ydl.mix(..., weights={"web": 3, "books": 1})``: every epoch of 7,000 items holds exactly
5,250 web records (down-sampled: most of web, the rest next epoch) and 1,750 books (up-sampled:
each book once, 750 of them twice). A DataLoader with two workers over the mixture's shuffled
stream is stopped after 40 batches; its ``state_dict()`` goes to a JSON file; a new loader made
the same way loads it and finishes the epoch. The items it hands out are exactly the rest of an
uninterrupted run.

Without torch installed, the same interruption and resume run on the stream itself
(``stream.state()`` and ``load_state``).

Run: python examples/mixture.py [STORAGE_DIR]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

import yogadl_plus as ydl

SOURCES = {"web": 6_000, "books": 1_000}
WEIGHTS = {"web": 3, "books": 1}
SEED = 2024  # the shuffle seed: the resumed run must use the same one
BATCH = 64
STOP_AFTER = 40  # batches before the interruption; an epoch has 7,000 / 64 -> 110


def documents(code: int, n: int) -> Iterator[dict[str, Any]]:
    """Stand-in for a tokenized corpus: which source, which document, its features."""
    rng = np.random.default_rng(code)
    for i in range(n):
        yield {"source": code, "doc": i, "x": rng.standard_normal(16).astype(np.float32)}


def pairs(batches: Iterable[Any]) -> list[tuple[int, int]]:
    """(source, document) of every item of these batches, in order."""
    return [
        (int(s), int(d))
        for batch in batches
        for s, d in zip(batch["source"].tolist(), batch["doc"].tolist())
    ]


def main(root: str) -> None:
    storage = ydl.LocalStorage(os.path.join(root, "caches"))
    refs = {
        name: ydl.cache_dataset(documents(code, n), f"corpus-{name}", "v1", storage, progress=False)
        for code, (name, n) in enumerate(SOURCES.items())
    }
    mix = ydl.mix(refs, weights=WEIGHTS)
    print(f"{mix}: {len(mix)} items an epoch")
    args = dict(shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
    state_file = os.path.join(root, "loader_state.json")

    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: interrupting and resuming the stream itself instead")
        make, save, load = _stream_face(mix, args)
    else:
        make, save, load = _torch_face(mix, args)

    reference = pairs(make())  # one uninterrupted epoch, for comparison

    loader = make()
    before = []
    for step, batch in enumerate(loader, start=1):
        before.append(batch)
        if step == STOP_AFTER:
            with open(state_file, "w") as f:
                json.dump(save(loader), f)  # what a checkpoint saves with the model
            break
    del loader  # the job is gone (its workers too)
    print(f"interrupted after {STOP_AFTER} batches; state saved to {state_file}")

    resumed = make()
    with open(state_file) as f:
        load(resumed, json.load(f))
    after = pairs(resumed)

    seen = pairs(before) + after
    assert seen == reference, "the resumed run differs from the uninterrupted one"
    print(
        f"resumed: the {len(after)} items after the state are exactly the rest of an "
        "uninterrupted epoch"
    )

    counts = {name: sum(s == code for s, _ in seen) for code, name in enumerate(SOURCES)}
    assert list(counts.values()) == mix.counts, (counts, mix.counts)
    for code, (name, n) in enumerate(SOURCES.items()):
        reads = np.bincount([d for s, d in seen if s == code], minlength=n)
        assert reads.max() - reads.min() <= 1, f"{name} was read unevenly"
        print(
            f"  {name}: {counts[name]} of {len(mix)} items ({counts[name] / len(mix):.0%}); "
            f"its {n} records read {reads.min()} to {reads.max()} times each"
        )
    books = [np.mean(batch["source"].tolist()) for batch in before]
    print(
        f"  books per batch of {BATCH} (shuffled): {min(books):.0%} to {max(books):.0%}, "
        f"mean {np.mean(books):.1%}"
    )


def _torch_face(mix: ydl.Mixture, args: dict[str, Any]) -> tuple[Any, Any, Any]:
    """ydl.torch.make_dataloader over the mixture's stream, with two worker processes."""

    def make() -> Any:
        return ydl.torch.make_dataloader(mix.stream(**args), num_workers=2)

    return make, lambda loader: loader.state_dict(), lambda loader, s: loader.load_state_dict(s)


def _stream_face(mix: ydl.Mixture, args: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The stream alone: the same batches (as numpy arrays) and a checked state."""

    def make() -> Any:
        return mix.stream(**args)

    return (
        make,
        lambda stream: stream.state().to_dict(),
        lambda stream, s: stream.load_state(s),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
