"""``yogadl-plus demo``: cache the bundled example dataset and tour it."""

from __future__ import annotations

import argparse

from yogadl_plus.cli.common import storage_of

__all__ = ["cmd_demo"]


def cmd_demo(args: argparse.Namespace) -> int:
    """Cache the bundled example dataset (or reuse it) and tour it."""
    from yogadl_plus.demo import run_demo

    return run_demo(storage_of(args))
