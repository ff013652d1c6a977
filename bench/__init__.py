"""Benchmarks (not tests): each script measures and writes its raw results under
bench/results/ (bench/gpu/'s GPU runs under docs/gpu/); docs/BENCHMARKS.md says which command
made which file. Run them from the checkout root as modules, e.g.
`.venv/bin/python -m bench.startup`. Nothing here runs at import: a script's work starts in
its main guard.
"""
