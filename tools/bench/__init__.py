"""Shared pieces of the benchmarks (``tools/bench_*.py``): :mod:`.harness` (options,
interleaved repetitions, paired ratios, JSON with the machine and commit, plots) and
:mod:`.emulated` (running a benchmark's ranks on an emulated cluster)."""
