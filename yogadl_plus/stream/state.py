"""StreamState: where a stream is, with what it was made with, checked when loaded.

An offset means the same records only in a stream over the same source (the same builds of
the same versions, at the same shares), ordered the same way. A state carries what fixes that
meaning (the source's name and fingerprint, the order's settings, the n-gram) besides the
offset, all as plain data, so loading it into a different stream is a clear ``ValueError``
naming what differs, not a resume at the wrong records. Batch size, fields, predicate,
transform and workers do not change what an offset means (offsets count positions, never
batches): a state loads across those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yogadl_plus.checks import check_int
from yogadl_plus.order.settings import OrderSettings

__all__ = ["ADDED_ORDER_SETTINGS", "FORMAT", "StreamState", "order_identity"]

#: The format of ``to_dict``: a state of another format is refused, naming both.
FORMAT = 2
# The order settings a state compares: the stream's own start (start_offset) is what the
# state's offset replaces.
_ORDER_FIELDS = tuple(f.name for f in dataclasses.fields(OrderSettings) if f.name != "start_offset")
#: Order settings added since states of this format were first written, with the value they
#: take in a state that does not name them: what the release that saved it did.
ADDED_ORDER_SETTINGS: dict[str, Any] = {"pad_shard_remainder": False}
_KEYS = ("format", "dataset", "fingerprint", "positions", "order", "ngram", "offset")


def order_identity(settings: OrderSettings) -> dict[str, Any]:
    """The order settings a state records: all but the stream's own start_offset."""
    return {name: getattr(settings, name) for name in _ORDER_FIELDS}


@dataclass(frozen=True)
class StreamState:
    """What ``stream.state()`` returns and ``stream.load_state`` takes (Grain's
    ``get_state``/``set_state``): the ``offset`` to resume at, and what must match for it to
    mean the same records. ``to_dict`` / ``from_dict`` make it JSON for a checkpoint."""

    dataset: str
    fingerprint: str
    positions: int
    order: Mapping[str, Any]
    ngram: Mapping[str, Any] | None
    offset: int

    def identity(self) -> dict[str, Any]:
        """Everything but the offset: what two streams must share to exchange states."""
        return {k: v for k, v in self.to_dict().items() if k not in ("format", "offset")}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dataset": self.dataset,
            "fingerprint": self.fingerprint,
            "positions": self.positions,
            "order": dict(self.order),
            "ngram": None if self.ngram is None else dict(self.ngram),
            "offset": self.offset,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamState:
        """The state ``to_dict`` wrote; ValueError naming what is missing or malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a stream state is a dict, got {type(data).__name__}")
        missing = [name for name in _KEYS if name not in data and name != "format"]
        if missing:
            raise ValueError(f"not a stream state: it lacks {missing} (has {sorted(data)})")
        if data.get("format") != FORMAT:
            raise ValueError(
                f"this stream state has format {data.get('format')!r}, this yogadl_plus reads "
                f"format {FORMAT} (an earlier release wrote states without one): resume at its "
                f"offset {data['offset']!r} with start_offset=, or with the release that saved it"
            )
        order = data["order"]
        if isinstance(order, Mapping):
            order = {**{k: v for k, v in ADDED_ORDER_SETTINGS.items() if k not in order}, **order}
        if not isinstance(order, Mapping) or set(order) != set(_ORDER_FIELDS):
            raise ValueError(
                f"stream state: 'order' must hold {sorted(_ORDER_FIELDS)}, got {order!r}"
            )
        for name in ("dataset", "fingerprint"):
            if not isinstance(data[name], str):
                raise ValueError(f"stream state: {name!r} must be a str, got {data[name]!r}")
        if data["ngram"] is not None and not isinstance(data["ngram"], Mapping):
            raise ValueError(f"stream state: 'ngram' must be a dict or None, got {data['ngram']!r}")
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
                differences += [
                    f"{name}: saved {saved['order'][name]!r}, this stream {mine['order'][name]!r}"
                    for name in _ORDER_FIELDS
                    if saved["order"][name] != mine["order"][name]
                ]
            elif saved[key] != mine[key]:
                differences.append(f"{key}: saved {saved[key]!r}, this stream {mine[key]!r}")
        hint = ""
        if any(d.startswith(("num_shards", "shard_rank")) for d in differences):
            hint = " (to resume on another number of shards, save stream.global_offset and pass "
            hint += "it as global_start)"
        raise ValueError(
            "this state was saved from a different stream, so its offset would resume at other "
            f"records: {'; '.join(differences)}{hint}"
        )
