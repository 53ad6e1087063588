"""StreamState: where a stream is, with what it was made with, checked when loaded.

An offset means the same records only in a stream over the same build of the same version,
ordered the same way. A state carries what fixes that meaning (dataset and version, the
fingerprint of the build's chunks, the order's settings, the n-gram) besides the offset, so
loading it into a different stream is a clear ``ValueError`` naming what differs, not a resume
at the wrong records. Batch size, fields, predicate, transform and workers do not change what
an offset means (offsets count positions, never batches): a state loads across those.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yogadl_plus.cache.manifest import Manifest
from yogadl_plus.checks import check_int
from yogadl_plus.order import OrderSettings

__all__ = ["StreamState", "build_fingerprint", "order_identity"]

# The order settings a state compares: the stream's own start (start_offset) is what the
# state's offset replaces.
_ORDER_FIELDS = tuple(f.name for f in dataclasses.fields(OrderSettings) if f.name != "start_offset")
# Settings added after states were first saved, with the value that orders as before they
# existed: a state records them only when they differ from it, so states saved before (and
# Keras backups naming the order's settings) still load, and one saved with them set is
# refused by a stream without them.
_ADDED_LATER = {"shuffle_window": None}


def build_fingerprint(manifest: Manifest) -> str:
    """A short digest of a build's records: its chunks' checksums and counts, in order."""
    digest = hashlib.sha256()
    for chunk in manifest.chunks:
        digest.update(f"{chunk.sha256}:{chunk.records};".encode("ascii"))
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class StreamState:
    """What ``stream.state()`` returns and ``stream.load_state`` takes (Grain's
    ``get_state``/``set_state``): the ``offset`` to resume at, and what must match for it to
    mean the same records. ``to_dict`` / ``from_dict`` make it JSON for a checkpoint."""

    dataset: str
    fingerprint: str
    positions: int
    order: Mapping[str, Any]
    ngram: str | None
    offset: int

    def identity(self) -> dict[str, Any]:
        """Everything but the offset: what two streams must share to exchange states."""
        return {k: v for k, v in self.to_dict().items() if k != "offset"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "fingerprint": self.fingerprint,
            "positions": self.positions,
            "order": dict(self.order),
            "ngram": self.ngram,
            "offset": self.offset,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamState:
        """The state ``to_dict`` wrote; ValueError naming what is missing or malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a stream state is a dict, got {type(data).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in fields if name not in data]
        if missing:
            raise ValueError(f"not a stream state: it lacks {missing} (has {sorted(data)})")
        order = data["order"]
        required = set(_ORDER_FIELDS) - set(_ADDED_LATER)
        if not isinstance(order, Mapping) or not required <= set(order) <= set(_ORDER_FIELDS):
            raise ValueError(
                f"stream state: 'order' must hold {sorted(required)} (and may hold "
                f"{sorted(_ADDED_LATER)}), got {order!r}"
            )
        for name in ("dataset", "fingerprint"):
            if not isinstance(data[name], str):
                raise ValueError(f"stream state: {name!r} must be a str, got {data[name]!r}")
        if data["ngram"] is not None and not isinstance(data["ngram"], str):
            raise ValueError(f"stream state: 'ngram' must be a str or None, got {data['ngram']!r}")
        return cls(
            dataset=data["dataset"],
            fingerprint=data["fingerprint"],
            positions=check_int("stream state's positions", data["positions"], 0),
            order=dict(order),
            ngram=data["ngram"],
            offset=check_int("stream state's offset", data["offset"], 0),
        )

    def check_loads_into(self, here: StreamState) -> None:
        """Raise ValueError naming every difference that would make this state's offset mean
        other records in the stream whose state is ``here``."""
        saved, mine = self.identity(), here.identity()
        if saved == mine:
            return
        differences = []
        for key in saved:
            if key == "order":
                was, now = _all_settings(saved["order"]), _all_settings(mine["order"])
                differences += [
                    f"{name}: saved {was[name]!r}, this stream {now[name]!r}"
                    for name in _ORDER_FIELDS
                    if was[name] != now[name]
                ]
            elif saved[key] != mine[key]:
                differences.append(f"{key}: saved {saved[key]!r}, this stream {mine[key]!r}")
        if not differences:
            return  # one names a later setting at the value that is the same as leaving it out
        hint = ""
        if any(d.startswith(("num_shards", "shard_rank")) for d in differences):
            hint = " (to resume on another number of shards, save stream.global_offset and pass "
            hint += "it as global_start)"
        raise ValueError(
            "this state was saved from a different stream, so its offset would resume at other "
            f"records: {'; '.join(differences)}{hint}"
        )


def order_identity(settings: OrderSettings) -> dict[str, Any]:
    """The order settings a state records: all but the stream's own start_offset, and a
    setting added later (``shuffle_window``) only where it is not the value that orders as
    before it existed."""
    return {
        name: getattr(settings, name)
        for name in _ORDER_FIELDS
        if name not in _ADDED_LATER or getattr(settings, name) != _ADDED_LATER[name]
    }


def _all_settings(order: Mapping[str, Any]) -> dict[str, Any]:
    """A state's order settings with those it leaves out at their defaults."""
    return {**_ADDED_LATER, **order}
