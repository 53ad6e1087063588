"""The peers' side of bench.bench_tokens: litdata's TokensLoader and Megatron's GPTDataset on
the same tokens, each run in its side venv. Does not import yogadl_plus.

    .baselines/peers/bin/python -m bench.baselines.token_peers litdata \
        --flat FLAT.npy --ends ENDS.npy --workdir DIR [--length 2049] [--batch-size 16]
    .baselines/megatron/bin/python -m bench.baselines.token_peers megatron \
        --bin DOCS.bin --lengths LENGTHS.npy --workdir DIR [--length 2049] [--batch-size 16] \
        [--eos 50256]
    python -m bench.baselines.token_peers numpy-index --lengths LENGTHS.npy [--length 2049]

Each takes ``--repeats R`` too (best of R, default 3).

The tokens are int32. ``FLAT.npy``/``DOCS.bin``: every document's tokens end to end, each
already followed by its end-of-document token (Megatron's ``.bin`` layout: the raw tokens, no
header); ``ENDS.npy``: where each document ends in it (int64); ``LENGTHS.npy``: each document's
length, end-of-document token included (int32).

- ``litdata``: ``litdata.optimize`` writes the documents (one numpy array each, in order, 1
  worker so that the order is kept) into litdata's token format, chunks of ``length * 1024``
  tokens, with ``item_loader=TokensLoader()`` (timed once: the build). Then
  ``StreamingDataset(item_loader=TokensLoader(block_size=length), shuffle=True, seed=0)``
  through ``StreamingDataLoader(batch_size, num_workers=0)``: ``epoch_s``, the best of
  ``--repeats`` whole epochs (construction included), each checked to hand out every block once
  (count and the sum of every token); ``first_batch_s``, construction to the first batch, best
  of ``--repeats``. litdata cuts blocks inside each chunk (a chunk's tail shorter than a block
  is dropped), so its block count (``blocks``) can be a little below ``len(flat) // length``.
- ``megatron``: Megatron's ``.idx`` is written next to a link to DOCS.bin (once, kept in DIR),
  one sequence and one document per document. Then, timed: ``IndexedDataset(prefix)``,
  ``GPTDataset`` (``sequence_length = length - 1``, so that a sample is ``length`` tokens as
  Megatron's ``add_extra_token_to_sequence`` makes it; seed 0, one epoch, no attention mask)
  and its first batch (``dataset[0..batch_size-1]``, which follow its shuffle index):
  ``build_first_batch_s`` with an empty index cache (what the first run on a dataset pays: the
  document, sample and shuffle indices built by numpy and its C++ helper, and saved), and
  ``cached_first_batch_s`` with the cache that run left (what a later run, or another rank,
  pays: the three indices loaded). Best of ``--repeats`` each. ``numpy_index_matches``: whether
  ``numpy-index``'s indices (below) equal the ones GPTDataset built.
- ``numpy-index``: Megatron's three indices computed as GPTDataset computes them, in numpy
  alone (its C++ sample-index walk as a cumulative sum and one search): ``index_s``, best of
  ``--repeats``. The stand-in where megatron-core does not install.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SEED = 0
LITDATA_CHUNK_BLOCKS = 1024


def best(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The shortest of ``repeats`` calls of ``run``, and the last call's result."""
    fastest, result = float("inf"), None
    for _ in range(repeats):
        began = time.perf_counter()
        result = run()
        fastest = min(fastest, time.perf_counter() - began)
    return fastest, result


# --------------------------------------------------------------------------- litdata


class _Documents:
    """``optimize``'s ``fn``: a range of documents -> each document's tokens, in order."""

    def __init__(self, flat: np.ndarray, ends: np.ndarray) -> None:
        self.flat, self.ends = flat, ends

    def __call__(self, span: tuple[int, int]) -> Any:
        for d in range(*span):
            start = int(self.ends[d - 1]) if d else 0
            yield self.flat[start : int(self.ends[d])]


def litdata_tokens(args: argparse.Namespace) -> dict[str, Any]:
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    flat, ends = np.load(args.flat), np.load(args.ends)
    out = os.path.join(args.workdir, "litdata")
    spans = np.linspace(0, len(ends), 65).astype(int)
    began = time.perf_counter()
    litdata.optimize(
        fn=_Documents(flat, ends),
        inputs=list(zip(spans[:-1].tolist(), spans[1:].tolist())),
        output_dir=out,
        chunk_size=args.length * LITDATA_CHUNK_BLOCKS,
        item_loader=TokensLoader(),
        num_workers=1,
        verbose=False,
    )
    build_s = time.perf_counter() - began

    def loader() -> Any:
        dataset = litdata.StreamingDataset(
            out, item_loader=TokensLoader(block_size=args.length), shuffle=True, seed=SEED
        )
        return litdata.StreamingDataLoader(dataset, batch_size=args.batch_size, num_workers=0)

    def epoch() -> tuple[int, int]:
        blocks = total = 0
        for batch in loader():
            blocks += len(batch)
            total += int(np.asarray(batch).sum(dtype=np.int64))
        return blocks, total

    epoch_s, (blocks, total) = best(epoch, args.repeats)
    # Every block once: litdata's own epoch in storage order sums to the same.
    plain = litdata.StreamingDataset(out, item_loader=TokensLoader(block_size=args.length))
    expected = sum(int(np.asarray(plain[i]).sum(dtype=np.int64)) for i in range(len(plain)))
    if (blocks, total) != (len(plain), expected):
        raise RuntimeError(f"an epoch gave {(blocks, total)}, expected {(len(plain), expected)}")
    first_s, batch = best(lambda: next(iter(loader())), args.repeats)
    return {
        "blocks": blocks,
        "epoch_s": epoch_s,
        "first_batch_s": first_s,
        "build_s": build_s,
        "batch_shape": list(batch.shape),
        "litdata": litdata.__version__,
    }


