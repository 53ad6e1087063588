"""The other side of the comparisons: scripts run in the side venvs (``bash
bench/baselines/venvs.sh .baselines`` makes them), as ``.baselines/<venv>/bin/python -m
bench.baselines.<name>`` from the repository root (``harness.run_baseline`` does that), each
printing its result as one JSON line. They import only the standard library, the library they
measure and bench.harness, never yogadl_plus."""
