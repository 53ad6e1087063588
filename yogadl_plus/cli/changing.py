"""The commands that change versions: ``push`` and ``pull`` (one copy, in opposite
directions) and ``rm``."""

from __future__ import annotations

import argparse

import yogadl_plus as ydl
from yogadl_plus.cli.common import describe_summary, emit, progress_for, storage_of, version_summary
from yogadl_plus.storage import copy_version

__all__ = ["cmd_pull", "cmd_push", "cmd_rm", "copy_options"]


def _copy(args: argparse.Namespace, source: ydl.Storage, target: ydl.Storage) -> int:
    """push and pull: the same copy, in opposite directions."""
    name = f"{args.dataset_id}:{args.version}"
    # One bar for the bytes moved: downloaded or uploaded by a bucket, checked and placed here.
    with progress_for(args, f"{args.command}ing {name}", None, "B") as advance:
        ref = copy_version(
            source,
            target,
            args.dataset_id,
            args.version,
            overwrite=args.overwrite,
            progress=advance,
            on_transfer=advance,
        )
    summary = version_summary(target, ref)
    emit(args, summary, describe_summary(summary))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    """Copy a version from --storage to URL."""
    return _copy(args, storage_of(args, reading=True), ydl.open_storage(args.url))


def cmd_pull(args: argparse.Namespace) -> int:
    """Copy a version from URL into --storage."""
    return _copy(args, ydl.open_storage(args.url), storage_of(args))


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete a version from --storage."""
    storage = storage_of(args, reading=True)
    storage.delete(args.dataset_id, args.version)
    emit(
        args,
        {"dataset_id": args.dataset_id, "version": args.version, "removed": True},
        f"removed {args.dataset_id}:{args.version} from {storage}",
    )
    return 0


def copy_options(p: argparse.ArgumentParser) -> None:
    """The options of ``push`` and ``pull``: the other storage's URL, and --overwrite."""
    p.add_argument("url", metavar="URL", help="s3://bucket/prefix, gs://bucket/prefix or a path")
    p.add_argument("--overwrite", action="store_true", help="replace the version if it exists")
