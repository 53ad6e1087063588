"""ydl.keras.BackupAndRestore, tried the way it fails: a real model.fit in a subprocess,
SIGKILLed at chosen points, run again until it finishes, then every epoch counted.

Each run is a process of its own, forked from one that imported TensorFlow and Keras once for
the module (helpers/forks.py): the seconds of that import, not the run, are what is shared.

The model keeps, in its own weights, how many records it trained on and the sum of their ids;
so each restart says exactly which steps the restored backup holds, and the steps a killed run
trained after its last backup (lost with it) are told apart from the ones that count.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from helpers.forks import Forks, read_log
from jobs import keras_resume_job as job

import yogadl_plus as ydl

RUN_JOB = f"import runpy; runpy.run_path({job.__file__!r}, run_name='__main__')"

pytestmark = [
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="module")
def jobs() -> Iterator[Forks]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    forks = Forks("tensorflow", "keras", "yogadl_plus", env=env)
    yield forks
    forks.close()


def run_job(jobs: Forks, root: str, face: str, save_freq: str, predicate: bool, kill: str) -> int:
    args = [root, face, save_freq, "1" if predicate else "0", kill]
    log = Path(root, "job.log")
    returncode = jobs.run(RUN_JOB, *args, cwd=Path(root), log=log)
    if kill == "none" and returncode:
        raise AssertionError(f"the job failed:\n{read_log(log)}")
    return returncode


def expected_ids(root: str, predicate: bool) -> list[int]:
    ref = ydl.LocalStorage(os.path.join(root, "store")).fetch("job", "v1")
    stream = job.stream_of(ref, predicate)
    return [int(i) for _ in range(job.EPOCHS) for batch in stream for i in batch["id"]]


def trained_ids(root: str) -> list[int]:
    """What the final model trained on, in order: of each killed run, the records its
    successor restored; of the last run, all."""
    runs: list[dict] = []
    with open(os.path.join(root, "trained.log")) as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if head == "R":
                runs.append({"restored": tuple(map(int, rest.split())), "ids": []})
            elif head == "F":
                runs[-1]["final"] = tuple(map(int, rest.split()))
            else:
                runs[-1]["ids"].extend(int(i) for i in line.split())
    assert "final" in runs[-1], "the last run did not finish"
    kept: list[int] = []
    for run, after in zip(runs, [*runs[1:], None]):
        count, total = run["restored"]
        assert (count, total) == (len(kept), sum(kept)), "restored weights != what was kept"
        end = run["final"] if after is None else after["restored"]
        ids = run["ids"][: end[0] - count]
        assert sum(ids) == end[1] - total, "the backup's weights do not match its steps"
        kept += ids
    return kept


def fit_until_done(
    jobs, tmp_path, face: str, save_freq: str, kills: list[str], predicate=False
) -> None:
    root = str(tmp_path)
    for kill in kills:
        assert run_job(jobs, root, face, save_freq, predicate, kill) == -9, f"{kill} did not kill"
    run_job(jobs, root, face, save_freq, predicate, "none")
    got, want = trained_ids(root), expected_ids(root, predicate)
    per_epoch = len(want) // job.EPOCHS
    for epoch in range(job.EPOCHS):
        part = got[epoch * per_epoch : (epoch + 1) * per_epoch]
        assert sorted(part) == sorted(want[epoch * per_epoch : (epoch + 1) * per_epoch]), (
            f"epoch {epoch}: {len(set(part))} distinct of {per_epoch}"
        )
    assert got == want  # every record of every epoch once, in the stream's order


# 500 records in batches of 32: 16 steps per epoch. With save_freq=10, the backups are at
# steps 10 (epoch 0), 20, 30 (epoch 1), 40 (epoch 2)...: killed at step 18 (epoch 1's second)
# the restore lands back in epoch 0.
@pytest.mark.parametrize("face", ["tf", "seq"])
def test_killed_early_in_an_epoch_and_after_a_backup_every_epoch_is_exact(jobs, tmp_path, face):
    fit_until_done(jobs, tmp_path, face, "10", ["step:18", "backup:1", "step:5"])


# The face reads the stream at the positions a backup restores, so both faces are killed mid-epoch
# above and restored at an epoch's start below (a backup on an epoch's last step). How a backup
# is switched in and which one a restart finds, after a kill around a rename or with
# save_freq="epoch", is the callback's alone, the same with either face: one face is enough. (The
# restores here land where the test above and the last one restore both faces: at step 10 of
# epoch 0, step 4 of epoch 1, the start of epoch 1.)
def test_killed_around_each_rename_of_a_backup_every_epoch_is_exact(jobs, tmp_path):
    # Before the weights' rename, between the two renames, right after the metadata's.
    kills = ["before-replace:1", "after-replace:1", "after-replace:2"]
    fit_until_done(jobs, tmp_path, "tf", "10", kills)


def test_epoch_backups_redo_the_interrupted_epoch_whole(jobs, tmp_path):
    fit_until_done(jobs, tmp_path, "tf", "epoch", ["step:20", "step:3"])


def test_a_predicate_stream_resumes_exactly(jobs, tmp_path):
    fit_until_done(jobs, tmp_path, "tf", "7", ["step:13", "backup:2"], predicate=True)


def test_uninterrupted_fit_trains_whole_epochs(jobs, tmp_path):
    fit_until_done(jobs, tmp_path, "seq", "epoch", [])


# save_freq=8: the second backup is at step 16, the last of epoch 0. Restored from it, Keras
# must start epoch 1 (the backup is saved as that epoch's start), not redo epoch 0 on a stream
# that already stands at epoch 1.
@pytest.mark.parametrize("face, kill", [("tf", "backup:2"), ("seq", "step:20")])
def test_a_backup_on_an_epochs_last_step_resumes_at_the_next_epoch(jobs, tmp_path, face, kill):
    fit_until_done(jobs, tmp_path, face, "8", [kill])
