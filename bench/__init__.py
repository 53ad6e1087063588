"""yogadl_plus's benchmarks: run each from the repository root as ``python -m bench.<name>``
(bench/README.md lists them); ``python -m bench.smoke`` checks that every one still runs."""
