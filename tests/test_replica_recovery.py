"""A rank restarted alone computes where to resume from (epoch, items trained, rank, world) and
nothing of its peers, with or without a predicate: what torchft-style replica recovery asks of a
data loader. Ranks are processes; one is killed mid-epoch and restarted on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import yogadl_plus as ydl

pytestmark = pytest.mark.crash

N = 600
WORLD = 3
STEPS_BEFORE_CRASH = 5

RANK = """
import json, os, sys
import yogadl_plus as ydl
root, rank, world, mode, trained, out = sys.argv[1:7]
rank, world, trained = int(rank), int(world), int(trained)
ref = ydl.LocalStorage(root).fetch("d", "v")
args = dict(shuffle=True, shuffle_seed=5, num_shards=world, shard_rank=rank, batch_size=8)
if mode == "predicate":
    args["predicate"] = ydl.predicates.in_lambda("i", lambda i: i % 3 != 0)
stream = ref.stream(**args)
if trained:  # restarted alone: where to resume, from (epoch 0, items trained) only
    stream = ref.stream(**args, start_offset=stream.offset_after(0, trained))
seen = []
for step, batch in enumerate(stream):  # epoch 0
    seen += batch["i"].tolist()
    if out.endswith(".crash") and step + 1 == int(os.environ["STEPS"]):
        break  # the process is killed after this step
with open(out, "w") as f:
    json.dump(seen, f)
if out.endswith(".crash"):
    os._exit(9)  # killed: nothing saved but what was trained
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("replicas")
    ydl.cache_dataset({"i": np.arange(N)}, "d", "v", ydl.LocalStorage(folder), progress=False)
    return folder


def rank(root: Path, number: int, mode: str, trained: int, out: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", RANK, *map(str, (root, number, WORLD, mode, trained, out))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "STEPS": str(STEPS_BEFORE_CRASH)},
    )
    assert done.returncode in (0, 9), done.stderr[-2000:]
    return done.returncode


@pytest.mark.parametrize("mode", ["plain", "predicate"])
def test_a_rank_restarted_alone_resumes_exactly(root: Path, tmp_path: Path, mode: str) -> None:
    seen: list[int] = []
    for number in (0, 2):
        rank(root, number, mode, 0, tmp_path / f"rank{number}.json")
        seen += json.loads((tmp_path / f"rank{number}.json").read_text())
    # Rank 1 trains 5 steps, then its process dies.
    assert rank(root, 1, mode, 0, tmp_path / "rank1.crash") == 9
    before = json.loads((tmp_path / "rank1.crash").read_text())
    assert len(before) == STEPS_BEFORE_CRASH * 8
    # Restarted on its own, it knows only: epoch 0, 5 steps trained, rank 1 of 3.
    rank(root, 1, mode, STEPS_BEFORE_CRASH, tmp_path / "rank1.json")
    after = json.loads((tmp_path / "rank1.json").read_text())
    every = sorted(seen + before + after)
    expected = [i for i in range(N) if mode == "plain" or i % 3 != 0]
    assert every == expected  # each record of the epoch once: none lost, none twice
