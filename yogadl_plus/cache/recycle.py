"""Big arrays whose memory is used again once their caller lets go of them.

A batch of big records is one big array per field (256 images of 150 KiB: 38 MiB). glibc serves
anything past 32 MiB with a fresh mapping from the kernel, so each such batch would cost a page
fault and the kernel's zeroing for every page before a byte is copied: about half the time of
the copy itself. A recycler keeps the buffers of the last few big arrays it handed out and gives
one again once nothing refers to it any more (CPython's reference count says so exactly: every
view, tensor made with ``torch.from_numpy`` or slice of the array holds a reference to its
buffer). Arrays the caller keeps are never touched; at most ``KEEP_PER_SIZE`` buffers of a size
and ``KEEP_BYTES`` in all are kept, and they go with the recycler (one per open DataRef).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["KEEP_BYTES", "KEEP_PER_SIZE", "RECYCLED_BYTES", "ArrayRecycler"]

#: Arrays at least this big are recycled: smaller ones already reuse memory inside malloc.
RECYCLED_BYTES = 32 << 20
#: Buffers of one size kept for reuse (a consumer holding a few batches at once still reuses).
KEEP_PER_SIZE = 4
#: The most bytes a recycler keeps.
KEEP_BYTES = 1 << 30
# A kept buffer nobody else refers to: the list's reference and getrefcount's argument.
_FREE = 2


class ArrayRecycler:
    """``empty(shape, dtype)``: np.empty's contract, reusing the memory of big arrays dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[int, list[np.ndarray]] = {}
        self._bytes = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialized array (its old contents, for a reused buffer)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < RECYCLED_BYTES or nbytes > KEEP_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            kept = self._kept.setdefault(nbytes, [])
            for i in range(len(kept)):
                if sys.getrefcount(kept[i]) == _FREE:
                    return kept[i].view(dtype).reshape(shape)
            buffer = np.empty(nbytes, np.uint8)
            if len(kept) < KEEP_PER_SIZE and self._bytes + nbytes <= KEEP_BYTES:
                kept.append(buffer)
                self._bytes += nbytes
            return buffer.view(dtype).reshape(shape)

    def clear(self) -> None:
        """Forget every kept buffer (arrays still in use keep theirs alive)."""
        with self._lock:
            self._kept = {}
            self._bytes = 0
