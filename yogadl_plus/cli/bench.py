"""``yogadl-plus bench``: how fast a version streams, epoch by epoch, and where the time went."""

from __future__ import annotations

import argparse
from typing import Any

from yogadl_plus.cli.common import (
    emit,
    field_list,
    positive_option,
    progress_for,
    storage_of,
    table,
)
from yogadl_plus.stream.stats import TIMED, time_epoch

__all__ = ["bench_options", "cmd_bench"]


def _where_time_went(rows: list[dict[str, Any]], workers: bool) -> str:
    """One line: the seconds of every epoch timed, by kind of work."""
    total = sum(row["seconds"] for row in rows)
    spent = {name: sum(row["time"][name] for row in rows) for name in TIMED}
    parts = [
        f"{name.replace('_', ' ')} {seconds:.3f} s ({seconds / total:.0%})"
        for name, seconds in spent.items()
        if seconds >= 0.0005
    ]
    line = "time: " + ", ".join(parts)
    if workers:
        return line + " (the workers' work is summed over them)"
    # Without workers, what is not named is the stream's own: the order, handing items out.
    other = total - sum(spent.values()) + spent["waiting_on_workers"]
    return line + f", the stream's own {max(0.0, other):.3f} s ({max(0.0, other) / total:.0%})"


def _bench_row(row: dict[str, Any]) -> list[str]:
    def number(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    return [
        str(row["epoch"]),
        str(row["records"]),
        number(row["seconds"], ".3f"),
        number(row["records_per_s"], ",.0f"),
        number(row["batches_per_s"], ",.1f"),
        number(row["mb_per_s"], ",.1f"),
        number(None if row["first_item_s"] is None else row["first_item_s"] * 1e3, ".2f"),
    ]


def cmd_bench(args: argparse.Namespace) -> int:
    """Stream the version for --epochs epochs; print how fast each went, and where the time went."""
    if args.shuffle and args.num_shards > 1 and args.seed is None:
        # (Said in the flags' words, before the stream says it in the API's.)
        raise ValueError(
            "--shuffle with --num-shards > 1 needs --seed N, the same on every rank: otherwise "
            "each rank would draw its own order and the shards would overlap"
        )
    ref = storage_of(args, reading=True).fetch(args.dataset_id, args.version)
    stream = ref.stream(
        shuffle=args.shuffle,
        shuffle_seed=args.seed,
        batch_size=args.batch_size,
        fields=field_list(args.fields),
        num_workers=args.num_workers,
        num_shards=args.num_shards,
        shard_rank=args.shard_rank,
        shard_by=args.shard_by,
    )
    total = len(stream) * args.epochs
    try:
        with progress_for(args, f"bench {ref.dataset_id}:{ref.version}", total, " item") as advance:
            rows = [time_epoch(stream, epoch, advance) for epoch in range(args.epochs)]
    finally:
        stream.close()
    header = ["epoch", "records", "seconds", "records/s", "batches/s", "MB/s", "first item ms"]
    text = table(header, [_bench_row(row) for row in rows])
    if args.batch_size is None:
        text += "\n(batches/s: with --batch-size)"
    text += "\n" + _where_time_went(rows, bool(args.num_workers))
    summary = stream.stats().summary()
    text += "\n" + summary
    if args.plot:
        from yogadl_plus.plot import plot_epochs

        plot_epochs(rows, summary, args.plot, bool(args.num_workers))
        text += f"\n(drawn in {args.plot})"
    emit(args, rows, text)
    return 0


def bench_options(p: argparse.ArgumentParser) -> None:
    """The options of ``bench``: how to stream (shuffle, batches, fields, workers, shards), for how
    many epochs, and --plot."""
    p.add_argument("--shuffle", action="store_true", help="shuffle every epoch")
    p.add_argument(
        "--seed", type=int, help="shuffle seed (needed with --shuffle and --num-shards > 1)"
    )
    p.add_argument("--batch-size", type=int, help="stream batches of this size (default: records)")
    p.add_argument("--fields", help="comma-separated fields to read (default: all)")
    p.add_argument("--num-workers", type=int, default=0, help="reader threads (default 0)")
    p.add_argument("--num-shards", type=int, default=1, help="shards (default 1)")
    p.add_argument("--shard-rank", type=int, default=0, help="this shard (default 0)")
    p.add_argument("--shard-by", choices=["records", "chunks"], default="records")
    p.add_argument("--epochs", type=positive_option, default=1, help="epochs to time (default 1)")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw where the time went, per stage and over the epochs (needs matplotlib: pip "
        "install 'yogadl_plus[plot]')",
    )