# --------------------------------------------------------------------------- Megatron


class _Tokenizer:
    """What GPTDataset asks of a tokenizer: its vocabulary size and special tokens."""

    def __init__(self, eod: int) -> None:
        self.vocab_size = 1 << 17
        self.eod = eod
        self.pad = -1
        self.unique_identifiers = {"class": "bench_tokens", "eod": eod}  # for the cache's key


def megatron_index(args: argparse.Namespace) -> dict[str, Any]:
    import megatron.core
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, _IndexWriter
    from megatron.core.datasets.utils import Split

    lengths = np.load(args.lengths).astype(np.int32)
    prefix = os.path.join(args.workdir, "docs")
    if not os.path.exists(prefix + ".idx"):  # the .bin exists: its index is all to write
        os.makedirs(args.workdir, exist_ok=True)
        if not os.path.lexists(prefix + ".bin"):
            os.symlink(os.path.abspath(args.bin), prefix + ".bin")
        with _IndexWriter(prefix + ".idx.tmp", np.int32) as writer:
            writer.write(lengths, None, np.arange(len(lengths) + 1, dtype=np.int64))
        os.replace(prefix + ".idx.tmp", prefix + ".idx")
    caches: list[str] = []
    built: list[Any] = []

    def first_batch(cache: str) -> list[Any]:
        config = GPTDatasetConfig(
            random_seed=SEED,
            sequence_length=args.length - 1,
            blend=([prefix], None),
            split="100,0,0",
            path_to_cache=cache,
            tokenizer=_Tokenizer(args.eos),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
        )
        indexed = IndexedDataset(prefix)
        indices = np.arange(len(indexed.sequence_lengths), dtype=np.int32)
        dataset = GPTDataset(indexed, prefix, indices, None, Split.train, config)
        built[:] = [dataset]
        return [dataset[i]["tokens"] for i in range(args.batch_size)]

    def fresh() -> list[Any]:
        caches.append(os.path.join(args.workdir, f"cache-{os.getpid()}-{len(caches)}"))
        return first_batch(caches[-1])

    build_s, batch = best(fresh, args.repeats)
    cached_s, _ = best(lambda: first_batch(caches[-1]), args.repeats)
    ours = numpy_indices(lengths, args.length - 1)
    theirs = (built[0].document_index, built[0].sample_index, built[0].shuffle_index)
    matches = all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    for cache in caches:
        for name in os.listdir(cache):
            os.remove(os.path.join(cache, name))
        os.rmdir(cache)
    return {
        "build_first_batch_s": build_s,
        "cached_first_batch_s": cached_s,
        "sample_tokens": len(batch[0]) + 1,  # tokens and labels overlap by one
        "documents": len(lengths),
        "numpy_index_matches": matches,
        "megatron_core": megatron.core.__version__,
    }


def numpy_indices(
    lengths: np.ndarray, sequence_length: int, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron's document, sample and shuffle indices for one epoch, as GPTDataset builds them
    (``add_extra_token_to_sequence``, the last partial sample dropped)."""
    state = np.random.RandomState(seed)
    document_index = np.arange(len(lengths), dtype=np.int32)
    state.shuffle(document_index)
    ends = np.cumsum(lengths[document_index], dtype=np.int64)
    samples = (int(ends[-1]) - 1) // sequence_length
    starts = np.arange(samples + 1, dtype=np.int64) * sequence_length
    # The sample starting at token t starts in the first document whose end is past t.
    doc = np.searchsorted(ends, starts, side="right")
    doc = np.minimum(doc, len(ends) - 1)
    offset = starts - np.concatenate([[0], ends[:-1]])[doc]
    sample_index = np.stack([doc, offset], axis=1).astype(np.int32)
    shuffle_index = np.arange(samples, dtype=np.uint32)
    state.shuffle(shuffle_index)
    return document_index, sample_index, shuffle_index


def numpy_index(args: argparse.Namespace) -> dict[str, Any]:
    lengths = np.load(args.lengths).astype(np.int32)
    index_s, (_, samples, _) = best(lambda: numpy_indices(lengths, args.length - 1), args.repeats)
    return {"index_s": index_s, "samples": len(samples) - 1, "documents": len(lengths)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("peer", choices=["litdata", "megatron", "numpy-index"])
    parser.add_argument("--flat", help="litdata: the tokens end to end (.npy)")
    parser.add_argument("--ends", help="litdata: each document's end in --flat (.npy)")
    parser.add_argument("--bin", help="megatron: the tokens end to end, raw int32")
    parser.add_argument("--lengths", help="megatron, numpy-index: each document's length (.npy)")
    parser.add_argument("--workdir", help="a folder for the peer's files")
    parser.add_argument("--length", type=int, default=2049, help="tokens a block (default 2049)")
    parser.add_argument("--eos", type=int, default=50256, help="megatron: the eod token")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    args = parser.parse_args()
    run = {"litdata": litdata_tokens, "megatron": megatron_index, "numpy-index": numpy_index}
    print(json.dumps(run[args.peer](args)))


if __name__ == "__main__":
    main()
