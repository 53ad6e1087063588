"""StreamState: where a stream is, with what it was made with, checked when loaded.

An offset means the same records only in a stream over the same source (the same builds of
the same versions, at the same shares), ordered the same way. A state carries what fixes that
meaning (the source's name and fingerprint, the order's settings, the n-gram) besides the
offset, all as plain data, so loading it into a different stream is a clear ``ValueError``
naming what differs, not a resume at the wrong records. Batch size, fields, predicate,
transform and workers do not change what an offset means (offsets count positions, never
batches): a state loads across those. A mixture's schedule is kept apart from the rest: only
the epochs a state has read must be dealt alike (``StreamPlan.check_state``), so a run can
append stages.

A state also says how the stream that saved it made its items (``boundary``: batch size,
``drop_last``, how many records its skip list skipped and their digest, its predicate's repr),
so that what is told from the state alone (``yogadl-plus lineage --state``) can be checked
against it. That is information, never compared on load: a state loads into a stream with
another skip list or predicate. States saved before it was recorded have none; the key is
optional, so the format is unchanged and an earlier release loads these states too (it
ignores the key, and the offset means the same records there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yogadl_plus.checks import check_int
from yogadl_plus.order.settings import OrderSettings

__all__ = ["ADDED_ORDER_SETTINGS", "FORMAT", "SCHEDULED_FORMAT", "StreamState", "order_identity"]

#: The format of ``to_dict``: a state of another format is refused, naming both.
FORMAT = 2
#: The format of a state that keeps a mixture's schedule: a release before schedules refuses
#: it (it would resume with the weights of epoch 0), this one reads both.
SCHEDULED_FORMAT = 3
# The order settings a state compares: the stream's own start (start_offset) is what the
# state's offset replaces.
_ORDER_FIELDS = tuple(f.name for f in dataclasses.fields(OrderSettings) if f.name != "start_offset")
#: Order settings added since states of this format were first written, with the value they
#: take in a state that does not name them: what the release that saved it did.
ADDED_ORDER_SETTINGS: dict[str, Any] = {"pad_shard_remainder": False}
_KEYS = ("format", "dataset", "fingerprint", "positions", "order", "ngram", "offset")
# (Optional: a state of a mixture with a schedule has it; others, and states saved before
# schedules were, do not.)
_SCHEDULE = "schedule"
# (Optional too: states saved before it was recorded have none.)
_BOUNDARY = "boundary"
_BOUNDARY_KEYS = ("batch_size", "drop_last", "skip", "predicate")


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
    #: A mixture's stages, of it and its inner ones (``MixOrder.schedule``); None without one.
    schedule: Mapping[str, Any] | None = None
    #: How the stream made its items, never compared on load: ``batch_size``, ``drop_last``,
    #: ``skip`` ({"records": count, "sha256": digest} of its skip list, or None) and
    #: ``predicate`` (its repr, or None). None in a state saved before it was recorded.
    boundary: Mapping[str, Any] | None = None

    def identity(self) -> dict[str, Any]:
        """Everything but the offset, a schedule and the boundary: what two streams must share
        to exchange states (a schedule needs to agree only as far as the state has read)."""
        ignored = ("format", "offset", _SCHEDULE, _BOUNDARY)
        return {k: v for k, v in self.to_dict().items() if k not in ignored}

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT if self.schedule is None else SCHEDULED_FORMAT,
            "dataset": self.dataset,
            "fingerprint": self.fingerprint,
            "positions": self.positions,
            "order": dict(self.order),
            "ngram": None if self.ngram is None else dict(self.ngram),
            "offset": self.offset,
        }
        if self.schedule is not None:
            out[_SCHEDULE] = {
                path: [list(s) for s in stages] for path, stages in self.schedule.items()
            }
        if self.boundary is not None:
            out[_BOUNDARY] = dict(self.boundary)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamState:
        """The state ``to_dict`` wrote; ValueError naming what is missing or malformed."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a stream state is a dict, got {type(data).__name__}")
        missing = [name for name in _KEYS if name not in data and name != "format"]
        if missing:
            raise ValueError(f"not a stream state: it lacks {missing} (has {sorted(data)})")
        if data.get("format") not in (FORMAT, SCHEDULED_FORMAT):
            raise ValueError(
                f"this stream state has format {data.get('format')!r}, this yogadl_plus reads "
                f"formats {FORMAT} and {SCHEDULED_FORMAT} (an earlier release wrote states without "
                "one; a later one may write others): resume at its "
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
            schedule=_checked_schedule(data.get(_SCHEDULE)),
            boundary=_checked_boundary(data.get(_BOUNDARY)),
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


def _checked_schedule(schedule: Any) -> dict[str, list[list[Any]]] | None:
    """A state's schedule: path -> [[first epoch, [counts]], ...]; ValueError if malformed."""
    if schedule is None:
        return None
    malformed = ValueError(
        "stream state: 'schedule' must map each mixture's path to its stages, "
        f"[[first epoch, [counts]], ...], got {schedule!r}"
    )
    if not isinstance(schedule, Mapping):
        raise malformed
    out = {}
    for path, stages in schedule.items():
        if not isinstance(path, str) or not isinstance(stages, list) or not stages:
            raise malformed
        rows = []
        for stage in stages:
            if not (isinstance(stage, (list, tuple)) and len(stage) == 2):
                raise malformed
            first, counts = stage
            if not isinstance(counts, (list, tuple)):
                raise malformed
            rows.append(
                [
                    check_int("a schedule's first epoch", first, 0),
                    [check_int("a schedule's count", c, 0) for c in counts],
                ]
            )
        out[path] = rows
    return out


def _checked_boundary(boundary: Any) -> dict[str, Any] | None:
    """A state's boundary: {"batch_size", "drop_last", "skip", "predicate"}; ValueError if
    malformed."""
    if boundary is None:
        return None
    malformed = ValueError(
        "stream state: 'boundary' must be {batch_size: int or null, drop_last: bool, skip: "
        f"{{records, sha256}} or null, predicate: str or null}}, got {_cut(boundary)}"
    )
    # (Keys a later release may add are left out: they are information too.)
    if not isinstance(boundary, Mapping) or not set(_BOUNDARY_KEYS) <= set(boundary):
        raise malformed
    size, skip, predicate = boundary["batch_size"], boundary["skip"], boundary["predicate"]
    if not isinstance(boundary["drop_last"], bool) or not isinstance(predicate, (str, type(None))):
        raise malformed
    if skip is not None:
        if not (isinstance(skip, Mapping) and set(skip) == {"records", "sha256"}):
            raise malformed
        if not isinstance(skip["sha256"], str):
            raise malformed
        skip = {"records": check_int("a state's skipped records", skip["records"], 0),
                "sha256": skip["sha256"]}  # fmt: skip
    return {
        "batch_size": None if size is None else check_int("a state's batch_size", size, 1),
        "drop_last": boundary["drop_last"],
        "skip": skip,
        "predicate": predicate,
    }


def _cut(value: Any, most: int = 200) -> str:
    """``value``'s repr, cut short for an error message."""
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."
