"""Pretraining data for a language model: two tokenized sources as token blocks, mixed 3:1, a
stage that changes the mix, two ranks, a checkpoint in the middle of an epoch, an exact resume.

A small corpus of "web" pages and "code" files is tokenized while it is cached (a toy
tokenizer: the text's UTF-8 bytes are the ids 0-255, and 256 ends a document; any tokenizer
works the same way, as the field is just the ids). ``ydl.token_blocks`` lays each source's
documents end to end, 256 after each, and cuts blocks of 129 tokens (a context of 128 plus
the label of its last token). ``ydl.mix`` reads web and code 3:1 in epochs 0 and 1 and 1:1 from
epoch 2 on. Two ranks each stream their half of every shuffled epoch; after 4 steps of epoch 2
each saves its stream's state as JSON and the job stops; a new job loads the states and goes
on. The steps it takes are exactly those of a run that was never stopped.

Each step builds the attention mask that keeps every token inside its own document (from
``segment``) and checks, on a small attention in numpy, that attending over the packed block
with it equals attending over each document alone. At the end, ``lineage`` and
``documents`` name the documents a step was cut from.

Run: python examples/pretrain_tokens.py [STORAGE_DIR]
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

import yogadl_plus as ydl

EOS = 256  # ids 0-255 are the UTF-8 bytes
LENGTH = 129  # a context of 128, plus the label of its last token
WEIGHTS = {"web": 3, "code": 1}
STAGE = {2: {"web": 1, "code": 1}}  # from epoch 2 on: as much code as web
EPOCH_SIZE = 160  # blocks a mixture epoch
RANKS, BATCH, SEED = 2, 8, 7
EPOCHS, STOP_AT = 3, (2, 4)  # run 3 epochs; the job stops after 4 steps of epoch 2


def tokenize(text: str) -> np.ndarray:
    """The toy tokenizer: one id per UTF-8 byte (a real one: ``tokenizer.encode(text)``)."""
    return np.frombuffer(text.encode(), np.uint8).astype(np.int32)


def web_pages(n: int) -> Iterator[dict[str, Any]]:
    rng = np.random.default_rng(0)
    words = ["the", "a", "model", "data", "token", "block", "train", "loss", "step", "cache"]
    for i in range(n):
        text = f"page {i}: " + " ".join(rng.choice(words, rng.integers(2, 40)))
        yield {"text": text, "tokens": tokenize(text)}


def code_files(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        text = f"def f{i}(x):\n    return x * {i} + {i % 7}\n"
        yield {"text": text, "tokens": tokenize(text)}


def attention_mask(segment: np.ndarray) -> np.ndarray:
    """(L, L) bools, True where token j may attend to token k: causal, and the same document.

    As torch's ``scaled_dot_product_attention(attn_mask=...)`` takes it (True attends)."""
    causal = np.tril(np.ones((len(segment), len(segment)), bool))
    return causal & (segment[:, None] == segment[None, :])


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    scores = np.where(mask, q @ k.T / np.sqrt(q.shape[1]), -np.inf)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)) @ v


def check_mask(segment: np.ndarray, rng: np.random.Generator) -> None:
    """Attention over the packed block with the mask equals attention over each document
    of the block alone (what FlashAttention's varlen kernels compute from cu_seqlens)."""
    q, k, v = rng.standard_normal((3, len(segment), 4))
    packed = attend(q, k, v, attention_mask(segment))
    for s in np.unique(segment):
        rows = segment == s
        causal = np.tril(np.ones((rows.sum(), rows.sum()), bool))
        alone = attend(q[rows], k[rows], v[rows], causal)
        assert np.allclose(packed[rows], alone), "the mask lets a document see another"


