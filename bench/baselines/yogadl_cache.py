"""What both yogadl 0.1.4 baselines do first, in the yogadl side venv: the arrays, and yogadl's
own cacheable build of them (LFSStorage over tf.data.Dataset.from_tensor_slices)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def yogadl_cache(
    x_path: str, label_path: str, workdir: str, dataset_id: str
) -> tuple[Any, Callable[[], Any], Any, Any]:
    """(LFS storage, the cacheable build returning yogadl's DataRef, x, label)."""
    import numpy as np
    import tensorflow as tf
    from yogadl import storage as ystorage

    x = np.load(x_path)
    label = np.load(label_path)
    os.makedirs(workdir, exist_ok=True)
    lfs = ystorage.LFSStorage(ystorage.LFSConfigurations(storage_dir_path=workdir))

    @lfs.cacheable(dataset_id, "v1")
    def make() -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices({"x": x, "label": label})

    return lfs, make, x, label
