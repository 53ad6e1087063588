"""The LMDB keys inside a chunk file, written by the writer and read by the reader.

A record's key is its index inside the chunk, 4 bytes big-endian, so keys sort in record order
and appends stay in key order. After every record comes the chunk's identity, under the largest
4-byte key, then the whole-chunk column arrays, under that key followed by the column's name.
"""

from __future__ import annotations

import numpy as np

__all__ = ["IDENTITY_KEY", "KEY_BYTES", "column_key", "record_key", "record_keys"]

KEY_BYTES = 4
_KEY_DTYPE = ">u4"  # KEY_BYTES, big-endian
# The largest 4-byte key, never a record's (a chunk holds at most MAX_CHUNK_RECORDS - 1): it
# sorts after every record and before every column key.
IDENTITY_KEY = b"\xff" * KEY_BYTES


def record_key(local_index: int) -> bytes:
    """The LMDB key of a record inside its chunk."""
    return local_index.to_bytes(KEY_BYTES, "big")


def record_keys(local_indices: np.ndarray) -> list[bytes]:
    """record_key of each index of an integer array, in one vectorized step."""
    packed = local_indices.astype(_KEY_DTYPE).tobytes()
    return [packed[j : j + KEY_BYTES] for j in range(0, len(packed), KEY_BYTES)]


def column_key(name: str) -> bytes:
    """The LMDB key of a whole-chunk column array: longer than a record key and starting with
    the largest one, so it sorts after every record."""
    return IDENTITY_KEY + name.encode("utf-8")
