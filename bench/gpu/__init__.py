"""The GPU benchmarks: a real vLLM under vllmwatch on the lent H200 machines (README.md).

Nothing here runs at import. `drive.py` is the entry point vllm_h200.sh calls; it builds one
`Run` (run.py: deadline, owned process groups, NVML, where results go) and passes it to
every phase (phases/, registered in phases/__init__.py). May import: vllmwatch (the package,
vllmwatch.testing included) and the standard library; psutil and pynvml where the machine
has them. Not tests/ and not the rest of bench/: the GPU machine gets an export of
vllmwatch/ and bench/gpu/ only.
"""
