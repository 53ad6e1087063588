"""Runs every bench script in smoke mode (its smallest sizes, one round) and reports which pass:
a check that the benchmarks still run, not a measurement.

    python -m bench.smoke                        # every script, one after the other
    python -m bench.smoke --only bench_scale,compare_trees --timeout 300 --json /tmp/smoke.json

Each script runs as ``python -m bench.<name>`` in a fresh process with ``YDL_BENCH_SMOKE=1`` and
no arguments. A script exits 0 (passed), or with harness.SKIP_EXIT after one "skipped: ..."
line (what it needs is not here: a side venv, a server), or anything else (failed: the last
line it wrote is shown). The side-venv baselines in bench/baselines/ run inside the scripts
that use them, when their venv exists.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.harness import BENCH, SKIP_EXIT, SMOKE_ENV, run_bench, write_json

# Modules of bench/ that are not benchmarks.
HELPERS = {"__init__", "harness", "smoke", "delay_proxy"}


def scripts() -> list[str]:
    """Every bench script's module name under bench/, in name order."""
    names = (name[:-3] for name in os.listdir(BENCH) if name.endswith(".py"))
    return sorted(name for name in names if name not in HELPERS)


def run_one(name: str, timeout: float) -> tuple[str, float, str]:
    """(passed | skipped | FAILED, seconds, a line about it) for one script in smoke mode."""
    started = time.perf_counter()
    try:
        done = run_bench(name, env={SMOKE_ENV: "1"}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "FAILED", time.perf_counter() - started, f"still running after {timeout:.0f} s"
    seconds = time.perf_counter() - started
    out = done.stdout.strip().splitlines()
    if done.returncode == 0:
        return "passed", seconds, ""
    if done.returncode == SKIP_EXIT:
        said = [line for line in out if line.startswith("skipped: ")]
        return "skipped", seconds, (said or ["skipped: (no reason given)"])[-1][len("skipped: ") :]
    last = (done.stderr.strip().splitlines() or out or ["(no output)"])[-1]
    return "FAILED", seconds, f"exit {done.returncode}: {last[:300]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated script names (default: every one)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a script may take")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    names = scripts()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"--only: no such scripts {unknown}; there are {names}")
        names = wanted
    results: dict[str, dict[str, object]] = {}
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        status, seconds, note = run_one(name, args.timeout)
        results[name] = {"result": status, "seconds": round(seconds, 1), "note": note}
        print(f"  {status} in {seconds:.0f} s {note}", file=sys.stderr, flush=True)
    print("\n| script | result | seconds | note |\n| --- | --- | ---: | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['result']} | {r['seconds']:.0f} | {r['note']} |")
    counts = {s: sum(r["result"] == s for r in results.values()) for s in ("passed", "skipped")}
    failed = len(results) - counts["passed"] - counts["skipped"]
    print(f"\n{counts['passed']} passed, {counts['skipped']} skipped, {failed} failed")
    write_json(args.json, {"results": results})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
