"""DDP with the torch face's defaults: a real 3-process gloo job (jobs/ddp_job.py) never hangs.

Three ranks over 50 records get 17 / 17 / 16 positions, so 5 / 5 / 4 batches of 4: a DDP job
whose ranks take different numbers of steps waits for ever in the last all-reduce of the rank
that has one more. The face refuses such a stream inside an initialized process group, and
``drop_shard_remainder`` / ``pad_shard_remainder`` even the shards out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.servers import free_ports

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "ddp_job.py"
WORLD = 3
RECORDS, BATCH = 50, 4
# Past the job's collective timeout (ddp_job.COLLECTIVE_TIMEOUT): a rank still running then is
# stuck.
JOB_TIMEOUT = 90


def run_job(root: Path, face: str, mode: str) -> list[str | None]:
    """Each rank's stdout (None: still running after JOB_TIMEOUT, then killed), rank 0 first."""
    (port,) = free_ports(1)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(root), str(rank), str(WORLD), str(port), face, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs: list[str | None] = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            outputs.append(None)
            continue
        outputs.append(out if process.returncode == 0 else f"exit {process.returncode}: {err}")
    return outputs


@pytest.mark.parametrize("face", ["loader", "sampler"])
def test_uneven_shards_are_refused_by_default_on_every_rank(face, tmp_path):
    outputs = run_job(tmp_path, face, "default")
    for out in outputs:
        assert out is not None and out.startswith("refused: "), out
        assert "5 / 5 / 4 items" in out or "17 / 17 / 16 items" in out, out
        for choice in ("drop_shard_remainder=True", "pad_shard_remainder=True"):
            assert choice in out
        assert "allow_uneven_shards=True" in out


@pytest.mark.parametrize("face", ["loader", "sampler"])
@pytest.mark.parametrize("mode, steps", [("drop", 4), ("pad", 5)])
def test_even_shards_train_every_rank_to_the_end(face, mode, steps, tmp_path):
    outputs = run_job(tmp_path, face, mode)
    seen = []
    for out in outputs:
        assert out is not None and out.startswith("trained "), out
        words = out.split()
        assert int(words[1]) == steps
        seen += [int(w) for w in words[2:]]
    if mode == "drop":  # 48 distinct records, the last 2 positions left out
        assert len(seen) == len(set(seen)) == RECORDS - RECORDS % WORLD
    else:  # every record, and the order's first position once more (on rank 2)
        assert set(seen) == set(range(RECORDS)) and len(seen) == RECORDS + 1


def test_without_the_check_the_job_hangs(tmp_path):
    # What the refusal prevents: with allow_uneven_shards=True, the rank with 4 steps waits at
    # its final barrier while the others wait in their 5th step's all-reduce, until the
    # collective timeout (the job's HANGING_STEP_TIMEOUT, 30 minutes by default): no rank ends.
    # A rank's error is gloo's timeout, or, where a peer timed out and left first, the closed
    # connection to that peer (which of the two each rank meets depends on the machine's load).
    outputs = run_job(tmp_path, "loader", "allow")
    hung = ("Timed out waiting", "Connection closed by peer")
    for out in outputs:
        assert out is None or ("exit " in out and any(h in out for h in hung)), out
    assert not any(out and out.startswith("trained ") for out in outputs), outputs
