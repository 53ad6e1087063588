"""The ``yogadl-plus`` command: build, inspect, verify and remove cached versions; run the demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import yogadl_plus as ydl

__all__ = ["main"]


def _storage(args: argparse.Namespace) -> ydl.Storage:
    return ydl.open_storage(args.storage) if args.storage else ydl.default_storage()


def _show(value: Any, width: int = 60) -> str:
    if isinstance(value, np.ndarray):
        body = np.array2string(value.ravel()[:8], precision=4, separator=", ")
        more = ", ..." if value.size > 8 else ""
        return f"{value.dtype}{list(value.shape)} {body[:-1]}{more}]"[:width]
    return repr(value.item() if isinstance(value, np.generic) else value)[:width]


def cmd_demo(args: argparse.Namespace) -> int:
    from yogadl_plus.demo import run_demo

    return run_demo(_storage(args))


def cmd_build(args: argparse.Namespace) -> int:
    columns = args.columns.split(",") if args.columns else None
    source = ydl.sources.ParquetSource(args.source, columns=columns)
    ref = ydl.cache_dataset(
        source,
        args.dataset_id,
        args.version,
        _storage(args),
        overwrite=args.overwrite,
        chunk_bytes=args.chunk_mb << 20,
    )
    print(
        f"{ref.dataset_id}:{ref.version}: {len(ref)} records in {len(ref.manifest.chunks)} chunk(s)"
    )
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    for dataset_id, version in _storage(args).list():
        print(f"{dataset_id}\t{version}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    ref = _storage(args).fetch(args.dataset_id, args.version)
    m = ref.manifest
    if args.json:
        print(m.to_json())
        return 0
    size = sum(c.bytes for c in m.chunks)
    print(f"dataset {m.dataset_id}  version {m.version}")
    print(f"  records   {m.num_records}")
    print(f"  chunks    {len(m.chunks)} ({size / 2**20:.1f} MiB)")
    print(f"  source    {m.source_kind} {m.source_fingerprint or ''}".rstrip())
    print(f"  created   {m.created} by yogadl_plus {m.library_version}")
    print("  fields")
    for f in m.schema:
        null = ", nullable" if f.nullable else ""
        print(f"    {f.name:<20} {f.describe():<20} {f.codec!r}{null}")
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    ref = _storage(args).fetch(args.dataset_id, args.version)
    fields = args.fields.split(",") if args.fields else None
    for i in range(min(args.n, len(ref))):
        record = ref.get_batch([i], fields=fields)
        shown = {k: _show(v[0]) for k, v in record.items()}
        print(json.dumps({"index": i, **shown}) if args.json else f"{i}: {shown}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    storage = _storage(args)
    storage.verify(args.dataset_id, args.version)
    print(f"{args.dataset_id}:{args.version}: every chunk matches its checksum")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    _storage(args).delete(args.dataset_id, args.version)
    print(f"removed {args.dataset_id}:{args.version}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yogadl-plus",
        description="Versioned, random-access caches of deep-learning datasets.",
    )
    parser.add_argument("--version", action="version", version=f"yogadl_plus {ydl.__version__}")
    storage = argparse.ArgumentParser(add_help=False)
    storage.add_argument(
        "--storage",
        metavar="URL",
        help="where caches live: a path or file:// URL (default: $YOGADL_PLUS_HOME or "
        "~/.cache/yogadl_plus)",
    )
    version = argparse.ArgumentParser(add_help=False, parents=[storage])
    version.add_argument("dataset_id")
    version.add_argument("version")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "demo", parents=[storage], help="cache the bundled example dataset and tour it"
    )
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("build", parents=[storage], help="cache Parquet data as a new version")
    p.add_argument("source", nargs="+", help="Parquet file(s), directory or glob")
    p.add_argument("dataset_id")
    p.add_argument("version")
    p.add_argument("--columns", help="comma-separated columns to cache (default: all)")
    p.add_argument("--overwrite", action="store_true", help="rebuild if the version exists")
    p.add_argument("--chunk-mb", type=int, default=256, help="chunk file size (MiB, default 256)")
    p.set_defaults(run=cmd_build)

    p = sub.add_parser("ls", parents=[storage], help="list cached (dataset_id, version) pairs")
    p.set_defaults(run=cmd_ls)

    p = sub.add_parser("info", parents=[version], help="show a version's schema, size, source")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(run=cmd_info)

    p = sub.add_parser("head", parents=[version], help="print the first records")
    p.add_argument("-n", type=int, default=5, help="how many records (default 5)")
    p.add_argument("--fields", help="comma-separated fields to show")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(run=cmd_head)

    p = sub.add_parser("verify", parents=[version], help="re-check every chunk's checksum")
    p.set_defaults(run=cmd_verify)

    p = sub.add_parser("rm", parents=[version], help="delete a version")
    p.set_defaults(run=cmd_rm)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "build" and len(args.source) == 1:
        args.source = args.source[0]
    try:
        return int(args.run(args))
    except (ydl.YogaError, ValueError, NotImplementedError) as exc:
        print(f"yogadl-plus {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
