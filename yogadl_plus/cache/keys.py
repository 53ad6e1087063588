"""The LMDB keys inside a chunk file, written by the writer and read by the reader.

A record's key is its index inside the chunk, 4 bytes big-endian, so keys sort in record order
and appends stay in key order. After every record comes the chunk's identity, under the largest
4-byte key, then the whole-chunk column arrays, under that key followed by the column's name,
then the token columns (cache/tokencolumns.py), under that key followed by 0xff, what part of
the column the value is, and the field's position in the schema.

A token key cannot be a column key: a field name is UTF-8, in which the byte 0xff never occurs,
so a column key's fifth byte is never 0xff, and a token key's always is (which also sorts every
token key after every column key, as appends need). The field is named by its position, not
its name, because a name may take all the 511 bytes an LMDB key has beside the identity key
(``MAX_NAME_BYTES``); the position is as much the chunk's as the name, since the chunk records
the digest of the schema it was written with.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "IDENTITY_KEY",
    "KEY_BYTES",
    "TOKEN_PARTS",
    "column_key",
    "record_key",
    "record_keys",
    "token_key",
]

KEY_BYTES = 4
_KEY_DTYPE = ">u4"  # KEY_BYTES, big-endian
# The largest 4-byte key, never a record's (a chunk holds at most MAX_CHUNK_RECORDS - 1): it
# sorts after every record and before every column key.
IDENTITY_KEY = b"\xff" * KEY_BYTES
# What follows IDENTITY_KEY in a token key (never the first byte of a UTF-8 name), and the
# byte of each part of a token column: its tokens, ``ends`` and ``eos_ends``, and ``where``
# those three lie in the chunk file (written last: its key sorts after theirs).
_TOKEN_MARK = b"\xff"
TOKEN_PARTS = {"tokens": b"t", "ends": b"e", "eos_ends": b"s", "where": b"w"}


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


def token_key(position: int, part: str) -> bytes:
    """The LMDB key of ``part`` ("tokens", "ends", "eos_ends" or "where", ``TOKEN_PARTS``) of
    the token column of the schema's field at ``position``: it sorts after every column key."""
    return IDENTITY_KEY + _TOKEN_MARK + TOKEN_PARTS[part] + position.to_bytes(KEY_BYTES, "big")
