"""The commands that look at versions: ``ls``, ``info``, ``head`` and ``verify``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import yogadl_plus as ydl
from yogadl_plus.cli.common import (
    count_option,
    default_note,
    describe_summary,
    emit,
    field_list,
    progress_for,
    storage_of,
    table,
    version_summary,
)
from yogadl_plus.cli.values import json_value, show_value
from yogadl_plus.storage import local_root

__all__ = ["cmd_head", "cmd_info", "cmd_ls", "cmd_verify", "head_options"]


def _not_a_root(root: str) -> str | None:
    """Why ``root``, holding no dataset, is likely a dataset's or a version's folder instead."""
    parent, name = os.path.split(root)
    versions = [v for d, v in ydl.LocalStorage(parent).list() if d == name]
    if versions:
        return (
            f"{root} is the folder of dataset {name!r} (its folders, such as {versions[0]!r}, "
            f"are versions); the storage root is {parent}"
        )
    grandparent, dataset = os.path.split(parent)
    if (dataset, name) in ydl.LocalStorage(grandparent).list():
        return (
            f"{root} is the folder of version {dataset}:{name}; the storage root is {grandparent}"
        )
    return None


def cmd_ls(args: argparse.Namespace) -> int:
    """Print the (dataset_id, version) pairs cached in --storage."""
    storage = storage_of(args, reading=True)
    pairs = storage.list()
    root = local_root(args.storage)
    why = _not_a_root(root) if not pairs and root is not None else None
    if why is not None:
        raise ydl.DatasetNotFound(f"no datasets: {why} (use --storage with it)")
    emit(
        args,
        [{"dataset_id": d, "version": v} for d, v in pairs],
        "\n".join(f"{d}\t{v}" for d, v in pairs),
    )
    if not pairs and not args.json:
        print(f"no versions in {storage}{default_note(args)}", file=sys.stderr)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print a version's schema, size, source and location."""
    storage = storage_of(args, reading=True)
    ref = storage.fetch(args.dataset_id, args.version)
    m = ref.manifest
    summary = version_summary(storage, ref)
    lines = [
        f"dataset {m.dataset_id}  version {m.version}",
        f"  where     {summary['where']}",
        f"  records   {m.num_records}",
        f"  chunks    {len(m.chunks)} ({summary['bytes']:,} bytes)",
        f"  source    {m.source_kind} {m.source_fingerprint or ''}".rstrip(),
        f"  created   {m.created} by yogadl_plus {m.library_version}",
        "  fields",
        *(
            f"    {f.name:<20} {f.describe():<20} {f.codec!r}{', nullable' if f.nullable else ''}"
            for f in m.schema
        ),
    ]
    data = {**json.loads(m.to_json()), "bytes": summary["bytes"], "where": summary["where"]}
    emit(args, data, "\n".join(lines))
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    """Print the first records of a version, as a table or JSON."""
    ref = storage_of(args, reading=True).fetch(args.dataset_id, args.version)
    count = min(args.n, len(ref))
    batch = ref.get_batch(np.arange(count), fields=field_list(args.fields))
    names = list(batch)
    if args.json:
        records = [
            {"index": i, **{k: json_value(batch[k][i]) for k in names}} for i in range(count)
        ]
        schema = [ref.schema[name].to_json() for name in names]
        print(
            json.dumps(
                {
                    "dataset_id": ref.dataset_id,
                    "version": ref.version,
                    "schema": schema,
                    "records": records,
                }
            )
        )
        return 0
    rows = [[str(i), *(show_value(batch[k][i]) for k in names)] for i in range(count)]
    print(table(["index", *names], rows))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every chunk of a version against its checksum."""
    storage = storage_of(args, reading=True)
    try:
        ref = storage.fetch(args.dataset_id, args.version)
        chunks = ref.manifest.chunks
        with progress_for(
            args, f"verifying {ref.dataset_id}:{ref.version}", len(chunks), " chunk", scale=False
        ) as advance:
            ref.verify(on_chunk=lambda _: advance(1))
    except ydl.CacheCorrupted:
        if isinstance(storage, ydl.LocalStorage):
            raise
        # A remote storage pulls a damaged local copy again: only a damaged remote one fails.
        storage.verify(args.dataset_id, args.version)
        ref = storage.fetch(args.dataset_id, args.version)
    summary = {**version_summary(storage, ref), "verified": True}
    emit(args, summary, f"{describe_summary(summary)}: every chunk matches its checksum")
    return 0


def head_options(p: argparse.ArgumentParser) -> None:
    """The options of ``head``: how many records, and which fields."""
    p.add_argument("-n", type=count_option, default=5, help="how many records (default 5)")
    p.add_argument("--fields", help="comma-separated fields to show")
