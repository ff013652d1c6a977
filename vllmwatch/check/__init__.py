"""The preflight checklist (`vllmwatch check`): base types (base.py), the runner, then one
module per group of checks (vllm, model, max-model-len, host: port and caches, GPUs).

Checks import base.py, never the runner; the runner imports every check at the top.
May import: config, core (pure verdicts: unified memory), shell (child, port and group-file
helpers), prewarm (cache locations), logfn.
"""
