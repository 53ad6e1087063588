"""The benchmarks' one harness: timing and best-of, smoke mode, fresh processes against any
checkout (before/after trees, side venvs), and results as JSON.

Every bench script runs from the repository root as ``python -m bench.<name>``. This module
imports only the standard library at the top (yogadl_plus, numpy and lmdb lazily, in
``machine``), because the side-venv baselines in ``bench/baselines/`` import it too.

Smoke mode (``YDL_BENCH_SMOKE=1``, set by ``python -m bench.smoke``): every script takes its
smallest sizes and one round (``smoke(full, small)`` picks them), and ``best_of`` runs a figure
exactly ``repeats`` times. It checks that a benchmark still runs, not what it measures.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# realpath: a child process may import bench/ through the link _bench_only_dir makes.
BENCH = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(BENCH)
BASELINE_VENVS = os.path.join(ROOT, ".baselines")
VENVS_HINT = "make it with: bash bench/baselines/venvs.sh .baselines  (from the repository root)"

SMOKE_ENV = "YDL_BENCH_SMOKE"
SMOKE = os.environ.get(SMOKE_ENV, "") not in ("", "0")
# A script that cannot run here (no side venv, no server binary) exits with this code after one
# line saying why; bench.smoke reports it as skipped, not failed (77: automake's "skipped").
SKIP_EXIT = 77

# best_of: for short figures, keep repeating until this much was timed (at most MAX_REPEATS), so
# that a 10 ms figure is not one scheduler hiccup away from wrong. Long figures: ``repeats``.
MIN_TOTAL_S = 0.3
MAX_REPEATS = 20


def smoke(full: T, small: T) -> T:
    """``small`` in smoke mode, else ``full``: a size, a round count or a duration default."""
    return small if SMOKE else full


def skip(reason: str) -> NoReturn:
    """Ends a script that cannot run here, with one line saying why (and SKIP_EXIT)."""
    print(f"skipped: {reason}", flush=True)
    raise SystemExit(SKIP_EXIT)


def or_skip(make: Callable[[], T]) -> T:
    """``make()``; if what it needs is not installed (an ImportError, or an error that says
    "not installed", as the tests' server runners raise), ends the script with ``skip``."""
    try:
        return make()
    except ImportError as e:
        skip(f"not installed here: {e}")
    except RuntimeError as e:
        if "not installed" not in str(e):
            raise
        skip(str(e))


def local_servers() -> ModuleType:
    """The tests' local servers, for the scripts that read from a bucket: the module
    ``tests/helpers/servers.py`` (``seaweedfs(folder)``, a SeaweedFS on 127.0.0.1 for a block;
    the ``SeaweedFS`` class, to stop and start). Raises ImportError where the test dependencies
    it needs (pytest, boto3) are not installed: ``or_skip(local_servers)`` skips instead."""
    # tests/ has no __init__.py: from the repository root it imports as a namespace package.
    return importlib.import_module("tests.helpers.servers")


def start_seaweedfs(stack: contextlib.ExitStack, folder: str | os.PathLike[str]) -> Any:
    """A SeaweedFS on 127.0.0.1 keeping its data under ``folder``, stopped when ``stack``
    closes (the tests' runner, ``local_servers().seaweedfs``); ``skip`` where the runner or
    the server binary is not installed."""
    servers = or_skip(local_servers)
    return or_skip(lambda: stack.enter_context(servers.seaweedfs(folder)))


# --------------------------------------------------------------------------- timing


def time_once(run: Callable[[], T]) -> tuple[float, T]:
    """Seconds one call of ``run`` took (after a gc.collect, outside the timing), and its result."""
    gc.collect()
    started = time.perf_counter()
    result = run()
    return time.perf_counter() - started, result


def timed(run: Callable[[], Any], repeats: int) -> list[float]:
    """The seconds of each of ``repeats`` calls of ``run``."""
    return [time_once(run)[0] for _ in range(repeats)]


def best_of(
    fn: Callable[[], Any], repeats: int, min_total_s: float = MIN_TOTAL_S
) -> tuple[float, list[float]]:
    """Runs ``fn`` at least ``repeats`` times (more while under ``min_total_s`` in all, up to
    MAX_REPEATS; exactly ``repeats`` in smoke mode); returns (best seconds, all seconds)."""
    floor = 0.0 if SMOKE else min_total_s
    times: list[float] = []
    while len(times) < repeats or (sum(times) < floor and len(times) < MAX_REPEATS):
        times.append(time_once(fn)[0])
    return min(times), times


def count_for(
    items: Iterable[Any], seconds: float | None, records: Callable[[Any], int] | None = None
) -> tuple[int, float]:
    """Iterates ``items`` to the end, or until ``seconds`` have passed (looked at every 64
    items); (records handed out, seconds taken). ``records(item)``: the records in an item
    (default 1; a batch's length, or a check of the item that returns 1)."""
    count = 0
    started = time.perf_counter()
    for k, item in enumerate(items, 1):
        count += records(item) if records is not None else 1
        if seconds is not None and k % 64 == 0 and time.perf_counter() - started > seconds:
            break
    return count, time.perf_counter() - started


# --------------------------------------------------------------------------- data and tables


def warm(path: str) -> None:
    """Reads a file (or every file under a folder) once so that it sits in the page cache."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass


def target_cell(target: str, met: bool | None) -> str:
    """A table's target column: the target, and whether this run met it."""
    if not target:
        return ""
    return f"{target} — " + ("n/a" if met is None else "met" if met else "**MISSED**")


# --------------------------------------------------------------------------- results as JSON


def machine() -> dict[str, Any]:
    """What a figure was measured on: CPUs, load, Python, numpy, lmdb, yogadl_plus, commit."""
    import lmdb
    import numpy as np

    import yogadl_plus as ydl

    model = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "load_average_at_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "lmdb": lmdb.__version__,
        "numpy": np.__version__,
        "yogadl_plus": ydl.__version__,
        "yogadl_plus_file": ydl.__file__,
        "git_commit": commit,
        "platform": platform.platform(),
        "smoke": SMOKE,
    }


