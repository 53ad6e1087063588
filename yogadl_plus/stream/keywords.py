"""``stream(...)``'s keywords routed onto the settings they are fields of, by name:
``OrderSettings``, ``BoundarySettings`` or ``WorkerSettings``. The one place that knows which
keyword goes where: ``RecordSource.stream``, ``Stream.replace`` and the faces' samplers (which
take the order's keywords, or an ``OrderSettings``) route through it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar

from yogadl_plus.order.settings import OrderSettings
from yogadl_plus.stream.settings import BoundarySettings, WorkerSettings

__all__ = ["KEYWORDS", "StreamSettings", "order_settings", "routed"]

S = TypeVar("S", OrderSettings, BoundarySettings, WorkerSettings)


class StreamSettings(NamedTuple):
    """A stream's settings, one of each kind."""

    order: OrderSettings
    boundary: BoundarySettings
    workers: WorkerSettings


#: Every keyword of ``stream(...)``: the fields of the three settings.
KEYWORDS = frozenset(
    f.name
    for kind in (OrderSettings, BoundarySettings, WorkerSettings)
    for f in dataclasses.fields(kind)
)


def routed(
    keywords: Mapping[str, Any], over: StreamSettings | None = None, who: str = "stream()"
) -> StreamSettings:
    """The settings ``keywords`` make, each keyword the field of its name in one of them, over
    ``over``'s (None: the defaults). TypeError, naming ``who``, for a keyword none has."""
    unknown = sorted(set(keywords) - KEYWORDS)
    if unknown:
        raise TypeError(f"{who} got unknown arguments {unknown}")
    if over is None:
        return StreamSettings(
            _made(OrderSettings, keywords),
            _made(BoundarySettings, keywords),
            _made(WorkerSettings, keywords),
        )
    return StreamSettings(
        _changed(over.order, keywords),
        _changed(over.boundary, keywords),
        _changed(over.workers, keywords),
    )


def order_settings(who: str, order: OrderSettings | None, **keywords: Any) -> OrderSettings:
    """The order of a face that takes the order's keywords or ``order=``: ``order`` where
    given, else the ``OrderSettings`` of ``keywords``. TypeError when ``order`` is given and a
    keyword differs from its default too (which of them would hold is not for us to guess)."""
    if order is None:
        return _made(OrderSettings, keywords)
    if not isinstance(order, OrderSettings):
        raise TypeError(f"{who}: order= takes an OrderSettings, got {order!r}")
    defaults = {f.name: f.default for f in dataclasses.fields(OrderSettings)}
    also = sorted(name for name, value in keywords.items() if value != defaults[name])
    if also:
        raise TypeError(
            f"{who}: pass the order as order= or as keywords, not both (got order= and {also})"
        )
    return order


def _made(kind: type[S], keywords: Mapping[str, Any]) -> S:
    names = {f.name for f in dataclasses.fields(kind)}
    return kind(**{k: v for k, v in keywords.items() if k in names})


def _changed(settings: S, keywords: Mapping[str, Any]) -> S:
    names = {f.name for f in dataclasses.fields(settings)}
    changes = {k: v for k, v in keywords.items() if k in names}
    return dataclasses.replace(settings, **changes) if changes else settings
