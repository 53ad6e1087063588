"""bench_stream_paths.py against two checkouts of yogadl_plus, alternately (A B A B ...), for a
change that should leave the sequential layer's speed as it was:

    git worktree add /tmp/ydl-before HEAD              # once, before the change: tree A
    python -m bench.compare_trees [--a /tmp/ydl-before] [--b .] [--rounds 3] [--quick]

Every run is a fresh process of the same script (this checkout's bench.bench_stream_paths) with
that tree's yogadl_plus (``bench.harness.run_bench``: the tree on ``PYTHONPATH``, before the
editable install of the nox venv, a meta-path finder consulted after sys.path): each run prints
the ``yogadl_plus.__file__`` it imported, and a run that imported anything else stops the
comparison. The runs share one data folder (``--data``), built first, untimed, by tree A (the
on-disk format is not compared). In smoke mode tree A defaults to a copy of this checkout.

Printed per row: the best records/s of each tree over all rounds, B/A, the spread of each tree
across rounds ((max - min) / max of the per-round figures: how far a tree disagrees with itself,
the noise a B/A must be read against), the range of the per-round B/A, whether B/A is within
that spread (``noise``: |B/A - 1| <= the larger spread; else ``B slower`` / ``B faster``; ``-``
with one round), and whether both trees handed out the same first items (the script's
fingerprint). The spread across a few rounds understates the noise between processes: run A
against A (``--b`` = the same tree) to see how far apart two runs of the same code land.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from bench.harness import ROOT, SMOKE, alternate, run_bench, smoke, smoke_tree, write_json

NOX_PYTHON = os.path.join(ROOT, ".nox", "tests", "bin", "python")


def run_tree(
    python: str, tree: str, data: str, passthrough: list[str], workdir: str, build_only: bool
) -> dict[str, Any]:
    """One run of the script with ``tree``'s yogadl_plus; its JSON (or exits on a failure)."""
    out = os.path.join(workdir, "run.json")
    if os.path.exists(out):
        os.remove(out)
    args = ["--data", data, "--json", out, *passthrough]
    if build_only:
        args.append("--build-only")
    done = run_bench(
        "bench_stream_paths",
        *args,
        tree=tree,
        python=python,
        env={"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")},
    )
    imported = next(
        (
            line.split(": ", 1)[1]
            for line in done.stdout.splitlines()
            if line.startswith("yogadl_plus: ")
        ),
        "?",
    )
    print(f"  yogadl_plus imported from {imported}", file=sys.stderr, flush=True)
    expected = os.path.join(tree, "yogadl_plus", "__init__.py")
    if os.path.realpath(imported) != os.path.realpath(expected):
        why = f"\n{done.stderr[-3000:]}" if done.returncode != 0 else ""
        raise SystemExit(f"PYTHONPATH={tree} imported {imported}, not {expected}: stopping{why}")
    if done.returncode != 0:
        raise SystemExit(
            f"{tree}: the benchmark failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    if build_only:
        return {}
    with open(out) as f:
        result = json.load(f)
    if os.path.realpath(result["yogadl_plus_file"]) != os.path.realpath(expected):
        raise SystemExit(f"{tree}: the JSON says {result['yogadl_plus_file']}: stopping")
    return result


def spread_of(values: list[float]) -> float:
    """(max - min) / max: how far one tree's per-round figures disagree."""
    return (max(values) - min(values)) / max(values)


def spread(values: list[float]) -> str:
    return f"{spread_of(values) * 100:.1f}%" if len(values) > 1 else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--a", default=None, help="tree A, the code before the change (default /tmp/ydl-before)"
    )
    parser.add_argument("--b", default=ROOT, help="tree B, the changed code (default: this one)")
    parser.add_argument("--rounds", type=int, default=smoke(3, 1), help="A B rounds (3)")
    parser.add_argument(
        "--python", default=None, help=f"interpreter (default {NOX_PYTHON}, or this one)"
    )
    parser.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "ydl-stream-paths"),
        help="the datasets' folder, built if missing, kept (default %(default)s)",
    )
    parser.add_argument("--json", help="also write every run's results here")
    # Passed on to bench_stream_paths.py as they are.
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--small", type=int)
    parser.add_argument("--big", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--only")
    parser.add_argument("--no-tf", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds >= 1")
    if args.a is None:
        args.a = smoke_tree() if SMOKE else "/tmp/ydl-before"
    if args.python is None:
        args.python = NOX_PYTHON if os.path.exists(NOX_PYTHON) else sys.executable
    trees = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    for tree in trees.values():
        if not os.path.isfile(os.path.join(tree, "yogadl_plus", "__init__.py")):
            parser.error(f"{tree} holds no yogadl_plus/__init__.py")
    passthrough: list[str] = []
    for flag in ("quick", "no_tf", "no_torch"):
        if getattr(args, flag):
            passthrough.append("--" + flag.replace("_", "-"))
    for flag in ("small", "big", "repeats", "only"):
        if getattr(args, flag) is not None:
            passthrough += ["--" + flag, str(getattr(args, flag))]

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ydl-compare-") as workdir:
        print(f"data: {args.data} (built or opened by A, untimed)", file=sys.stderr, flush=True)
        run_tree(args.python, trees["A"], args.data, passthrough, workdir, build_only=True)
        runs = alternate(
            trees,
            args.rounds,
            lambda _, tree: run_tree(args.python, tree, args.data, passthrough, workdir, False),
        )
    elapsed = time.perf_counter() - started

    rows = list(runs["A"][0]["rows"])
    rows += [r for r in runs["B"][0]["rows"] if r not in rows]
    print(
        f"\nA = {trees['A']}\nB = {trees['B']}\n{args.rounds} round(s), A B alternately, "
        f"{elapsed:.0f} s; {os.cpu_count()} CPUs, load average at the end "
        f"{os.getloadavg()[0]:.2f}; sizes {runs['A'][0]['sizes']}\n"
    )
    print(
        f"| {'row':<34} | {'A records/s':>12} | {'B records/s':>12} | {'B/A':>6} | "
        f"{'A spread':>8} | {'B spread':>8} | {'B/A per round':>13} | {'vs spread':<9} | "
        "same items |"
    )
    print(
        f"| {'-' * 34} | {'-' * 11}: | {'-' * 11}: | {'-' * 5}: | {'-' * 7}: | {'-' * 7}: | "
        f"{'-' * 12}: | {'-' * 9} | --- |"
    )
    table = {}
    for row in rows:
        per = {
            side: [r["rows"][row]["records_per_s"] for r in runs[side] if row in r["rows"]]
            for side in runs
        }
        if not per["A"] or not per["B"]:
            missing = "A" if not per["A"] else "B"
            print(f"| {row:<34} | (not run by {missing}) |")
            continue
        a, b = max(per["A"]), max(per["B"])
        ratios = [rb / ra for ra, rb in zip(per["A"], per["B"])]
        span = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"
        prints = {
            r["rows"][row].get("fingerprint")
            for side in runs
            for r in runs[side]
            if row in r["rows"]
        }
        noise = max(spread_of(per["A"]), spread_of(per["B"]))
        if args.rounds < 2:
            verdict = "-"
        elif abs(b / a - 1) <= noise:
            verdict = "noise"
        else:
            verdict = "B slower" if b < a else "B faster"
        same = "-" if prints == {None} else "yes" if len(prints) == 1 else "**NO**"
        print(
            f"| {row:<34} | {a:>12,.0f} | {b:>12,.0f} | {b / a:>5.3f} | "
            f"{spread(per['A']):>8} | {spread(per['B']):>8} | {span:>13} | {verdict:<9} | "
            f"{same:<10} |"
        )
        table[row] = {
            "A": per["A"],
            "B": per["B"],
            "b_over_a": b / a,
            "verdict": verdict,
            "same_items": same,
        }
    for side in runs:
        for group, why in runs[side][0].get("skipped", {}).items():
            print(f"{side}: {group} rows {why}")
    write_json(args.json, {"trees": trees, "table": table, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
