"""PyTorch faces over DataRef and Stream: ``ydl.torch``.

- ``RecordDataset``: map-style, ``ds[i]`` is record ``i`` (and ``__getitems__`` fetches a batch
  of indices in one read), picklable into DataLoader workers; ``StreamSampler``: the record
  indices of ``dataref.stream(...)``'s order, for a plain DataLoader over a RecordDataset
  (torch_records.py).
- ``make_dataloader``: a DataLoader over a stream's items (a ``ResumableDataLoader``) whose
  ``state_dict()`` resumes at the next item exactly, with any number of workers
  (torch_loader.py).

What both refuse in a DDP job is in torch_ddp.py.
"""

from __future__ import annotations

from yogadl_plus.adapters.torch_loader import ResumableDataLoader, make_dataloader
from yogadl_plus.adapters.torch_records import RecordDataset, StreamSampler

__all__ = ["RecordDataset", "ResumableDataLoader", "StreamSampler", "make_dataloader"]
