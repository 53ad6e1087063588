"""Preprocess files once with a PyTorch Dataset, in parallel; train from the cache ever after.

The usual PyTorch pattern is a Dataset whose ``__getitem__`` opens one input file and turns it
into a feature vector, run again every epoch of every experiment. Here that Dataset is cached
once (``TorchDatasetSource`` runs ``__getitem__`` in 2 worker processes, in order), and training
streams the cache, shuffled, through ``ydl.torch.make_dataloader`` with 2 workers. Asking for
the cache again (another run, another experiment) does not read a single input file.

Run: python examples/torch_preprocess.py [STORAGE_DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

import yogadl_plus as ydl

try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except ModuleNotFoundError as missing:  # say which pip install brings it
    raise SystemExit(ydl.missing_extra(missing, "examples/torch_preprocess.py")) from None

from yogadl_plus.sources.torch import TorchDatasetSource

FILES = 200
SAMPLES = 16_384  # per file
BINS = 64  # features per file
LAGS = 1024  # autocorrelation lags, whose spectrum gives the features


def write_inputs(folder: str) -> list[str]:
    """Stand-in for raw data: text files of a noisy signal whose pitch tells its class."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLES) / SAMPLES
    paths = []
    for i in range(FILES):
        label = i % 2
        pitch = rng.uniform(200, 400) if label else rng.uniform(600, 800)
        signal = np.sin(2 * np.pi * pitch * t) + rng.normal(0, 2.0, SAMPLES)
        path = os.path.join(folder, f"recording-{i:04d}.txt")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(f"label={label}\n" + "\n".join(f"{v:.5f}" for v in signal) + "\n")
        paths.append(path)
    return paths


class Recordings(Dataset):
    """``ds[i]``: file i parsed, the spectrum of its autocorrelation as features, its label."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        with open(self.paths[i]) as f:
            header, body = f.read().split("\n", 1)
        signal = np.array(body.split(), dtype=np.float64)
        signal -= signal.mean()
        # The CPU-heavy part, what an expensive feature extractor costs per item: one pass
        # over the signal per lag (elementwise, so one thread per worker: no BLAS threads).
        energy = float((signal * signal).sum())
        lags = np.array([(signal[:-k] * signal[k:]).sum() for k in range(1, 1 + LAGS)])
        spectrum = np.abs(np.fft.rfft(lags / energy))[: BINS * 8].reshape(BINS, 8).mean(axis=1)
        features = np.log(spectrum / spectrum.mean()).astype(np.float32)
        return {
            "features": torch.from_numpy(features),
            "label": torch.tensor(int(header.removeprefix("label="))),
            "file": os.path.basename(self.paths[i]),
        }


def features(paths: list[str], storage: ydl.Storage) -> ydl.DataRef:
    """The cached features: built by 2 worker processes the first time, then just opened."""
    source = TorchDatasetSource(Recordings(paths), num_workers=2, batch_size=8)
    return ydl.cache_dataset(source, "features", "v1", storage, progress=False)


def train(loader: DataLoader, epochs: int) -> float:
    """A small classifier; returns the accuracy of the last epoch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(BINS, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        correct = total = 0
        for batch in loader:
            logits = model(batch["features"])
            loss = torch.nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == batch["label"]).sum())
            total += len(batch["label"])
    return correct / total


def main(root: str) -> None:
    torch.set_num_threads(1)
    paths = write_inputs(os.path.join(root, "raw"))
    storage = ydl.LocalStorage(os.path.join(root, "caches"))
    had_cache = ("features", "v1") in storage.list()

    start = time.perf_counter()
    ref = features(paths, storage)
    first = time.perf_counter() - start
    if had_cache:
        print(f"run 1: found the cache of an earlier run in {first:.3f} s -> {ref}")
    else:
        print(
            f"run 1: preprocessed {len(paths)} files (2 workers) and cached them in {first:.2f} s"
        )

    start = time.perf_counter()
    again = features(paths, storage)
    second = time.perf_counter() - start
    print(f"run 2: same call, the cache is reused without reading any file: {second:.3f} s")
    assert again.manifest.to_json() == ref.manifest.to_json()
    assert again.schema["features"].shape == (BINS,) and again.schema["file"].kind == "str"

    epochs = 3
    start = time.perf_counter()
    stream = ref.stream(shuffle=True, shuffle_seed=0, batch_size=32)
    accuracy = train(ydl.torch.make_dataloader(stream, num_workers=2), epochs)
    cached = (time.perf_counter() - start) / epochs
    print(
        f"training from the cache, 2 loader workers: {cached:.2f} s/epoch, accuracy {accuracy:.2f}"
    )

    # Without the cache every epoch of every experiment parses and processes every file again.
    start = time.perf_counter()
    plain = DataLoader(Recordings(paths), batch_size=32, shuffle=True, num_workers=2)
    train(plain, 1)
    raw = time.perf_counter() - start
    print(f"training from the raw files, 2 loader workers: {raw:.2f} s/epoch")
    assert accuracy > 0.9, f"accuracy {accuracy:.2f}: the features should separate the classes"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:  # a temporary folder, removed at the end
        with tempfile.TemporaryDirectory(prefix="yogadl_plus_") as folder:
            main(folder)
