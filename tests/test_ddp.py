"""DDP with the torch face's defaults: a real 3-process gloo job (jobs/ddp_job.py) never hangs.

Three ranks over 50 records get 17 / 17 / 16 positions, so 5 / 5 / 4 batches of 4: a DDP job
whose ranks take different numbers of steps waits for ever in the last all-reduce of the rank
that has one more. The face refuses such a stream inside an initialized process group, and
``drop_shard_remainder`` / ``pad_shard_remainder`` even the shards out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.forks import Forks
from helpers.servers import free_ports

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "ddp_job.py"
RUN_JOB = f"import runpy; runpy.run_path({str(JOB)!r}, run_name='__main__')"
WORLD = 3
RECORDS, BATCH = 50, 4
# Past the job's collective timeout (ddp_job.COLLECTIVE_TIMEOUT): a rank still running then is
# stuck.
JOB_TIMEOUT = 90


@pytest.fixture(scope="module")
def ranks() -> Iterator[list[Forks]]:
    """One job server per rank, each with torch imported (helpers/forks.py): a job's ranks are
    processes forked from them, which run at the same time."""
    servers = [Forks("torch", "torch.distributed", "yogadl_plus") for _ in range(WORLD)]
    yield servers
    for server in servers:
        server.close()


def run_job(ranks: list[Forks], root: Path, face: str, mode: str) -> list[str | None]:
    """Each rank's stdout (None: still running after JOB_TIMEOUT, then killed), rank 0 first."""
    (port,) = free_ports(1)
    for rank, server in enumerate(ranks):
        args = [str(root), str(rank), str(WORLD), str(port), face, mode]
        out, err = root / f"rank{rank}.out", root / f"rank{rank}.err"
        server.start(RUN_JOB, *args, cwd=root, out=out, err=err)
    outputs: list[str | None] = []
    for rank, server in enumerate(ranks):
        returncode = server.wait(JOB_TIMEOUT)
        out, err = (root / f"rank{rank}.{name}" for name in ("out", "err"))
        if returncode is None:
            outputs.append(None)
        else:
            said = out.read_text() if returncode == 0 else f"exit {returncode}: {err.read_text()}"
            outputs.append(said)
    return outputs


@pytest.mark.parametrize("face", ["loader", "sampler"])
def test_uneven_shards_are_refused_by_default_on_every_rank(face, ranks, tmp_path):
    outputs = run_job(ranks, tmp_path, face, "default")
    for out in outputs:
        assert out is not None and out.startswith("refused: "), out
        assert "5 / 5 / 4 items" in out or "17 / 17 / 16 items" in out, out
        for choice in ("drop_shard_remainder=True", "pad_shard_remainder=True"):
            assert choice in out
        assert "allow_uneven_shards=True" in out


@pytest.mark.parametrize("face", ["loader", "sampler"])
@pytest.mark.parametrize("mode, steps", [("drop", 4), ("pad", 5)])
def test_even_shards_train_every_rank_to_the_end(face, mode, steps, ranks, tmp_path):
    outputs = run_job(ranks, tmp_path, face, mode)
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


def test_without_the_check_the_job_hangs(ranks, tmp_path):
    # What the refusal prevents: with allow_uneven_shards=True, the rank with 4 steps waits at
    # its final barrier while the others wait in their 5th step's all-reduce, until the
    # collective timeout (the job's HANGING_STEP_TIMEOUT, 30 minutes by default): no rank ends.
    # A rank's error is gloo's timeout, or, where a peer timed out and left first, the closed
    # connection to that peer (which of the two each rank meets depends on the machine's load).
    outputs = run_job(ranks, tmp_path, "loader", "allow")
    hung = ("Timed out waiting", "Connection closed by peer")
    for out in outputs:
        assert out is None or ("exit " in out and any(h in out for h in hung)), out
    assert not any(out and out.startswith("trained ") for out in outputs), outputs
