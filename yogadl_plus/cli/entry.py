"""``main``: parse the command line, run the command, and say an error in one line with the
exit status of its kind (``EXIT_CODES``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence

import yogadl_plus as ydl
from yogadl_plus.cli.common import where_it_looked
from yogadl_plus.cli.parser import build_parser

__all__ = ["EXIT_CODES", "INTERNAL_ERROR", "main"]

# The first matching row gives the exit status (DatasetNotFound, StorageError and WorkerDied are
# YogaErrors too; StorageError is an OSError). 0: success; argparse's own usage errors exit 2;
# anything else is a bug of ours: its traceback, and INTERNAL_ERROR.
EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((ydl.CacheCorrupted,), 1),
    ((ydl.DatasetNotFound,), 3),
    ((ydl.StorageError, OSError), 4),
    ((ydl.WorkerDied,), 5),
    ((ydl.YogaError, ValueError, NotImplementedError, ImportError), 2),
    ((KeyboardInterrupt,), 130),
)


INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h)


def _exit_code(exc: BaseException) -> int | None:
    for kinds, code in EXIT_CODES:
        if isinstance(exc, kinds):
            return code
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (errors: one line on stderr, see EXIT_CODES)."""
    args = build_parser().parse_args(argv)
    # (The demo tells what it built or reused itself: the library's log would say it twice.)
    with _log_to_stderr(logging.WARNING if args.command == "demo" else logging.INFO):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit status."""
    try:
        return int(args.run(args))
    except BrokenPipeError:
        # The reader of our output left (`yogadl-plus head ... | head -1`): nothing more to say.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Exception, KeyboardInterrupt) as exc:
        code = _exit_code(exc)
        if code is None:
            traceback.print_exc()
            return INTERNAL_ERROR
        message = _message(exc)
        if isinstance(exc, ydl.DatasetNotFound) and "--storage" not in message:
            message += where_it_looked(args)
        print(f"yogadl-plus {args.command}: error: {message}", file=sys.stderr)
        return code


@contextlib.contextmanager
def _log_to_stderr(level: int) -> Iterator[None]:
    """While a command runs: the library's log (what was built, pulled, evicted; retries) on
    stderr, ``level`` and up, unless the program running us set up the ``yogadl_plus`` logger
    itself. Taken away after (main() may run in a process that goes on: a test, a notebook)."""
    logger = logging.getLogger("yogadl_plus")
    if logger.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("yogadl-plus: %(message)s"))
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def _message(exc: BaseException) -> str:
    """The error on one line (Ctrl-C has no text of its own)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return " ".join(str(exc).split()) or type(exc).__name__
