"""Train a JAX model through grain.DataLoader on a yogadl_plus cache, stop mid-epoch, resume
from the checkpoint, and check that every record was trained on exactly once per epoch.

A synthetic linear-regression set is cached with ``ydl.cache_dataset``. The job (``train``)
reads it through ``grain.DataLoader`` with two worker processes: the data source is
``ydl.grain.source(ref)``, the sampler ``ydl.grain.sampler(ref, shuffle=True, ...)``, which
gives Grain yogadl_plus's order (the same as ``ref.stream(shuffle=True, shuffle_seed=SEED)``).
Every ``SAVE_EVERY`` steps the job writes a checkpoint: the model's parameters and the
loader's own state (``iterator.get_state()``, a small JSON). The first run stops partway
through the first epoch, as if preempted; the second run is the same job, which finds the
checkpoint, restores the parameters and ``iterator.set_state(...)``, and trains to the end.
Each run logs the ids of the batches it trained on, so the two logs together (cut at the
checkpoint) must hold every record exactly once per epoch.

Run: python examples/grain_jax_train.py [WORK_DIR]
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time

import numpy as np

import yogadl_plus as ydl

try:
    import grain
    import jax
    import jax.numpy as jnp
    from absl import flags
except ModuleNotFoundError as missing:  # say which pip install brings it
    raise SystemExit(ydl.missing_extra(missing, "examples/grain_jax_train.py")) from None

N, FEATURES, BATCH, EPOCHS, SEED = 4096, 8, 64, 2, 7
SAVE_EVERY, STOP_AT = 10, 45  # the first run stops 5 steps after its checkpoint at step 40
STEPS = N // BATCH * EPOCHS


def records():
    """y = x . w + b + noise, with the record's id."""
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=FEATURES).astype(np.float32), np.float32(0.5)
    for i in range(N):
        x = rng.normal(size=FEATURES).astype(np.float32)
        yield {"id": np.int64(i), "x": x, "y": np.float32(x @ w + b + rng.normal(0, 0.1))}


def loss(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


step_fn = jax.jit(jax.value_and_grad(loss))


def make_loader(ref: ydl.DataRef) -> grain.DataLoader:
    return grain.DataLoader(
        data_source=ydl.grain.source(ref, fields=["id", "x", "y"]),
        sampler=ydl.grain.sampler(ref, shuffle=True, shuffle_seed=SEED, num_epochs=EPOCHS),
        operations=[grain.transforms.Batch(BATCH)],
        worker_count=2,
    )


def train(ref: ydl.DataRef, work: str, stop_at: int | None = None) -> tuple[int, float]:
    """The job: resume from ``work``'s checkpoint if there is one, train, log batch ids."""
    checkpoint = os.path.join(work, "checkpoint.json")
    iterator = iter(make_loader(ref))
    params = {"w": jnp.zeros(FEATURES), "b": jnp.float32(0.0)}
    step, value, batch = 0, float("nan"), None
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            saved = json.load(f)
        step = saved["step"]
        params = {"w": jnp.array(saved["w"]), "b": jnp.float32(saved["b"])}
        iterator.set_state(saved["loader"].encode())
    with open(os.path.join(work, "ids.log"), "a") as log:
        for batch in iterator:
            value, grads = step_fn(params, batch["x"], batch["y"])
            params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
            step += 1
            log.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            if step % SAVE_EVERY == 0:
                saved = {
                    "step": step,
                    "w": params["w"].tolist(),
                    "b": float(params["b"]),
                    "loader": iterator.get_state().decode(),
                }
                with open(checkpoint + ".tmp", "w") as f:
                    json.dump(saved, f)
                os.replace(checkpoint + ".tmp", checkpoint)
            if step == stop_at:
                break
    # Grain 0.2.18 frees its workers' last shared-memory batches only when its iterator is
    # collected, on a thread of its own: without this, Python warns of "leaked shared_memory
    # objects" at exit (google/grain#1031).
    del iterator, batch
    gc.collect()
    time.sleep(0.2)
    return step, float(value)


def main(work: str) -> None:
    # Grain 0.2.18 with JAX installed reads an absl flag when it starts worker processes, and
    # raises UnparsedFlagAccessError in scripts that absl.app did not start.
    flags.FLAGS.mark_as_parsed()
    ref = ydl.cache_dataset(records(), "regression", "v1", ydl.LocalStorage(work), progress=False)
    print(f"cached {len(ref)} records; {STEPS} steps of {BATCH} over {EPOCHS} epochs")

    start = time.perf_counter()
    step, value = train(ref, work, stop_at=STOP_AT)
    print(f"first run stopped at step {step} (loss {value:.4f}); last checkpoint at step 40")
    step, value = train(ref, work)
    print(f"second run resumed at step 40 and finished at step {step}: loss {value:.4f}")

    # What was trained on: the first run's steps up to its checkpoint, then the second run's.
    with open(os.path.join(work, "ids.log")) as f:
        logged = [json.loads(line) for line in f]
    first_run = logged[:STOP_AT]
    trained = [e for e in first_run if e["step"] <= 40] + logged[STOP_AT:]
    assert [e["step"] for e in trained] == list(range(1, STEPS + 1)), "one batch per step"
    ids = np.concatenate([e["ids"] for e in trained])
    epochs = [sorted(ids[e * N : (e + 1) * N]) for e in range(EPOCHS)]
    once = all(np.array_equal(seen, np.arange(N)) for seen in epochs)
    print(f"every record trained on exactly once per epoch: {once}")
    print(f"({time.perf_counter() - start:.1f}s through grain.DataLoader with 2 worker processes)")
    assert once and value < 0.05, value


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
