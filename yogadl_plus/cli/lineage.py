"""``yogadl-plus lineage``: which records made the items after a saved stream state, with the
state and the skip list read from files and checked against each other."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

import yogadl_plus as ydl
from yogadl_plus.cli.common import count_option, emit, storage_of
from yogadl_plus.stream import StreamState
from yogadl_plus.stream.lineage import skip_items
from yogadl_plus.stream.skips import Skips

__all__ = ["cmd_lineage", "lineage_options"]

# A stream state is a few hundred bytes (a mixture's schedule adds some): a file far bigger is
# not one, and is not read whole.
_STATE_MOST_BYTES = 1 << 20


def cmd_lineage(args: argparse.Namespace) -> int:
    """Print which records made items A..B after a saved stream state."""
    state = _saved_state(args.state)
    _check_a_versions_state(args.state, state)
    ref = storage_of(args, reading=True).fetch(args.dataset_id, args.version)
    if state.ngram is not None:
        raise ValueError(
            "--state is an n-gram stream's: its windows need the NGram, which the command "
            "line cannot rebuild; ask stream.lineage() in Python"
        )
    try:
        stream = ref.stream(**state.order, **_lineage_boundary(args, state, ref))
    except TypeError as exc:  # a value of the state's order of the wrong kind
        raise ValueError(f"--state {args.state}: {exc}") from None
    stream.load_state(state)
    first, stop = args.items
    # Items A..B only: where item A begins is arithmetic (counted, with a skip list).
    plan = stream.plan()
    start = plan.offset_of(*skip_items(plan, *plan.position_of(stream.offset), first))
    found = stream.lineage(stop - first, start_offset=start)
    rows = [
        {"item": first + k, "records": np.asarray(records).tolist()}
        for k, records in enumerate(found)
    ]
    text = "\n".join(f"{row['item']}\t{' '.join(map(str, row['records']))}" for row in rows)
    emit(args, rows, text)
    if len(found) < stop - first:
        print(
            f"yogadl-plus lineage: note: there are no items {first + len(found)} to {stop - 1}:"
            " no later epoch of this shard hands out an item",
            file=sys.stderr,
        )
    return 0


def _saved_state(path: str) -> StreamState:
    """The stream state saved as JSON at ``path``; ValueError saying what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read(_STATE_MOST_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--state {path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > _STATE_MOST_BYTES:
        raise ValueError(
            f"--state {path} is over {_STATE_MOST_BYTES >> 20} MiB, so not a stream state "
            "(stream.state().to_dict() saved as JSON: a few hundred bytes)"
        )
    try:
        return StreamState.from_dict(json.loads(data))
    except RecursionError:
        raise ValueError(
            f"--state {path}: its JSON is nested too deeply to be a stream state "
            "(stream.state().to_dict() saved as JSON)"
        ) from None
    except ValueError as exc:  # not JSON, not UTF-8, or not a state
        raise ValueError(f"--state {path}: {exc}") from None


def _check_a_versions_state(path: str, state: StreamState) -> None:
    """ValueError unless ``state`` was saved by a stream over a version itself: one over token
    blocks or a mixture names what the command line cannot rebuild (its settings, its
    sources)."""
    made = state.dataset
    if made.startswith(("token_blocks(", "mix(")):
        what = "token blocks" if made.startswith("token_blocks(") else "a mixture"
        raise ValueError(
            f"--state {path} was saved by a stream over {what}, {made}, not over a version: "
            "the command line names a version's records only; ask stream.lineage() of a "
            "stream made as that one was, in Python (blocks.documents(i) names the documents "
            "a token block is cut from)"
        )


def _lineage_boundary(
    args: argparse.Namespace, state: StreamState, ref: ydl.DataRef
) -> dict[str, Any]:
    """The stream's ``batch_size``, ``drop_last`` and ``skip``: the options, checked against
    what the state says of the stream that saved it, so that no record it did not hand out
    is named without a word (a state saved before this was recorded: a note says so)."""
    skip = _skip_file(args.skip, ref) if args.skip is not None else None
    made = state.boundary
    if made is None:
        skipped = "the records of --skip" if skip is not None else "no record"
        print(
            f"yogadl-plus lineage: note: {args.state} was saved by an earlier release, which "
            "did not record the stream's batches, skip list or predicate: the items are as "
            f"--batch-size and --drop-last say, with {skipped} skipped",
            file=sys.stderr,
        )
        return {"batch_size": args.batch_size, "drop_last": args.drop_last, "skip": skip}
    if made["predicate"] is not None:
        raise ValueError(
            f"--state {args.state} was saved by a stream with the predicate "
            f"{made['predicate']}, which the command line cannot rebuild (without it, records "
            "the predicate rejected would be named): ask stream.lineage() of a stream made "
            "with it, in Python"
        )
    _check_skip(args, made["skip"], skip)
    size = made["batch_size"]
    if size is not None and args.batch_size not in (None, size):
        raise ValueError(
            f"--state {args.state} was saved by a stream of batches of {size}: --batch-size "
            f"{args.batch_size} would number other items; leave it out (the state says it)"
        )
    if size is not None and args.drop_last and not made["drop_last"]:
        raise ValueError(
            f"--state {args.state} was saved by a stream that kept each epoch's short last "
            "batch: leave out --drop-last"
        )
    return {
        "batch_size": args.batch_size if size is None else size,
        "drop_last": args.drop_last or made["drop_last"],
        "skip": skip,
    }


def _check_skip(
    args: argparse.Namespace, saved: Mapping[str, Any] | None, skip: Skips | None
) -> None:
    """ValueError unless --skip gives the skip list the state's stream had (any skip list
    where it had none: a state loads into a stream with one)."""
    if saved is None:
        return
    said = f"{saved['records']:,} records (sha256 {saved['sha256'][:16]}...)"
    if skip is None:
        raise ValueError(
            f"--state {args.state} was saved by a stream that skipped {said}: pass them with "
            "--skip FILE (a .npy or text file of their indices, or a bool mask), or records "
            "it never handed out would be named"
        )
    if skip.identity() != saved:
        raise ValueError(
            f"--skip {args.skip} holds {len(skip):,} records, not the {said} that the stream "
            f"which saved --state {args.state} skipped: pass that skip list"
        )


def _skip_file(path: str, ref: ydl.DataRef) -> Skips:
    """The skip list in ``path``, checked against ``ref``: a .npy array (indices, or a bool
    mask), or text of indices (or of true and false: a mask) apart by spaces, commas or lines."""
    try:
        if path.endswith(".npy"):
            given = np.load(path, allow_pickle=False)
        else:
            with open(path) as f:
                given = _skip_words(f.read().replace(",", " ").split())
        skips = Skips(given)
        skips.for_source(ref)
    except OSError as exc:
        raise ValueError(f"--skip {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # not .npy, not UTF-8, or not record indices
        raise ValueError(f"--skip {path}: {exc}") from None
    return skips


def _skip_words(words: list[str]) -> Any:
    """A text skip list's words: a bool mask, or record indices."""
    if words and all(word.lower() in ("true", "false") for word in words):
        return np.array([word.lower() == "true" for word in words])
    indices = []
    for number, word in enumerate(words, 1):
        try:
            indices.append(int(word))
        except ValueError:
            raise ValueError(
                f"word {number}, {word[:40]!r}, is not a record index: a text skip list is "
                "whole numbers apart by spaces, commas or lines (or true and false, a mask)"
            ) from None
    return indices


def _items(text: str) -> tuple[int, int]:
    """``A:B``: items A (included) to B (excluded) after the state's offset."""
    first, colon, stop = text.partition(":")
    try:
        bounds = (count_option(first), count_option(stop))
    except argparse.ArgumentTypeError:
        bounds = (-1, -1)
    if not colon or bounds[0] > bounds[1] or bounds[0] < 0:
        raise argparse.ArgumentTypeError(f"expected A:B with 0 <= A <= B, got {text!r}")
    return bounds


def lineage_options(p: argparse.ArgumentParser) -> None:
    """The options of ``lineage``: the state, the items, and what the state's stream did (batches,
    skip list)."""
    p.add_argument("--state", required=True, help="a stream's state, as state().to_dict() saved")
    p.add_argument(
        "--items",
        type=_items,
        default=(0, 1),
        metavar="A:B",
        help="items A to B-1 after the state's offset (default 0:1)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="the stream's batch size (default: the state's; records for a state saved by an "
        "earlier release)",
    )
    p.add_argument(
        "--drop-last",
        action="store_true",
        help="the stream drops short batches (default: as the state says)",
    )
    p.add_argument(
        "--skip",
        metavar="FILE",
        help="the stream's skip list: a .npy array of record indices or a bool mask, or a text "
        "file of indices (needed when the state's stream had one)",
    )
