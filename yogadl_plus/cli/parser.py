"""The ``yogadl-plus`` command line: its commands, their options, and one-line usage errors."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

import yogadl_plus as ydl
from yogadl_plus.cli.bench import bench_options, cmd_bench
from yogadl_plus.cli.build import build_options, cmd_build
from yogadl_plus.cli.changing import cmd_pull, cmd_push, cmd_rm, copy_options
from yogadl_plus.cli.common import DEFAULT_ROOT
from yogadl_plus.cli.demo import cmd_demo
from yogadl_plus.cli.lineage import cmd_lineage, lineage_options
from yogadl_plus.cli.looking import cmd_head, cmd_info, cmd_ls, cmd_verify, head_options

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line, as every other error is, naming
    the --help that shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line: every command, with its options."""
    parser = _Parser(
        prog="yogadl-plus",
        description="Versioned, random-access caches of deep-learning datasets.",
        epilog="exit codes: 0 ok, 1 verification failed, 2 bad usage or input, "
        "3 dataset/version not found, 4 storage unreachable or denied, 5 a build worker died, "
        "70 internal error (a bug: please report its traceback), 130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"yogadl_plus {ydl.__version__}")
    _storage_option(parser, None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str,
        run: Callable[[argparse.Namespace], int],
        about: str,
        *parents: _Parser,
        options: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> None:
        p = sub.add_parser(name, parents=list(parents), help=about, description=about)
        p.set_defaults(run=run)
        if options is not None:
            options(p)

    storage, output, progress, version = _shared_options()
    command("demo", cmd_demo, "cache the bundled example dataset and tour it", storage)
    command(
        "build",
        cmd_build,
        "cache Parquet data, or what a Python function returns, as a version",
        storage,
        output,
        progress,
        options=build_options,
    )
    command("ls", cmd_ls, "list cached (dataset_id, version) pairs", storage, output)
    command("info", cmd_info, "show a version's schema, size, source and location", version)
    command("head", cmd_head, "print the first records as a table", version, options=head_options)
    command("verify", cmd_verify, "re-check every chunk's checksum", version, progress)
    for name, run, about in (
        ("push", cmd_push, "copy a version from --storage to URL"),
        ("pull", cmd_pull, "copy a version from URL into --storage"),
    ):
        command(name, run, about, version, progress, options=copy_options)
    command("rm", cmd_rm, "delete a version", version)
    command(
        "lineage",
        cmd_lineage,
        "which records made the items after a saved stream state",
        version,
        options=lineage_options,
    )
    command(
        "bench",
        cmd_bench,
        "measure how fast a version streams",
        version,
        progress,
        options=bench_options,
    )
    return parser


def _shared_options() -> tuple[_Parser, ...]:
    """Parent parsers of the options several commands take: --storage; --json;
    --no-progress; and a version (--storage, --json, dataset_id, version)."""
    storage = _Parser(add_help=False)
    # (SUPPRESS: given before the command, the main parser's value stands.)
    _storage_option(storage, argparse.SUPPRESS)
    output = _Parser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON for scripts")
    progress = _Parser(add_help=False)
    progress.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown only on a terminal)"
    )
    version = _Parser(add_help=False, parents=[storage, output])
    version.add_argument("dataset_id")
    version.add_argument("version")
    return storage, output, progress, version


def _storage_option(parser: argparse.ArgumentParser, default: Any) -> None:
    """--storage, which the main parser takes before the command (as ``git -C`` does) and every
    command after its name."""
    parser.add_argument(
        "--storage",
        metavar="URL",
        default=default,
        help="where caches live: a path, file://, s3://bucket/prefix or gs://bucket/prefix "
        f"(default: {DEFAULT_ROOT})",
    )
