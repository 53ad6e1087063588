"""A stream's stats in Prometheus' text exposition format, for a scrape endpoint or a push.

Names follow Grain's where Grain exports the same measure (``grain_python_data_sources_bytes_
read``, ``grain_python_dataset_source_read_time_ns``, ``grain_python_dataset_next_duration_ns``),
under ``yogadl_plus_`` and in seconds: Grain exports per-call histograms, these are running
sums since the stats began, which a dashboard's ``rate()`` turns into shares of time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from yogadl_plus.stream.verdict import bottleneck

if TYPE_CHECKING:
    from yogadl_plus.stream.timings import Timings

__all__ = ["exposition"]

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_STAGES = (
    "reading",
    "decoding",
    "predicates",
    "transforms",
    "batching",
    "waiting_on_workers",
    "in_consumer",
)


def exposition(stats: Timings, labels: Mapping[str, str] | None = None) -> str:
    """``stats`` as Prometheus text, each sample labelled with ``labels`` (e.g. the rank)."""
    base = dict(labels or {})
    getting = max(0.0, stats.seconds - stats.in_consumer)
    metrics: list[tuple[str, str, str, list[tuple[dict[str, str], float]]]] = [
        ("data_sources_bytes_read", "counter", "Decoded bytes of the records handed out.",
         [({}, stats.bytes)]),
        ("dataset_source_read_time_seconds", "counter",
         "Seconds reading records out of the cache (summed over workers).",
         [({}, stats.reading)]),
        ("dataset_next_duration_seconds", "counter",
         "Seconds the consuming thread spent getting items (waiting on the stream).",
         [({}, getting)]),
        ("items_handed_out", "counter", "Records (or n-gram windows) handed out.",
         [({}, stats.items)]),
        ("batches_handed_out", "counter", "Batches handed out (0 without batching).",
         [({}, stats.batches)]),
        ("stage_seconds", "counter", "Seconds spent by stage (the boundary's summed over workers).",
         [({"stage": stage}, getattr(stats, stage)) for stage in _STAGES]),
        ("wall_seconds", "gauge", "Wall time since the stats began.", [({}, stats.seconds)]),
        ("bottleneck", "gauge", "1 for the verdict of what limits the run (stats.bottleneck).",
         [({"verdict": bottleneck(stats)}, 1)]),
    ]  # fmt: skip
    lines = []
    for name, kind, about, samples in metrics:
        full = f"yogadl_plus_{name}"
        lines += [f"# HELP {full} {about}", f"# TYPE {full} {kind}"]
        for extra, value in samples:
            lines.append(f"{full}{_labels({**base, **extra})} {_number(value)}")
    return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    for key in labels:
        if not _LABEL.fullmatch(key):
            raise ValueError(f"Prometheus label names match [a-zA-Z_][a-zA-Z0-9_]*, got {key!r}")
    return "{" + ",".join(f'{k}="{_escaped(str(v))}"' for k, v in sorted(labels.items())) + "}"


def _escaped(value: str) -> str:
    """A label value as the format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))
