"""PyTorch map-style Datasets as sources: item -> record conversion, dtypes, ordered workers."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import yogadl_plus as ydl  # noqa: E402
from yogadl_plus.sources import as_source  # noqa: E402
from yogadl_plus.sources.torch import TorchDatasetSource, item_to_record  # noqa: E402


class Items(torch.utils.data.Dataset):
    """Item i is ``make(i)``; module-level so that worker processes can unpickle it."""

    def __init__(self, n: int, make) -> None:
        self.n = n
        self.make = make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.make(i)


def dict_item(i):
    return {
        "x": torch.full((3,), float(i)),
        "half": torch.full((2, 2), i, dtype=torch.float16),
        "small": torch.tensor([i % 100, -1], dtype=torch.int8),
        "flag": torch.tensor(i % 2 == 0),
        "label": torch.tensor(i),
        "name": f"item-{i}",
        "raw": bytes([i % 256]),
        "weight": 0.5 * i,
    }


def tuple_item(i):
    return torch.arange(i % 4 + 1, dtype=torch.int32), i % 3


def tensor_item(i):
    return torch.eye(2, dtype=torch.float64) * i


def nested_item(i):
    return {"image": {"pixels": torch.ones(2, 2, dtype=torch.uint8) * i, "name": f"p{i}"}, "y": i}


def slow_item(i):
    time.sleep(random.random() * 0.003)
    return {"i": torch.tensor(i), "v": torch.rand(4, generator=torch.Generator().manual_seed(i))}


def records_of(source):
    return list(source.records())


def test_dict_items_keep_names_and_dtypes():
    records = records_of(TorchDatasetSource(Items(5, dict_item)))
    assert len(records) == 5
    r = records[3]
    assert sorted(r) == ["flag", "half", "label", "name", "raw", "small", "weight", "x"]
    assert isinstance(r["x"], np.ndarray) and r["x"].dtype == np.float32
    assert r["half"].dtype == np.float16 and r["half"].shape == (2, 2) and r["half"][0, 0] == 3
    assert r["small"].dtype == np.int8 and r["small"].tolist() == [3, -1]
    # 0-d tensors become numpy scalars of the same dtype.
    assert isinstance(r["flag"], np.bool_) and not r["flag"]
    assert isinstance(r["label"], np.int64) and r["label"] == 3
    assert r["name"] == "item-3" and r["raw"] == b"\x03" and r["weight"] == 1.5


def test_tuple_single_tensor_and_nested_items():
    first, second = records_of(TorchDatasetSource(Items(3, tuple_item)))[2].items()
    assert first[0] == "0" and first[1].dtype == np.int32 and first[1].tolist() == [0, 1, 2]
    assert second == ("1", 2)
    value = records_of(TorchDatasetSource(Items(3, tensor_item)))[2]
    assert list(value) == ["value"] and value["value"].dtype == np.float64
    assert np.array_equal(value["value"], np.eye(2) * 2)
    nested = records_of(TorchDatasetSource(Items(3, nested_item)))[1]
    assert sorted(nested) == ["image/name", "image/pixels", "y"]
    assert nested["image/pixels"].dtype == np.uint8 and nested["image/name"] == "p1"


def test_item_to_record_edge_cases():
    assert item_to_record(torch.tensor(2.5)) == {"value": np.float32(2.5)}
    assert isinstance(item_to_record(torch.tensor(2.5))["value"], np.float32)
    assert item_to_record("text") == {"value": "text"}
    record = item_to_record(({"a": torch.tensor([1])}, [torch.tensor(1), torch.tensor(2)]))
    assert sorted(record) == ["0/a", "1"] and np.asarray(record["1"]).tolist() == [1, 2]
    grad = item_to_record({"w": torch.ones(2, requires_grad=True)})
    assert grad["w"].dtype == np.float32
    from PIL import Image

    pixels = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    image, label = item_to_record((Image.fromarray(pixels), 7)).values()  # torchvision style
    assert np.array_equal(image, pixels) and label == 7
    with pytest.raises(ydl.SchemaError, match="bfloat16"):
        item_to_record({"b": torch.ones(2, dtype=torch.bfloat16)})


def test_workers_keep_the_order():
    dataset = Items(150, slow_item)
    inline = records_of(TorchDatasetSource(dataset, num_workers=0, batch_size=7))
    parallel = records_of(TorchDatasetSource(dataset, num_workers=2, batch_size=7))
    assert [int(r["i"]) for r in parallel] == list(range(150))
    for a, b in zip(inline, parallel, strict=True):
        assert a["i"] == b["i"] and np.array_equal(a["v"], b["v"])


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="num_workers"):
        TorchDatasetSource(Items(1, tensor_item), num_workers=-1)
    with pytest.raises(ValueError, match="batch_size"):
        TorchDatasetSource(Items(1, tensor_item), batch_size=0)
    with pytest.raises(ValueError, match="shuffle"):
        TorchDatasetSource(Items(1, tensor_item), shuffle=True)


def test_source_facts():
    source = as_source(Items(12, tensor_item))
    assert isinstance(source, TorchDatasetSource)
    assert source.kind == "torch" and source.length == 12
    assert source.schema is None and source.fingerprint() is None


def test_cache_dataset_reads_a_torch_dataset(local_storage):
    ref = ydl.cache_dataset(Items(40, dict_item), "torch-dict", "v1", local_storage, progress=False)
    assert len(ref) == 40 and ref.manifest.source_kind == "torch"
    schema = ref.schema
    assert schema["half"].dtype == np.float16 and schema["half"].shape == (2, 2)
    assert schema["small"].dtype == np.int8 and schema["flag"].dtype == np.bool_
    assert schema["name"].kind == "str" and schema["raw"].kind == "bytes"
    r = ref[17]
    assert r["label"] == 17 and r["name"] == "item-17" and r["half"][1, 1] == 17
    assert bool(r["flag"]) is False and r["small"].tolist() == [17, -1]
    tuples = ydl.cache_dataset(
        TorchDatasetSource(Items(30, tuple_item), num_workers=2, batch_size=4),
        "torch-tuple",
        "v1",
        local_storage,
        progress=False,
    )
    assert tuples.schema["0"].shape == (None,) and tuples[29]["0"].tolist() == [0, 1]
    assert [int(tuples[i]["1"]) for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_cacheable_function_returning_a_torch_dataset_runs_once(local_storage):
    calls = []

    @local_storage.cacheable("torch-cacheable", "v1")
    def make():
        calls.append(1)
        return Items(25, nested_item)

    ref = make()
    again = make()
    assert len(calls) == 1
    assert len(ref) == len(again) == 25
    assert again[24]["image/pixels"].tolist() == [[24, 24], [24, 24]]
    assert ref.manifest.source_kind == "torch"


def test_iterable_dataset_is_read_in_process():
    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter((torch.tensor(i), str(i)) for i in range(4))

    records = records_of(TorchDatasetSource(Numbers()))
    assert [(int(r["0"]), r["1"]) for r in records] == [(i, str(i)) for i in range(4)]
    with pytest.raises(ValueError, match="IterableDataset"):
        TorchDatasetSource(Numbers(), num_workers=2)