def write_json(path: str | None, results: Mapping[str, Any], info: Mapping | None = None) -> None:
    """Writes ``results`` to ``path`` (nothing when None), with the machine (``info``, or
    ``machine()`` now), the command line and the load average at the end."""
    if path is None:
        return
    out = {
        "machine": dict(info) if info is not None else machine(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "load_average_at_end": os.getloadavg(),
        **results,
    }
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)  # str: paths and numpy scalars
    print(f"\nJSON written to {path}", flush=True)


def last_json_line(stdout: str) -> Any:
    """The JSON object a child process printed last (its result; what came before is its log)."""
    return json.loads(stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- fresh processes


_BENCH_ONLY: list[str] = []


def _bench_only_dir() -> str:
    """A folder holding only a link to bench/: on a path before another checkout, it gives this
    checkout's bench package and that checkout's yogadl_plus (or none, in a side venv)."""
    if not _BENCH_ONLY:
        folder = tempfile.mkdtemp(prefix="ydl-bench-path-")
        os.symlink(BENCH, os.path.join(folder, "bench"))
        atexit.register(shutil.rmtree, folder, True)  # the link only, never bench/ itself
        _BENCH_ONLY.append(folder)
    return _BENCH_ONLY[0]


def bench_env(tree: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a fresh process that imports this checkout's bench package and
    yogadl_plus from ``tree`` (default: this checkout), plus ``extra``."""
    env = dict(os.environ, **extra)
    if tree is None or os.path.realpath(tree) == os.path.realpath(ROOT):
        env["PYTHONPATH"] = ROOT
    else:
        env["PYTHONPATH"] = os.pathsep.join([_bench_only_dir(), os.path.abspath(tree)])
    return env


def bench_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m bench.<module> args...``: ``module`` is a name under bench/
    (``"bench_scale"``, ``"baselines.yogadl_foundation"``)."""
    return [python or sys.executable, "-m", f"bench.{module}", *args]


def run_bench(
    module: str,
    *args: str,
    tree: str | None = None,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``bench.<module>`` in a fresh process with yogadl_plus from ``tree``, its output
    captured (unless not ``capture``). Its working folder holds no checkout, so that only
    ``tree`` can be imported."""
    return subprocess.run(
        bench_command(module, *args, python=python),
        env=bench_env(tree, **(env or {})),
        cwd=_bench_only_dir(),
        capture_output=capture,
        text=True,
        timeout=timeout,
        check=False,
    )


def side_python(venv: str) -> str:
    """The python of the side venv ``venv`` ("yogadl", "petastorm", "peers") in .baselines/."""
    return os.path.join(BASELINE_VENVS, venv, "bin", "python")


def rerun_in_tree(module: str, tree: str, args: list[str]) -> NoReturn:
    """Runs ``bench.<module> args`` again with ``tree``'s yogadl_plus, its output passed
    through, and exits with its status (``--tree CHECKOUT`` of a script that measures one
    checkout). Paths in ``args`` must be absolute: it runs in a folder of its own."""
    raise SystemExit(run_bench(module, *args, tree=tree, capture=False).returncode)


def run_baseline(
    venv: str, module: str, args: list[str], python: str | None = None, timeout: float = 900
) -> dict[str, Any] | str:
    """Runs ``bench.baselines.<module>`` in the side venv ``venv`` (``.baselines/<venv>``, or
    ``python``); returns its JSON (last stdout line), or why there is none."""
    python = python or side_python(venv)
    if not os.path.exists(python):
        return f"side venv missing ({python}); {VENVS_HINT}"
    quiet = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = run_bench(f"baselines.{module}", *args, python=python, env=quiet, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{module} timed out after {timeout:.0f} s"
    if done.returncode != 0:
        return f"{module} failed (rc {done.returncode}): {done.stderr.strip()[-800:]}"
    result: dict[str, Any] = last_json_line(done.stdout)
    return result


def run_baseline_on_arrays(
    venv: str,
    module: str,
    arrays: Mapping[str, Any],
    tmp: str,
    args: list[str],
    python: str | None = None,
) -> dict[str, Any] | str:
    """``run_baseline`` on numpy arrays: each is saved as a .npy file under ``tmp`` and passed
    as ``--<name> FILE``; ``{workdir}`` in ``args`` becomes a fresh folder for the baseline's
    files. Everything it wrote is removed afterwards."""
    import numpy as np

    work = tempfile.mkdtemp(prefix=f"{module}-", dir=tmp)
    files: list[str] = []
    for name, array in arrays.items():
        path = os.path.join(work, f"{name}.npy")
        np.save(path, array)
        files += [f"--{name}", path]
    args = [a.replace("{workdir}", os.path.join(work, "wd")) for a in args]
    try:
        return run_baseline(venv, module, [*files, *args], python=python)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def arrays_parser(description: str | None, *names: str) -> argparse.ArgumentParser:
    """The baseline side of ``run_baseline_on_arrays``: a parser of ``--<name> FILE.npy`` for
    each of ``names``, ``--workdir DIR`` and ``--repeats R`` (default 3)."""
    parser = argparse.ArgumentParser(description=description)
    for name in names:
        parser.add_argument(f"--{name}", required=True, help=f"{name} as a .npy file")
    parser.add_argument("--workdir", required=True, help="a folder for the baseline's files")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many (default 3)")
    return parser


def checkout_of(module_file: str) -> str:
    """The checkout a ``yogadl_plus/__init__.py`` belongs to."""
    return os.path.dirname(os.path.dirname(os.path.abspath(module_file)))


def start_call(
    tree: str | None,
    module: str,
    function: str,
    *args: Any,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Starts ``bench.<module>.<function>(*args)`` in a fresh process that imports yogadl_plus
    from ``tree`` (default this checkout), with ``env`` added to its environment; ``args``
    travel as JSON. ``finish_call`` gives its result."""
    return subprocess.Popen(
        bench_command("harness", "call", module, function, json.dumps(args)),
        env=bench_env(tree, **(env or {})),
        cwd=_bench_only_dir(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_call(call: subprocess.Popen[str], tree: str | None = None) -> Any:
    """The JSON-able result of a ``start_call``, once it is done; stops the script if the call
    failed or imported yogadl_plus from another checkout than ``tree``."""
    stdout, stderr = call.communicate()
    if call.returncode != 0:
        what = ".".join(call.args[4:6])
        raise SystemExit(f"{tree or ROOT}: {what} failed:\n{stderr[-3000:]}")
    reply = last_json_line(stdout)
    imported = reply["yogadl_plus_file"]
    if imported is not None and not os.path.samefile(checkout_of(imported), tree or ROOT):
        raise SystemExit(f"{tree} was to be measured, but {imported} was imported: stopping")
    return reply["result"]


def call_in_tree(
    tree: str | None,
    module: str,
    function: str,
    *args: Any,
    env: Mapping[str, str] | None = None,
) -> Any:
    """``bench.<module>.<function>(*args)`` in a fresh process with ``tree``'s yogadl_plus
    (``start_call``), and its result (``finish_call``)."""
    return finish_call(start_call(tree, module, function, *args, env=env), tree)


def smoke_tree() -> str:
    """A copy of this checkout's yogadl_plus in a temporary folder (removed at exit): in smoke
    mode, the "before" tree of a before/after bench, so that its other-tree path runs too."""
    folder = tempfile.mkdtemp(prefix="ydl-bench-tree-")
    atexit.register(shutil.rmtree, folder, True)
    shutil.copytree(
        os.path.join(ROOT, "yogadl_plus"),
        os.path.join(folder, "yogadl_plus"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return folder


def alternate(
    sides: Mapping[str, T], rounds: int, run: Callable[[str, T], R]
) -> dict[str, list[R]]:
    """``run(side, value)`` for every side in turn, ``rounds`` times (A B A B ...: load that
    changes over the run falls on both sides alike); every side's results in round order."""
    results: dict[str, list[R]] = {side: [] for side in sides}
    for round_ in range(rounds):
        for side, value in sides.items():
            print(f"round {round_ + 1}/{rounds}: {side} ({value})", file=sys.stderr, flush=True)
            results[side].append(run(side, value))
    return results


def _call_main(argv: list[str]) -> int:
    """The child side of ``call_in_tree``: runs the function, prints its result as JSON."""
    module, function, args = argv
    result = getattr(importlib.import_module(f"bench.{module}"), function)(*json.loads(args))
    imported = sys.modules.get("yogadl_plus")
    print(json.dumps({"result": result, "yogadl_plus_file": getattr(imported, "__file__", None)}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["call"]:
        raise SystemExit("usage: python -m bench.harness call MODULE FUNCTION JSON_ARGS")
    raise SystemExit(_call_main(sys.argv[2:]))
