"""`vllmwatch init`: a config from a hand-run vLLM -- a pasted `vllm serve` line or a running
process -- with every changed flag explained. translate.py and render.py are pure (a line in,
TOML text out); proc.py reads /proc; runner.py writes the file and runs `check` on it.

May import: config, check (to run the checklist on the result), shell (the instance marker),
logfn.
"""