def train_step(batch: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """What a model's step takes from a batch: inputs, labels, positions, masks."""
    tokens, segment = batch["tokens"], batch["segment"]
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    assert inputs.shape == labels.shape == (BATCH, LENGTH - 1)
    positions = batch["position"][:, :-1]  # each token's index in its own document
    loss_mask = segment[:, 1:] == segment[:, :-1]  # no label across a document boundary
    assert positions.shape == loss_mask.shape == inputs.shape
    check_mask(segment[0], rng)


def rank_stream(mix: ydl.Mixture, rank: int) -> ydl.Stream:
    """Rank ``rank``'s stream: every rank makes it the same way, but for ``shard_rank``."""
    return mix.stream(
        shuffle=True, shuffle_seed=SEED, num_shards=RANKS, shard_rank=rank, batch_size=BATCH
    )


def run(
    mix: ydl.Mixture, states: list[dict[str, Any]] | None, stop: tuple[int, int] | None
) -> tuple[list[list[np.ndarray]], list[dict[str, Any]]]:
    """Every rank's batches (tokens) from the start or from ``states`` to the end of epoch
    EPOCHS - 1, or to ``stop`` (epoch, steps), and each rank's state where it stopped."""
    streams = [rank_stream(mix, rank) for rank in range(RANKS)]
    if states is not None:
        for stream, state in zip(streams, states):
            stream.load_state(state)
    epoch = streams[0].next_epoch_position[0]  # where the first iter() starts
    rng = np.random.default_rng(0)
    seen: list[list[np.ndarray]] = [[] for _ in range(RANKS)]
    while epoch < EPOCHS:
        # The ranks step together, as data-parallel ranks do.
        for step, batches in enumerate(zip(*streams), start=1):
            for rank, batch in enumerate(batches):
                train_step(batch, rng)
                seen[rank].append(batch["tokens"])
            if (epoch, step) == stop:
                return seen, [stream.state().to_dict() for stream in streams]
        epoch += 1
    return seen, [stream.state().to_dict() for stream in streams]


def main(root: str) -> None:
    storage = ydl.LocalStorage(os.path.join(root, "caches"))
    refs = {
        "web": ydl.cache_dataset(web_pages(300), "lm-web", "v1", storage, progress=False),
        "code": ydl.cache_dataset(code_files(200), "lm-code", "v1", storage, progress=False),
    }
    sources = {
        name: ydl.token_blocks(ref, "tokens", length=LENGTH, eos=EOS, segments=True)
        for name, ref in refs.items()
    }
    for name, blocks in sources.items():
        print(f"{name}: {len(refs[name])} documents -> {len(blocks)} blocks of {LENGTH} tokens")
    mix = ydl.mix(sources, weights=WEIGHTS, epoch_size=EPOCH_SIZE, schedule=STAGE)
    for epoch in range(EPOCHS):
        print(f"  epoch {epoch}: web {mix.counts_at(epoch)[0]}, code {mix.counts_at(epoch)[1]}")

    reference, _ = run(mix, None, None)  # a run never stopped, for comparison

    before, states = run(mix, None, STOP_AT)
    state_file = os.path.join(root, "data_states.json")
    with open(state_file, "w") as f:
        json.dump(states, f)  # what a checkpoint saves beside the model, one state per rank
    print(f"stopped after {len(before[0])} steps; the ranks' states saved to {state_file}")

    with open(state_file) as f:
        after, _ = run(mix, json.load(f), None)  # a new job
    for rank in range(RANKS):
        resumed = before[rank] + after[rank]
        assert len(resumed) == len(reference[rank])
        assert all(np.array_equal(a, b) for a, b in zip(resumed, reference[rank])), rank
    print(f"resumed: the {len(after[0])} steps after the states are exactly the uninterrupted ones")

    # Exact shares in every epoch, before and after the stage (both ranks together).
    whole = mix.stream(shuffle=True, shuffle_seed=SEED)
    for epoch in range(EPOCHS):
        items = whole.lineage(EPOCH_SIZE, start_offset=epoch * EPOCH_SIZE)
        counts = collections.Counter(name for item in items for name, _ in item)
        assert [counts["web"], counts["code"]] == mix.counts_at(epoch), (epoch, counts)

    # Which documents made the first step after the checkpoint, on rank 0.
    rank0 = rank_stream(mix, 0)
    rank0.load_state(states[0])
    (step,) = rank0.lineage(1)
    name, block = step[0]
    print(f"rank 0's next step begins with {name} block {block}, cut from:")
    for document, first, stop in sources[name].documents(block):
        record = refs[name][int(document)]
        size = len(record["tokens"]) + 1  # its tokens and EOS
        print(f"  document {document}, tokens {first}:{stop} of {size}: {record['text'][:40]!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
