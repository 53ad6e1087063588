"""The ``yogadl-plus`` command: build, inspect, verify, copy, benchmark and remove cached versions.

Every command that prints takes ``--json`` (one JSON document; ``head``: one object per line);
long work shows a progress bar on stderr when it is a terminal. Exit codes are in EXIT_CODES.

A module per command or group of commands: ``build``, ``looking`` (ls, info, head, verify),
``changing`` (push, pull, rm), ``lineage``, ``bench``, ``demo``; what they share is in
``common`` (and how ``head`` shows values in ``values``); ``parser`` puts the command line
together and ``entry`` runs it (``main``).
"""

from __future__ import annotations

from yogadl_plus.cli.bench import cmd_bench
from yogadl_plus.cli.build import cmd_build
from yogadl_plus.cli.changing import cmd_pull, cmd_push, cmd_rm
from yogadl_plus.cli.demo import cmd_demo
from yogadl_plus.cli.entry import EXIT_CODES, INTERNAL_ERROR, main
from yogadl_plus.cli.lineage import cmd_lineage
from yogadl_plus.cli.looking import cmd_head, cmd_info, cmd_ls, cmd_verify
from yogadl_plus.cli.parser import build_parser

__all__ = [
    "EXIT_CODES",
    "INTERNAL_ERROR",
    "build_parser",
    "cmd_bench",
    "cmd_build",
    "cmd_demo",
    "cmd_head",
    "cmd_info",
    "cmd_lineage",
    "cmd_ls",
    "cmd_pull",
    "cmd_push",
    "cmd_rm",
    "cmd_verify",
    "main",
]
