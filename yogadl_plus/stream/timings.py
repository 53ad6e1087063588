"""Timings: the numbers of ``stream.stats()`` (``StreamStats``, stats.py, adds what they tell),
declared below what reads them: the verdict (verdict.py) and the Prometheus text (prometheus.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Timings"]


@dataclass(frozen=True)
class Timings:
    """Items and bytes handed out, and the seconds spent by kind: ``StreamStats`` says what
    each one counts."""

    items: int
    batches: int
    bytes: int
    seconds: float
    reading: float
    decoding: float
    predicates: float
    transforms: float
    batching: float
    waiting_on_workers: float
    in_consumer: float

    @property
    def items_per_s(self) -> float:
        """Items handed out per second of ``seconds``."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Stored bytes read per second of ``seconds``."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0
