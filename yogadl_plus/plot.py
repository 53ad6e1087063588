"""A picture of where a stream's time went, for ``yogadl-plus bench --plot FILE.png``.

Left: each epoch timed, as one bar of the wall time split by stage (the stream's own work in the
consuming thread, the boundary's work, waiting on workers, the consumer), so the biggest colour
is the answer. Right: items per second over the epochs. The title is the verdict and what to do
(``StreamStats.summary()``). matplotlib is imported here only: ``pip install
'yogadl_plus[plot]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from yogadl_plus.errors import missing_extra
from yogadl_plus.stream.stats import WORK

__all__ = ["plot_epochs"]

# Stages drawn, in the order of the bar, with the colour of each.
_STAGES = (
    ("reading", "#4c72b0"),
    ("decoding", "#55a868"),
    ("predicates", "#8172b2"),
    ("transforms", "#c44e52"),
    ("batching", "#ccb974"),
    ("waiting_on_workers", "#64b5cd"),
    ("in_consumer", "#b0b0b0"),
    ("the_stream's_own", "#dd8452"),
)


def plot_epochs(rows: Sequence[dict[str, Any]], summary: str, path: str, workers: bool) -> None:
    """Draw ``rows`` (``time_epoch``'s, one per epoch) into the image file ``path``."""
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")  # (no display needed: a file)
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as missing:
        raise missing_extra(missing, "yogadl-plus bench --plot") from None
    figure, (bars, rates) = plt.subplots(
        1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]}
    )
    labels, parts = _bars(rows, workers)
    left = [0.0] * len(labels)
    for stage, colour in _STAGES:
        seconds = [part.get(stage, 0.0) for part in parts]
        if not any(seconds):
            continue
        bars.barh(labels, seconds, left=left, color=colour, label=stage.replace("_", " "))
        left = [a + b for a, b in zip(left, seconds)]
    bars.invert_yaxis()
    bars.set_xlabel("seconds")
    bars.set_title("where each epoch's time went")
    bars.legend(loc="lower right", fontsize=8)
    rates.plot(range(len(rows)), [row["records_per_s"] for row in rows], marker="o")
    rates.set_xticks(range(len(rows)), [str(row["epoch"]) for row in rows])
    rates.set_xlabel("epoch")
    rates.set_ylabel("records per second")
    rates.set_ylim(bottom=0)
    rates.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    rates.set_title("throughput over the run")
    figure.suptitle(summary, fontsize=10, wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bars(
    rows: Sequence[dict[str, Any]], workers: bool
) -> tuple[list[str], list[dict[str, float]]]:
    """One bar per epoch, of its wall time by stage (the stream's own: the order and handing
    items over); with workers two, the consuming thread's (which adds up to the epoch) and the
    workers' work, summed over them."""
    labels, parts = [], []
    for row in rows:
        time = row["time"]
        thread = {k: time[k] for k in ("batching", "waiting_on_workers", "in_consumer")}
        work = {k: time[k] for k in WORK}
        if workers:
            thread["the_stream's_own"] = max(0.0, row["seconds"] - sum(thread.values()))
            labels += [f"epoch {row['epoch']}", f"epoch {row['epoch']}: workers (summed)"]
            parts += [thread, work]
        else:
            own = max(0.0, row["seconds"] - sum(time.values()))
            labels.append(f"epoch {row['epoch']}")
            parts.append({**work, **thread, "the_stream's_own": own})
    return labels, parts
